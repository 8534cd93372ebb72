"""Expert parallelism: each rank of an EP group holds n_experts/ep experts, and tokens travel
to the ranks holding their experts and back by all-to-all (GShard, Lepikhin et al. 2021;
Megatron-Core's and torchtitan's token dispatchers do the same).

`AllToAllExperts` is the MoE block's `run_experts` seam under ep > 1. The block hands it this
rank's (token, expert) rows sorted by expert with the count per expert; then

1. the counts are exchanged (an all-to-all of n_experts/ep integers per pair of ranks), so
   every rank learns how many rows it will receive from each source for each of its experts;
2. the rows go to their experts' ranks (`all_to_all_single` with variable splits; zero-size
   splits are fine, on gloo too): the received rows come source by source, each source's
   sorted by local expert;
3. they are regrouped expert by expert, each local expert runs on its rows, and the outputs
   are put back in arrival order;
4. a second all-to-all returns every output to the rank its token came from, in the order
   it was sent, which is what the block expects.

Both all-to-alls are autograd functions whose backward is the reverse all-to-all, so the
gradients of tokens and experts flow back the same way: four all-to-alls per block per
microbatch (`expert_placement.ALL_TO_ALLS_PER_BLOCK`). Host synchronisations: one per block, the
`.tolist()` of the sent and received counts together (the counts stay on the device until
then), which variable split sizes need (NCCL's all_to_all_single takes them as Python
lists), as in Megatron-Core's all-to-all dispatcher; and under a capacity factor the dropped
count the block records. Everything else is asynchronous on a GPU.

`AllToAllCounter` records every row all-to-all's bytes to other ranks (as
`tensor_parallel.counter` does for TP) and the per-expert counts each rank dispatched, so
tests compare the traffic with `expert_placement.all_to_all_bytes` (which prices the rows; the
counts' exchange, n_experts/ep integers per pair of ranks, is left out of both).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import TracebackType

import torch
import torch.distributed as dist
from torch import nn

from paraxis.dist.all_to_all import AllToAll, Count
from paraxis.dist.watchdog import WATCH
from paraxis.parallel.experts.layer import ExpertList, LocalExperts, moe_layers
from paraxis.spec.expert_placement import experts_of_rank


@dataclass(frozen=True)
class AllToAllEvent:
    nbytes: int  # bytes this rank sent to the other ranks of its EP group
    phase: str  # "forward" or "backward"
    purpose: str  # "dispatch" or "combine" (of the forward pass it belongs to)


@dataclass
class AllToAllCounter:
    """Every token all-to-all in this process while active, and the per-expert counts of
    every dispatch (this rank's rows per global expert, one list per MoE forward)."""

    events: list[AllToAllEvent] = field(default_factory=list)
    dispatched: list[list[int]] = field(default_factory=list)

    def __enter__(self) -> AllToAllCounter:
        _ACTIVE.append(self)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        _ACTIVE.remove(self)

    def nbytes(self, phase: str | None = None, purpose: str | None = None) -> int:
        return sum(e.nbytes for e in self.events
                   if (phase is None or e.phase == phase)
                   and (purpose is None or e.purpose == purpose))


_ACTIVE: list[AllToAllCounter] = []


def _counted(purpose: str, group: dist.ProcessGroup) -> Count:
    """What the active `AllToAllCounter`s record of a row all-to-all of `purpose`: the bytes
    sent to the other ranks of `group`."""
    def count(phase: str, rows: torch.Tensor, send: list[int]) -> None:
        if not _ACTIVE:
            return
        me = dist.get_rank(group)
        per_row = math.prod(rows.shape[1:]) * rows.element_size()
        event = AllToAllEvent(sum(n for j, n in enumerate(send) if j != me) * per_row, phase,
                              purpose)
        for counter in _ACTIVE:
            counter.events.append(event)
    return count


class AllToAllExperts:
    """`run_experts` under expert parallelism: this rank's `experts` (those of
    `experts_of_rank(n_experts, ep, ep_rank)`), the others reached over `group`."""

    def __init__(self, experts: ExpertList, n_experts: int, group: dist.ProcessGroup) -> None:
        self.local = LocalExperts(experts)
        self.n_experts = n_experts
        self.group = group
        self.ep = dist.get_world_size(group)
        self.per_rank = n_experts // self.ep

    def __call__(self, tokens: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        ep, per_rank = self.ep, self.per_rank
        # 1. counts, exchanged on their device: received[i][l] rows from source i for local
        # expert l; then both read at once, the block's one host sync (the split sizes)
        received = torch.empty_like(counts)
        with WATCH.waiting("all_to_all", self.group):
            dist.all_to_all_single(received, counts, group=self.group)
        both = torch.cat([counts, received]).tolist()
        counts_list, received_list = both[:self.n_experts], both[self.n_experts:]
        for counter in _ACTIVE:
            counter.dispatched.append(counts_list)
        by_source = [received_list[i * per_rank:(i + 1) * per_rank] for i in range(ep)]
        send = [sum(counts_list[j * per_rank:(j + 1) * per_rank]) for j in range(ep)]
        receive = [sum(row) for row in by_source]
        # 2. dispatch
        arrived = AllToAll.apply(tokens, send, receive, self.group, None,
                                 _counted("dispatch", self.group))
        # 3. source-major -> expert-major, run the experts, and back
        pieces = arrived.split([n for row in by_source for n in row])
        expert_major = [pieces[i * per_rank + e] for e in range(per_rank) for i in range(ep)]
        per_expert = [sum(by_source[i][e] for i in range(ep)) for e in range(per_rank)]
        outputs = self.local.run(torch.cat(expert_major), per_expert).split(
            [by_source[i][e] for e in range(per_rank) for i in range(ep)])
        source_major = torch.cat([outputs[e * ep + i] for i in range(ep)
                                  for e in range(per_rank)])
        # 4. combine: every output back to its token's rank
        return AllToAll.apply(source_major, receive, send, self.group, None,
                              _counted("combine", self.group))


def shard_experts(model: nn.Module, n_experts: int, ep: int, ep_rank: int,
                  ep_group: dist.ProcessGroup | None,
                  stats_group: dist.ProcessGroup | None) -> None:
    """Point every MoE block of `model` at its statistics group (the ranks sharing a
    microbatch step) and, with ep > 1, keep only this rank's experts (registered under their
    global indices, so names and initial values are one device's), mark their parameters
    `ep_sharded` and run them through `AllToAllExperts`. Reads no values: runs on meta."""
    for layer in moe_layers(model):
        layer.stats_group = stats_group
        if ep == 1:
            continue
        held = experts_of_rank(n_experts, ep, ep_rank)
        layer.experts = ExpertList({index: layer.experts.get_submodule(str(index))
                                    for index in held})
        for param in layer.experts.parameters():
            param.ep_sharded = True
        layer.run_experts = AllToAllExperts(layer.experts, n_experts, ep_group)
