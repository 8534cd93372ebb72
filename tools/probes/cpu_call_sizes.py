"""What an all-reduce adds to a step of compute on CPU ranks, by message size, next to what
it costs back to back and to what the planner charges for it.

    python -m tools.probes.cpu_call_sizes [--ranks 8] [--group 2] [--segment-ms 0.5]
                                          [--sizes 4,16384,...] [--hardware PROFILE]

Every rank (groups of `--group` neighbouring ranks, all groups at once, as TP runs) runs rounds of
cycles, each a GEMM segment of about `--segment-ms` alone (the demo's half layer is well under a
millisecond) with and without an all-reduce of the message after it, then the same all-reduces back
to back. Per message size, the ranks' mean, in ms: `in_step` (a cycle with the call minus one
without: what the call adds to a step), `back_to_back` (a call on ranks doing nothing else), how
late the last rank of a group entered the in-step call and left it (`skew`, `exit_lag`:
tools.probes.cpu_call_timeline's split), the process CPU time the call adds in a step
(`cpu_in_step`, gloo's threads included) and that CPU time over the rank's share of the cores
(`cpu_over_share`: cores / ranks where the ranks outnumber them). With `--hardware` (a profile
`paraxis calibrate` or the demo wrote), also the planner's price of the same call
(`plan.comm.collective_time` on the TP link: the fitted back-to-back time plus the profile's sync
wait after `--segment-ms` of compute, plan/sync_wait.py).

Medians over 7 rounds of 20 cycles per rank; every figure moves by 10-30% between launches
on a shared VM, so compare columns within one launch.
"""

from __future__ import annotations

import argparse
import statistics

from paraxis.dist.testing import run_distributed
from tools.probes.cpu_call_timeline import split_step

SIZES_BYTES = (4, 16384, 131072, 1048576)
FLOPS_PER_S = 9e10  # only sizes the segment: about this machine's fp32 GEMM rate
CYCLES, ROUNDS = 20, 7


def probe_body(segment_s: float, sizes: tuple[int, ...], group_size: int = 2
               ) -> dict[int, dict[str, float]]:
    """On every rank: per message size, the medians of its rounds (ms)."""
    import time

    import torch
    import torch.distributed as dist

    from paraxis.train.calibrate.collectives import neighbour_group

    group = neighbour_group(group_size)
    a = torch.randn(256, 256)
    gemms = max(1, round(segment_s * FLOPS_PER_S / (2 * 256**3)))
    figures = {}
    for size in sizes:
        message = torch.zeros(max(1, size // 4))

        calls: list[tuple[float, float, int]] = []  # the in-step calls, for their split

        def rounds(compute: bool, call: bool, message: torch.Tensor = message,
                   calls: list = calls, size: int = size) -> tuple[float, float]:
            dist.barrier()
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(CYCLES):
                for _ in range(gemms if compute else 0):
                    a @ a
                if call:
                    entered = time.perf_counter()
                    dist.all_reduce(message, group=group)
                    if compute:
                        calls.append((entered, time.perf_counter(), size))
            return ((time.perf_counter() - wall) / CYCLES * 1e3,
                    (time.process_time() - cpu) / CYCLES * 1e3)

        alone, with_call, idle = [], [], []
        for _ in range(ROUNDS):
            alone.append(rounds(True, False))
            with_call.append(rounds(True, True))
            idle.append(rounds(False, True))

        def median(samples: list[tuple[float, float]], which: int) -> float:
            return statistics.median(sample[which] for sample in samples)

        figures[size] = {"in_step": median(with_call, 0) - median(alone, 0),
                         "back_to_back": median(idle, 0),
                         "cpu_in_step": median(with_call, 1) - median(alone, 1),
                         "cycle_alone": median(alone, 0), "calls": calls}
    return figures


def in_step_split(per_rank: list[dict], size: int, group: int) -> dict[str, float]:
    """The in-step calls of `size` over every group, split as tools.probes.cpu_call_timeline splits
    a real step's (ms, means over the groups' calls): how late the last rank entered (skew)
    and left (exit lag)."""
    splits = [split for first in range(0, len(per_rank), group)
              for split in split_step([rank[size]["calls"]
                                       for rank in per_rank[first:first + group]])]
    return {"skew": statistics.mean(s.skew for s in splits) * 1e3,
            "exit_lag": statistics.mean(s.exit_lag for s in splits) * 1e3}


def planner_price_ms(profile_path: str, ranks: int, size: int, group: int = 2,
                     segment_s: float = 0.0) -> float:
    """The planner's price of one all-reduce of `size` bytes on the profile's TP link of
    `group` ranks, after `segment_s` of compute (0: the profile's flat sync wait)."""
    import json

    from bench.predicted_vs_measured import profile_overrides
    from paraxis.plan.comm import axis_link, collective_time
    from paraxis.plan.hardware import build_cluster
    from paraxis.plan.sync_wait import at_segment
    from paraxis.spec.layout import Layout

    with open(profile_path) as file:
        cluster = build_cluster(gpus=ranks, overrides=profile_overrides(json.load(file)))
    link = axis_link(Layout(dp=ranks // group, tp=group), "tp", at_segment(cluster, segment_s))
    return collective_time("all_reduce", size, group, link) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--group", type=int, default=2, help="ranks in each group")
    parser.add_argument("--segment-ms", type=float, default=0.5)
    parser.add_argument("--hardware", help="a profile to price the calls on")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES_BYTES)),
                        help="message sizes in bytes, comma-separated")
    args = parser.parse_args()
    sizes = tuple(int(size) for size in args.sizes.split(","))
    from paraxis.train.calibrate.measure import cpu_cores

    share = min(1.0, cpu_cores() / args.ranks)
    per_rank = run_distributed(probe_body, args.ranks,
                               (args.segment_ms / 1e3, sizes, args.group), timeout_s=900)
    print(f"all-reduce over groups of {args.group} on {args.ranks} CPU ranks, {cpu_cores()} "
          f"cores, segments of {args.segment_ms} ms alone: ranks' mean, ms")
    columns = ["in_step", "back_to_back", "skew", "exit_lag", "cpu_in_step", "cpu_over_share",
               "cycle_alone"]
    columns += ["planner"] if args.hardware else []
    print(f"{'bytes':>9}" + "".join(f"{c:>16}" for c in columns))
    for size in sizes:
        row = {key: statistics.mean(rank[size][key] for rank in per_rank)
               for key in per_rank[0][size] if key != "calls"}
        row.update(in_step_split(per_rank, size, args.group))
        row["cpu_over_share"] = row["cpu_in_step"] / share
        if args.hardware:
            row["planner"] = planner_price_ms(args.hardware, args.ranks, size, args.group,
                                              args.segment_ms / 1e3)
        print(f"{size:>9}" + "".join(f"{row[c]:>16.2f}" for c in columns))


if __name__ == "__main__":
    main()
