"""Whether a synchronising call's wait after compute grows with its message, timed as
`paraxis calibrate` times the wait (train/calibrate/collectives.sync_wait), on CPU ranks.

    python -m tools.probes.cpu_wait_sizes [--ranks 2] [--group 2] [--segments-ms 7.6,15]
                                          [--sizes 4,2097152] [--launches 3] [--repeats 3]

The calibration times the wait after a GEMM segment with a one-element all-reduce
(`sync_wait_curve_s`) and the planner adds it to a call of any size (plan/sync_wait.py). A real TP
step's 2 MiB calls arrive further apart than that wait (tools.probes.cpu_call_timeline). Here each
launch of `--ranks` ranks times `sync_wait` `--repeats` times per segment and message size,
interleaved; printed per segment and size: every figure (ms, the ranks' mean) and their mean.
The defaults are the bench's dp=1,tp=2: half a layer's forward on its 1024 token-equivalents
(7.6 ms here) and the backward's twice that, and its 2 MiB activations.
"""

from __future__ import annotations

import argparse
import statistics

from paraxis.dist.testing import run_distributed


def wait_body(segments_s: tuple[float, ...], sizes: tuple[int, ...], repeats: int,
              group_size: int) -> dict[tuple[float, int], list[float]]:
    """On every rank: {(segment_s, message bytes): [wait in ms, ...]}."""
    import torch

    from paraxis.train.calibrate.collectives import neighbour_group, sync_wait
    from paraxis.train.calibrate.kernels import matmul_rate

    group = neighbour_group(group_size)
    cpu = torch.device("cpu")
    # the rate of sync_wait's own 256^3 GEMM, which sizes its segments
    flops_per_s = matmul_rate([(256, 256, 256)], cpu, torch.float32)["flops_per_s"]
    waits: dict[tuple[float, int], list[float]] = {}
    for _ in range(repeats):
        for segment_s in segments_s:
            for size in sizes:
                wait = sync_wait(segment_s, flops_per_s, cpu, group, message_bytes=size)
                waits.setdefault((segment_s, size), []).append(wait * 1e3)
    return waits


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--group", type=int, default=2)
    parser.add_argument("--segments-ms", default="7.6,15")
    parser.add_argument("--sizes", default="4,2097152", help="message bytes, comma-separated")
    parser.add_argument("--launches", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    segments = tuple(float(s) / 1e3 for s in args.segments_ms.split(","))
    sizes = tuple(int(s) for s in args.sizes.split(","))
    figures: dict[tuple[float, int], list[float]] = {}
    for _ in range(args.launches):
        ranks = run_distributed(wait_body, args.ranks,
                                (segments, sizes, args.repeats, args.group), timeout_s=900)
        for key in ranks[0]:
            for i in range(len(ranks[0][key])):
                figures.setdefault(key, []).append(statistics.mean(r[key][i] for r in ranks))
    print(f"sync wait beyond the call's back-to-back time, groups of {args.group} on "
          f"{args.ranks} CPU ranks ({args.launches} launches x {args.repeats}), ms")
    for (segment_s, size), values in sorted(figures.items()):
        print(f"after {segment_s * 1e3:.1f} ms, {size:>9} bytes: mean {statistics.mean(values):.2f}"
              f" (" + ", ".join(f"{v:.2f}" for v in values) + ")")


if __name__ == "__main__":
    main()
