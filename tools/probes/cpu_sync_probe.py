"""What a synchronising collective costs between compute on CPU ranks that share cores.

    python -m tools.probes.cpu_sync_probe [RANKS ...]      (default: 2 4 8)

Every rank runs cycles of a GEMM segment (about T ms alone) and a one-element all-reduce (a
barrier). The planner would price a cycle at the segment's CPU time c divided by the share
of a core each rank gets (ranks / cores when they outnumber the cores) plus the barrier on
idle ranks (as `paraxis calibrate` measures collectives). Reported per T: c, and the excess
of the measured cycle over that price (ranks waiting for the last one to arrive, with no
other rank's work to fill the core), and a least-squares line excess = a + b c. The
calibration times three points of it per group (`sync_wait_curve_s`: 1/16, 1/4 and all of
half a layer's forward) and the planner reads each call's wait at the compute before it
(plan/sync_wait.py, docs/planner.md).
"""

from __future__ import annotations

import statistics
import sys

from paraxis.dist.testing import run_distributed

SEGMENTS_MS = (2, 8, 32, 128)
SECONDS_PER_SEGMENT = 3.0


def probe_body(segments_ms: tuple[int, ...], seconds: float) -> dict:
    """On every rank: the idle barrier's time, then per segment (CPU time of one segment,
    wall time of one cycle: segment + barrier), in ms."""
    import time

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    a, b = torch.randn(512, 512), torch.randn(512, 512)
    started = time.perf_counter()
    for _ in range(50):
        a @ b
    gemm_s = (time.perf_counter() - started) / 50
    flag = torch.zeros(1)

    def barrier_s(count: int) -> float:
        started = time.perf_counter()
        for _ in range(count):
            dist.all_reduce(flag)
        return (time.perf_counter() - started) / count

    barrier_s(5)
    result = {"idle_ms": 1e3 * barrier_s(50)}
    for segment in segments_ms:
        gemms = max(1, round(segment / 1e3 / gemm_s))
        cycles = max(5, int(seconds * 1e3 / segment))
        barrier_s(1)
        wall = time.perf_counter()
        compute = 0.0
        for _ in range(cycles):
            t0 = time.thread_time()
            for _ in range(gemms):
                a @ b
            compute += time.thread_time() - t0
            dist.all_reduce(flag)
        result[str(segment)] = (1e3 * compute / cycles,
                                1e3 * (time.perf_counter() - wall) / cycles)
    return result


def main(argv: list[str]) -> int:
    from paraxis.train.calibrate.measure import cpu_cores

    cores = cpu_cores()
    for ranks in [int(a) for a in argv] or [2, 4, 8]:
        results = run_distributed(probe_body, ranks, (SEGMENTS_MS, SECONDS_PER_SEGMENT),
                                  timeout_s=600)
        idle = statistics.mean(r["idle_ms"] for r in results)
        share = max(1.0, ranks / cores)  # the planner's compute_share, inverted
        points = []
        for segment in SEGMENTS_MS:
            compute = statistics.mean(r[str(segment)][0] for r in results)
            cycle = statistics.mean(r[str(segment)][1] for r in results)
            points.append((compute, cycle - compute * share - idle))
        b, a = statistics.linear_regression(*zip(*points, strict=True))
        cells = " | ".join(f"c {c:.1f}: +{w:.2f} ({w / c:.0%})" for c, w in points)
        print(f"{ranks} ranks on {cores} cores: idle barrier {idle:.2f} ms | {cells} (ms) | "
              f"excess = {a:.2f} ms + {b:.3f} c", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
