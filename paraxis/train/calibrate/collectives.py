"""What `paraxis calibrate` times on every rank of a group: the collectives the runtime
issues, at several message sizes, over groups of every size at once (fit.py fits them).
Times are the median of a few batches of back-to-back calls, each group's slowest member's,
averaged over the groups. On CPU ranks `sync_wait` also times what a call costs after
compute, beyond those times, and `sync_wait_curve` how that grows with the compute.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from paraxis.dist.collectives import all_gather_single, reduce_scatter_single
from paraxis.plan.comm import COLLECTIVES, leaving
from paraxis.spec.errors import ParaxisError
from paraxis.train.calibrate.kernels import sync


def collective_call(op: str, full: torch.Tensor, group: dist.ProcessGroup | None = None
                    ) -> Callable[[], torch.Tensor]:
    """One call of `op` on the flat buffer `full` over `group`, in the form the runtime
    issues it in on NCCL; the call returns the tensor it wrote, from which a test can tell
    which collective ran. On gloo the runtime carries its reduce-scatters and ZeRO's gathers
    by all-to-alls and all-reduces instead (spec.collectives), which the planner prices at
    those collectives' own fits."""
    if op not in COLLECTIVES:
        raise ParaxisError(f"no collective {op!r} to calibrate; use one of "
                           f"{', '.join(COLLECTIVES)}")
    size = dist.get_world_size(group)
    if op == "all_reduce":
        def all_reduce() -> torch.Tensor:
            dist.all_reduce(full, group=group)
            return full

        return all_reduce
    if op == "reduce_scatter":
        shard = torch.empty(full.numel() // size, device=full.device, dtype=full.dtype)

        def reduce_scatter() -> torch.Tensor:
            reduce_scatter_single(shard, full, group=group)
            return shard

        return reduce_scatter
    if op == "all_gather":
        shard = full[:full.numel() // size].clone()

        def all_gather() -> torch.Tensor:
            all_gather_single(full, shard, group=group)
            return full

        return all_gather
    incoming = torch.empty_like(full)
    if op == "all_to_all":
        def all_to_all() -> torch.Tensor:
            # block r of `full` goes to the group's r-th rank, as in the runtime's
            # all-to-alls (MoE dispatch, gloo's reduce-scatter of activations)
            dist.all_to_all_single(incoming, full, group=group)
            return incoming

        return all_to_all
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(size))
    me = ranks.index(dist.get_rank())
    right, left = ranks[(me + 1) % size], ranks[(me - 1) % size]

    def send_recv() -> torch.Tensor:
        # Every rank sends to its right neighbour and receives from its left one, at once:
        # the stage-boundary traffic of a pipeline in its steady state.
        ops = [dist.P2POp(dist.isend, full, right), dist.P2POp(dist.irecv, incoming, left)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        return incoming

    return send_recv


def planned_bytes(op: str, buffer_bytes: float, n: int) -> float:
    """The bytes the planner prices a call of `op` on a flat buffer of `buffer_bytes` over n
    ranks at (plan.comm.collective_time): the whole buffer, except for an all-to-all, which
    it prices at the part that leaves the rank (plan.comm.leaving), as the runtime's callers
    pass it (plan.comm.scatter_time, placement.all_to_all_bytes)."""
    return leaving(buffer_bytes, n) if op == "all_to_all" else buffer_bytes


def _seconds_per_call(call: Callable[[], object], device: torch.device, repeats: int,
                      batch_s: float, group: dist.ProcessGroup | None = None
                      ) -> tuple[float, float]:
    """(seconds per call, the world's slowest rank's): medians over `repeats` batches.

    A batch is k back-to-back calls after a barrier, k chosen (the same on every rank) so a
    batch lasts about `batch_s`: one call would mostly time how late each rank leaves the
    barrier, which on a time-shared CPU is a scheduler quantum, not the collective.

    A call over `group` ends when its last member's does, so a batch takes the group its
    slowest member's time. The groups that run at once (the four pairs of 8 ranks at TP=2)
    each time the same call, and the price is their mean: the world's slowest rank is the
    unluckiest group's (on 8 CPU ranks sharing 2 cores, back-to-back pair all-reduces of
    16 KiB-1 MiB: 2.43-3.78 ms against 1.44-2.83 ms on the mean, in
    bench/results/benchmarks-mean/hardware-profile.json), and the lag between a
    step's ranks is `sync_wait`'s to count. The slowest rank's times, the second figure,
    are kept beside them (the bench prices both).
    """
    call()  # warm-up: connections, buffers
    sync(device)
    started = time.perf_counter()
    call()
    sync(device)
    first = torch.tensor([time.perf_counter() - started], dtype=torch.float64, device=device)
    dist.all_reduce(first, op=dist.ReduceOp.MAX)
    calls = max(1, min(50, round(batch_s / max(first.item(), 1e-6))))
    samples = []
    for _ in range(repeats):
        dist.barrier()
        sync(device)
        started = time.perf_counter()
        for _ in range(calls):
            call()
        sync(device)
        samples.append((time.perf_counter() - started) / calls)
    per_group = torch.tensor(samples, dtype=torch.float64, device=device)
    slowest = per_group.clone()
    dist.all_reduce(per_group, op=dist.ReduceOp.MAX, group=group)
    # every member now holds its group's figure: the mean over the world is the groups' mean
    dist.all_reduce(per_group)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return (statistics.median((per_group / dist.get_world_size()).tolist()),
            statistics.median(slowest.tolist()))


def neighbour_group(n: int) -> dist.ProcessGroup | None:
    """This rank's group when the world is split into groups of `n` neighbouring ranks (None:
    the world). new_group is collective: every rank creates every group, in order."""
    world, rank = dist.get_world_size(), dist.get_rank()
    group = None
    if n < world:
        for first in range(0, world, n):
            created = dist.new_group(list(range(first, first + n)))
            if first <= rank < first + n:
                group = created
    return group


def collective_times(ops: Sequence[str], sizes_bytes: list[int], group_sizes: list[int],
                     device: torch.device, dtype: torch.dtype, repeats: int = 5,
                     batch_s: float = 0.02, slowest: dict | None = None
                     ) -> dict[str, dict[str, list[list[float]]]]:
    """{op: {group size: [[message bytes, seconds per call], ...]}}, the bytes as the
    planner prices the call (`planned_bytes`); call on every rank.
    `slowest`, where given, is filled alike with the world's slowest rank's times.

    The world is split into groups of each size (neighbouring ranks, as a TP group is), all
    of them running the collective at once, as every group of a layout's axis does: on a
    CPU the ranks share its cores, so a group's time depends on the whole world. Message
    sizes are rounded down to equal shards.
    """
    itemsize = torch.empty((), dtype=dtype).element_size()
    times: dict[str, dict[str, list[list[float]]]] = {op: {} for op in ops}
    slowest = {op: {} for op in ops} if slowest is None else slowest
    for n in group_sizes:
        group = neighbour_group(n)
        for op in ops:
            points, slowest_points = [], []
            for size in sizes_bytes:
                numel = max(n, size // itemsize // n * n)
                call = collective_call(op, torch.ones(numel, device=device, dtype=dtype),
                                       group)
                seconds, slowest_s = _seconds_per_call(call, device, repeats, batch_s, group)
                message = planned_bytes(op, float(numel * itemsize), n)
                points.append([message, seconds])
                slowest_points.append([message, slowest_s])
            times[op][str(n)] = points
            slowest.setdefault(op, {})[str(n)] = slowest_points
    return times


MAX_SEGMENT_S = 0.1


# The segments `sync_wait_curve` times the wait after, as fractions of the calibration's own
# (half a layer's forward at its tokens): a TP call in a layout of small microbatches, or
# split over more ranks, follows far less compute than that (plan/sync_wait.py).
SEGMENT_FRACTIONS = (1 / 16, 1 / 4, 1)
GEMM_FLOPS = 2 * 256**3  # one of sync_wait's GEMMs


def sync_wait_curve(segment_s: float, flops_per_s: float, group_sizes: list[int],
                    device: torch.device) -> dict[str, list[list[float]]]:
    """{group size: [[segment_s, wait_s], ...]}: `sync_wait` over groups of that size (all
    groups at once) after SEGMENT_FRACTIONS of `segment_s` (at most MAX_SEGMENT_S), each as
    the whole GEMMs it runs (at least one, ~0.4 ms): the segment each point really timed.
    The last point is the wait at the calibration's own segment (`Cluster.sync_wait_s`).
    Call on every rank."""
    longest = min(segment_s, MAX_SEGMENT_S)
    gemms = sorted({max(1, round(longest * f * flops_per_s / GEMM_FLOPS))
                    for f in SEGMENT_FRACTIONS})
    # shorter segments, more cycles (up to 4x, so at least a quarter of the longest's
    # compute): a shared VM's noise moves the short points less
    points = [(g * GEMM_FLOPS / flops_per_s, min(160, round(40 * gemms[-1] / g)))
              for g in gemms]
    curves = {}
    for n in group_sizes:  # new_group is collective: every rank, in the same order
        group = neighbour_group(n)
        curves[str(n)] = [[seconds, sync_wait(seconds, flops_per_s, device, group, cycles)]
                          for seconds, cycles in points]
    return curves


def scalar_calls(group_sizes: list[int], device: torch.device, repeats: int = 5
                 ) -> dict[str, float]:
    """{group size: seconds of a one-element all-reduce back to back, over groups of that
    size, all groups at once}; call on every rank (CPU ranks: Cluster.scalar_call_s). The
    same call `sync_wait` times as its idle figure, kept here on its own."""
    flag = torch.zeros(1, device=device)
    seconds = {}
    for n in group_sizes:  # new_group is collective: every rank, in the same order
        group = neighbour_group(n)
        seconds[str(n)] = _seconds_per_call(lambda group=group: dist.all_reduce(flag, group=group),
                                            device, repeats, 0.02, group)[0]
    return seconds


def sync_wait(segment_s: float, flops_per_s: float, device: torch.device,
              group: dist.ProcessGroup | None = None, cycles_timed: int = 40,
              message_bytes: int = 4) -> float:
    """Seconds a synchronising call over `group` costs between compute on these ranks beyond
    its idle time; call on every rank (CPU ranks: Cluster.sync_wait_s).

    Every rank runs cycles of a GEMM segment (`segment_s` of one rank alone at
    `flops_per_s`, the same work on every rank) followed by a one-element all-reduce, and the
    same segments without it, in alternating rounds. The wait is (a cycle with the call) -
    (a cycle without it, the ranks' mean) - (the call back to back on idle ranks, what the
    collective fits price), all three timed in each round: ranks that share noisy cores
    drift apart over a segment and the call waits for the last one, and the compute after a
    wait runs slower. The median over
    rounds of ~25 ms halves (`cycles_timed` cycles in all, at least 5 rounds), the ranks'
    mean. `message_bytes` sizes the call (tools.probes.cpu_wait_sizes: whether a large message
    waits longer; the calibration times the one element).
    """
    a = torch.randn(256, 256, device=device)
    flag = torch.zeros(max(1, message_bytes // 4), device=device)
    # at most MAX_SEGMENT_S of compute a cycle (a large model's half layer takes seconds on
    # a CPU); one 256^3 GEMM (~0.4 ms) at least
    segment_s = min(segment_s, MAX_SEGMENT_S)
    gemms = max(1, round(segment_s * flops_per_s / GEMM_FLOPS))
    # ~25 ms a half-round and at least 2 cycles; the same count on every rank, or their
    # all-reduces would not pair up. Short half-rounds, many of them: a host whose cores run
    # at one speed for a few hundred ms and at another for the next (CPU time taken by the
    # host, paraxis.files.host_steal) moves both halves of a round alike.
    longest = torch.tensor([segment_s], dtype=torch.float64)
    dist.all_reduce(longest, op=dist.ReduceOp.MAX)
    cycles = max(2, round(0.025 / (longest.item() + 0.003)))
    rounds = max(5, -(-cycles_timed // cycles))

    def cycle_s(with_call: bool) -> float:
        dist.barrier()
        started = time.perf_counter()
        for _ in range(cycles):
            for _ in range(gemms):
                a @ a
            if with_call:
                dist.all_reduce(flag, group=group)
        return (time.perf_counter() - started) / cycles

    def idle_s() -> float:  # the call back to back, `calls` times after a barrier
        dist.barrier()
        started = time.perf_counter()
        for _ in range(calls):
            dist.all_reduce(flag, group=group)
        return (time.perf_counter() - started) / calls

    # as many idle calls as fill ~5 ms (the same count on every rank; at most 50)
    calls = max(1, min(50, round(0.005 / _seconds_per_call(
        lambda: dist.all_reduce(flag, group=group), device, 3, 0.005, group)[1])))
    size = dist.get_world_size(group)
    waits = []
    for _ in range(rounds):
        alone = torch.tensor([cycle_s(False)], dtype=torch.float64)
        dist.all_reduce(alone, group=group)  # the group's mean below
        with_call = cycle_s(True)
        waits.append(with_call - alone.item() / size - idle_s())
    mean = torch.tensor([statistics.median(waits)], dtype=torch.float64)
    dist.all_reduce(mean)
    return max(0.0, mean.item() / dist.get_world_size())
