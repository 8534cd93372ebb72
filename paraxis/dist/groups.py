"""Process start-up and process groups, all derived from the Layout.

Nothing else in paraxis computes a rank by hand: every group (one per name in `GROUP_AXES`)
and the pipeline neighbours of this rank come from `build_groups(layout)`, which asks the
layout for the groups of each name. Device from the local rank, backend from the device:
NCCL on CUDA, gloo on CPU; CUDA ranks sharing GPUs (`--share-gpu`) take
`shared_gpu.BACKEND`, gloo through the host.

Every group carries the run's collective timeout: `new_group` does not inherit the default
group's (it falls back to the backend's 30 minutes), so it is passed explicitly.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import NoReturn

import torch
import torch.distributed as dist

from paraxis.dist import shared_gpu
from paraxis.dist.watchdog import WATCH, name_group
from paraxis.spec.errors import ParaxisError, RunFailed
from paraxis.spec.layout import Coords, Layout


def collective_timeout() -> timedelta:
    """The timeout every process group of this run is created with (the watchdog's)."""
    return timedelta(seconds=WATCH.timeout_s)


def pick_device(requested: str = "auto", share_gpu: bool = False) -> torch.device:
    """"auto" -> this rank's GPU (by LOCAL_RANK) when CUDA is present, else the CPU. With
    `share_gpu` the node's ranks take its GPUs in turn (LOCAL_RANK modulo their count), and
    a named GPU serves them all."""
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    if requested.startswith("cuda"):
        if requested != "cuda" and int(os.environ.get("LOCAL_WORLD_SIZE", 1)) > 1 \
                and not share_gpu:
            # every rank of the node would share that one GPU (NCCL: "Duplicate GPU")
            raise ParaxisError(f"--device {requested} names one GPU for every rank of this "
                               "node; use --device cuda (each rank takes its LOCAL_RANK's), "
                               "or add --share-gpu")
        if not torch.cuda.is_available():
            raise ParaxisError("--device cuda was asked for but no CUDA GPU is visible; "
                               "use --device cpu")
        if requested == "cuda":
            local = int(os.environ.get("LOCAL_RANK", 0))
            requested = f"cuda:{local % torch.cuda.device_count() if share_gpu else local}"
        device = torch.device(requested)
        torch.cuda.set_device(device)
        return device
    if requested != "cpu":
        raise ParaxisError(f"unknown device {requested!r}; use auto, cpu or cuda")
    return torch.device("cpu")


def ranks_per_device(device: torch.device, share_gpu: bool) -> int:
    """How many of this node's ranks share `device`: 1, or with `share_gpu` on CUDA the
    node's ranks over its GPUs, rounded up (each gets that share of its memory and FLOPs)."""
    if not share_gpu or device.type != "cuda":
        return 1
    local = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    return -(-local // torch.cuda.device_count())


def restart_attempt() -> int:
    """Which attempt of an elastic job this is: 0 first, n after n restarts (torchrun's
    TORCHELASTIC_RESTART_COUNT; 0 outside torchrun)."""
    text = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    try:
        attempt = int(text)
    except ValueError:
        attempt = -1
    if attempt < 0:
        raise ParaxisError(f"TORCHELASTIC_RESTART_COUNT={text!r} is not a restart count (a "
                           "whole number >= 0); unset it (torchrun sets it) and run again")
    return attempt


def backend_for(device: torch.device, share_gpu: bool = False) -> str:
    if share_gpu:
        shared_gpu.register()
        return shared_gpu.BACKEND
    return "nccl" if device.type == "cuda" else "gloo"


def batch_isend_irecv(ops: list[dist.P2POp]) -> list[dist.Work]:
    """`dist.batch_isend_irecv`, where the backend batches the calls (NCCL orders a pair's
    messages by it); on host backends each posted alone, as torch itself does for gloo (and
    its batching of CUDA calls, which CUDA ranks sharing a GPU make, is NCCL's)."""
    if ops and through_host(ops[0].group):
        return [op.op(op.tensor, op.peer, op.group, op.tag) for op in ops]
    return dist.batch_isend_irecv(ops)


def through_host(group: dist.ProcessGroup | None = None) -> bool:
    """Whether `group`'s calls run on gloo's host-side algorithms (gloo itself, or CUDA
    ranks sharing GPUs through it), not NCCL's."""
    return dist.get_backend(group) in ("gloo", shared_gpu.BACKEND)


def init_distributed(device: torch.device, timeout_s: float,
                     share_gpu: bool = False) -> tuple[int, int]:
    """Join the job torchrun (or the test harness) described in the environment.

    Returns (rank, world_size); a single process without torchrun's variables is world 1
    and needs no process group. `timeout_s` bounds every collective and point-to-point wait
    (gloo raises once it has passed; `dist/watchdog.py` says which wait it was).
    `share_gpu`: CUDA ranks sharing GPUs, on `shared_gpu.BACKEND`.
    """
    WATCH.timeout_s = timeout_s
    WATCH.step = None  # a new run has no step yet (one process may run several, as tests do)
    if dist.is_initialized():
        WATCH.rank = dist.get_rank()
        return dist.get_rank(), dist.get_world_size()
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return 0, 1
    options = {"timeout": collective_timeout(),
               "device_id": device if device.type == "cuda" and not share_gpu else None}
    try:
        _join(backend_for(device, share_gpu), world_size, options)
    except RuntimeError as error:  # torch's DistNetworkError, gloo's "connectFullMesh failed"
        raise RunFailed(f"rank {os.environ.get('RANK', '?')} could not join the job's "
                        f"{world_size} ranks within --timeout-s {timeout_s:g} "
                        f"({str(error).splitlines()[0][:120]}); give a larger --timeout-s, "
                        "or check --rdzv-host and the network") from None
    WATCH.rank = dist.get_rank()
    return dist.get_rank(), dist.get_world_size()


def _join(backend: str, world_size: int, options: dict) -> None:
    """init_process_group, under a restarted job's per-attempt store prefix (below)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # Under torch's elastic agent (torchrun --max-restarts) every attempt of a restarted
        # job joins the agent's one store at the same address, and torch adds no per-attempt
        # prefix there (torch/distributed/rendezvous.py), so the sub-groups of a restarted
        # run would read the dead attempt's peer addresses and fail to connect. One prefix
        # per attempt keeps each attempt's keys apart.
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                              world_size, is_master=False, timeout=collective_timeout())
        dist.init_process_group(backend, store=dist.PrefixStore(
            f"paraxis/attempt_{restart_attempt()}", store), rank=int(os.environ["RANK"]),
            world_size=world_size, **options)
    else:
        dist.init_process_group(backend, **options)


def shutdown_distributed(clean: bool = True) -> None:
    """Leave the process group. After a failed wait (`clean=False`) the group is broken and
    a barrier would only wait out the timeout again: the process just exits."""
    if dist.is_initialized() and clean:
        # Ranks that reach destroy_process_group() seconds apart can abort on gloo; a
        # barrier first lines them up.
        with WATCH.waiting("barrier (shutdown)"):
            dist.barrier()
        dist.destroy_process_group()


def end_rank_process(code: int) -> NoReturn:
    """End a rank's process that left its groups cleanly without finalizing the interpreter.

    A gloo worker thread frees a finished collective a moment after its wait has returned
    (a barrier also keeps the work queued before it until the barrier is freed); freeing a
    tensor that has a Python object takes the GIL, and a thread that takes it while the
    interpreter finalizes aborts the process ("terminate called without an active
    exception": 2 of 22 two-rank pipeline runs here, after the trace's gather_object and the
    shutdown barrier; pytorch/pytorch#190489 and #179291). A rank has closed its files and
    left its groups by then, so skipping finalization loses nothing. A failed rank exits as
    usual: its peers' reports rely on its sockets closing no sooner than they did."""
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()  # what atexit would have flushed
    os._exit(code)


# Every group build_groups creates, by name (`Layout.groups` reads the name): the axes of the
# grid, experts, "dp_tp" (every rank of one pipeline stage: ZeRO over dp x tp, loss sums) and
# "dp_cp" (the ranks holding the same parameters under context parallelism: `replica_group`)
# and "expert_dp" (the ranks holding the same experts under expert parallelism); under hybrid
# sharding "dp_shard" (where ZeRO shards), "dp_replicate" (the copies of one shard) and
# "expert_shard" (the ranks of a shard group holding the same experts).
# A new axis is one more name here and one `<name>_group` field below.
GROUP_AXES = ("dp", "tp", "pp", "dp_tp", "cp", "ep", "dp_cp", "expert_dp", "cp_a2a",
              "cp_across", "dp_shard", "dp_replicate", "expert_shard")


@dataclass
class ParallelGroups:
    """This rank's place in the layout and the groups it belongs to.

    A group handle is None when its axis has size 1 (nothing to communicate), or when the
    world is a single process.
    """

    layout: Layout
    rank: int
    coords: Coords
    dp_group: dist.ProcessGroup | None
    tp_group: dist.ProcessGroup | None
    pp_group: dist.ProcessGroup | None
    dp_tp_group: dist.ProcessGroup | None
    pp_ranks: list[int]  # global ranks of this rank's pipeline, stage 0 first
    cp_group: dist.ProcessGroup | None = None  # context parallelism
    ep_group: dist.ProcessGroup | None = None  # expert parallelism, inside dp x cp
    dp_cp_group: dist.ProcessGroup | None = None  # dp x cp; created only when cp > 1
    # the ranks holding the same experts (dp*cp/ep of them); created only when ep > 1
    expert_dp_group: dist.ProcessGroup | None = None
    # two-level cp (layout.cp_a2a > 1): the all-to-all groups and the groups across them
    cp_a2a_group: dist.ProcessGroup | None = None
    cp_across_group: dist.ProcessGroup | None = None
    # hybrid sharding (layout.hybrid): ZeRO's groups, and the groups across their copies
    dp_shard_group: dist.ProcessGroup | None = None
    dp_replicate_group: dist.ProcessGroup | None = None
    expert_shard_group: dist.ProcessGroup | None = None

    def group(self, axis: str) -> dist.ProcessGroup | None:
        """The handle of one of `GROUP_AXES` by name."""
        return getattr(self, f"{axis}_group")

    @property
    def dp_rank(self) -> int:
        return self.coords.dp_rank

    @property
    def tp_rank(self) -> int:
        return self.coords.tp_rank

    @property
    def pp_rank(self) -> int:
        return self.coords.pp_rank

    @property
    def cp_rank(self) -> int:
        return self.coords.cp_rank

    @property
    def replica_group(self) -> dist.ProcessGroup | None:
        """The ranks that hold the same parameters and see different tokens: the dp group,
        or dp x cp under context parallelism (each cp rank holds other tokens of the same
        sequences). Gradients are averaged over it, ZeRO shards over it, and the loss, a
        mean over equally many tokens on every rank, is averaged over it (Megatron-LM's
        data-parallel group "with context parallel")."""
        return self.dp_cp_group if self.layout.cp > 1 else self.dp_group

    @property
    def replica_rank(self) -> int:
        """This rank's index in `replica_group` (its dp rank when cp = 1)."""
        if self.layout.cp == 1:
            return self.coords.dp_rank
        return self.layout.group_of(self.rank, "dp_cp").index(self.rank)

    @property
    def ep_rank(self) -> int:
        """Index in the expert-parallel group (not a grid coordinate: ep lives in dp x cp)."""
        return self.layout.group_of(self.rank, "ep").index(self.rank)

    @property
    def expert_dp_rank(self) -> int:
        """Index among the ranks holding the same experts (the replica rank when ep = 1)."""
        if self.layout.ep == 1:
            return self.replica_rank
        return self.layout.group_of(self.rank, "expert_dp").index(self.rank)

    @property
    def expert_group(self) -> dist.ProcessGroup | None:
        """Where expert gradients are reduced and their ZeRO states sharded: the ranks
        holding the same experts (the replica group itself when ep = 1)."""
        return self.expert_dp_group if self.layout.ep > 1 else self.replica_group

    @property
    def zero_group(self) -> dist.ProcessGroup | None:
        """Where ZeRO shards the states of the replicated parameters and reduce-scatters
        their gradients: the replica group, or under hybrid sharding its block of
        dp_shard x cp ranks."""
        return self.dp_shard_group if self.layout.hybrid else self.replica_group

    @property
    def expert_zero_group(self) -> dist.ProcessGroup | None:
        """Where ZeRO shards the states of experts: `expert_group`, or under hybrid
        sharding its part inside this rank's shard group."""
        if not self.layout.hybrid:
            return self.expert_group
        return self.expert_shard_group if self.layout.ep > 1 else self.dp_shard_group

    @property
    def replicate_group(self) -> dist.ProcessGroup | None:
        """Under hybrid sharding, the ranks holding copies of this rank's shards (one per
        shard group), over which the shards' gradients are all-reduced; else None."""
        return self.dp_replicate_group if self.layout.hybrid else None

    @property
    def replicate_rank(self) -> int:
        """Which copy of its shards this rank holds (0 without hybrid sharding)."""
        if not self.layout.hybrid:
            return 0
        return self.layout.group_of(self.rank, "dp_replicate").index(self.rank)

    @property
    def is_first_stage(self) -> bool:
        return self.coords.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.coords.pp_rank == self.layout.pp - 1

    @property
    def prev_stage_rank(self) -> int | None:
        return None if self.is_first_stage else self.pp_ranks[self.pp_rank - 1]

    @property
    def next_stage_rank(self) -> int | None:
        return None if self.is_last_stage else self.pp_ranks[self.pp_rank + 1]


def new_groups(partition: list[list[int]], axis: str) -> dist.ProcessGroup | None:
    """Create the groups of `partition` (disjoint lists of ranks) and return the one that
    holds this rank, or None where it is alone or in none. Collective: every rank calls it
    with the same lists in the same order.

    On NCCL with a bound device (`init_distributed` initializes the world's communicator
    eagerly) torch builds every new group by splitting the world's communicator, and each
    `new_group` call is one ncclCommSplit in which every rank of the world takes part, even
    those outside the group: hundreds of world-wide splits for one axis at thousands of
    ranks. `split_group` makes the whole partition in one split, as torch's DeviceMesh
    does on a bound device. Elsewhere (gloo, CUDA ranks sharing GPUs) one `new_group` per
    group, which is collective over the whole world too: every rank creates every group in
    the same order and keeps its own."""
    rank = dist.get_rank()
    shared = [sorted(ranks) for ranks in partition if len(ranks) > 1]
    if not shared:
        return None
    world = dist.group.WORLD
    if (getattr(world, "bound_device_id", None) is not None
            and dist.get_backend() == dist.Backend.NCCL):
        group = dist.split_group(split_ranks=shared, timeout=collective_timeout(),
                                 group_desc=axis)
        name_group(group, axis)
        return group
    mine = None
    for ranks in shared:
        group = dist.new_group(ranks, timeout=collective_timeout())
        name_group(group, axis)
        if rank in ranks:
            mine = group
    return mine


def build_groups(layout: Layout, rank: int | None = None) -> ParallelGroups:
    """Create every group of `GROUP_AXES` (collectively: all ranks must call this) and return
    the ones that contain this rank."""
    world = dist.get_world_size() if dist.is_initialized() else 1
    layout.validate(world_size=world)
    rank = dist.get_rank() if dist.is_initialized() and rank is None else (rank or 0)
    mine: dict[str, dist.ProcessGroup | None] = {}
    for axis in GROUP_AXES:
        mine[f"{axis}_group"] = None
        if axis == "dp_cp" and layout.cp == 1:
            continue  # the dp groups themselves (`replica_group`)
        if axis == "expert_dp" and layout.ep == 1:
            continue  # the replica groups themselves (`expert_group`)
        if axis.startswith("cp_") and layout.cp_a2a == 1:
            continue  # one level: the cp group alone
        if axis in ("dp_shard", "dp_replicate") and not layout.hybrid:
            continue  # ZeRO shards over the replica group itself
        if axis == "expert_shard" and not (layout.hybrid and layout.ep > 1):
            continue
        if world > 1:
            mine[f"{axis}_group"] = new_groups(layout.groups(axis), axis)
    return ParallelGroups(layout=layout, rank=rank, coords=layout.coords(rank),
                          pp_ranks=layout.group_of(rank, "pp"), **mine)
