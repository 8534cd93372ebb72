"""What a blocking exchange costs between CPU ranks that are busy computing.

The collectives `paraxis calibrate` fits are timed with every rank waiting on them, so a
partner is always ready. In a training step the partner is computing, and where a node has
more busy ranks than cores it may be off its core when the message is due: the rank that
blocks waits for the scheduler to run it again. That wait is not a bandwidth or a latency of
the transport and no datasheet gives it, so it is measured here, at the rank count a run
uses: pairs of ranks alternate a fixed amount of CPU work with a small ping-pong, and the
wall time beyond (the work alone) + (the ping-pong alone) is the wait each blocking exchange
adds. It is about zero where every rank has a core, or where the machine is so loaded that
the transport is as slow as a rescheduling anyway (the ping-pong alone already pays it).
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

BURST_S = 1e-3  # CPU seconds of work between exchanges: about one layer's pass of a small model
ITERATIONS = 40
REPEATS = 3  # the three measurements interleaved this many times, the median of each kept
MESSAGE_BYTES = 4096  # latency-bound, like a small model's TP all-reduce


def _work(seconds: float, a: torch.Tensor) -> None:
    """Matrix products for `seconds` of this thread's CPU time (not wall time: the burst is
    the same work however the cores are shared)."""
    started = time.thread_time()
    while time.thread_time() - started < seconds:
        a @ a


def wait_body(burst_s: float = BURST_S, iterations: int = ITERATIONS,
              repeats: int = REPEATS) -> dict[str, float]:
    """Runs on every rank: wall seconds per iteration of work alone, of the ping-pong alone and
    of both (the median of `repeats`, interleaved so that a change of load hits all three),
    ranks paired (0, 1), (2, 3), ... (an odd last rank only works)."""
    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    peer = rank ^ 1 if rank ^ 1 < world else None
    a, buffer = torch.randn(128, 128), torch.zeros(MESSAGE_BYTES // 4)

    def exchange() -> None:
        # Each rank blocks once per iteration: the even one on its reply, the odd one on the
        # message (a TP all-reduce or a pipeline receive blocks once the same way).
        if peer is None:
            return
        if rank % 2 == 0:
            dist.send(buffer, peer)
            dist.recv(buffer, peer)
        else:
            dist.recv(buffer, peer)
            dist.send(buffer, peer)

    times: dict[str, list[float]] = {"exchange": [], "work": [], "both": []}
    for _ in range(repeats):
        for label, work, talk in (("exchange", False, True), ("work", True, False),
                                  ("both", True, True)):
            dist.barrier()
            for step in range(iterations + 3):  # three warm-up iterations
                if step == 3:
                    started = time.perf_counter()
                if work:
                    _work(burst_s, a)
                if talk:
                    exchange()
            times[label].append((time.perf_counter() - started) / iterations)
    return {label: statistics.median(values) for label, values in times.items()}


def exchange_wait(per_rank: list[dict[str, float]]) -> float:
    """Seconds one blocking exchange between busy ranks adds beyond the work and the exchange
    priced apart (module docstring), from every rank's `wait_body` result; at least 0."""
    # The slowest rank sets the pace of an iteration, as the slowest rank sets a step's.
    slowest = {key: max(r[key] for r in per_rank) for key in per_rank[0]}
    return max(0.0, slowest["both"] - slowest["work"] - slowest["exchange"])
