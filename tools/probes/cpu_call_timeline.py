"""Where each all-reduce of a real TP step spends its time, both ranks on one clock.

    python -m tools.probes.cpu_call_timeline [--steps 4] [--model NAME] [LAYOUT]
                                                  (default: dp=1,tp=2 of the bench's model)

LAYOUT has TP; with other axes (pipeline stages, data-parallel replicas) each TP group is
split on its own.

`python -m tools.probes.cpu_tp_probe --per-call` finds what a call costs in a step, on average (the
step with its all-reduces against the step with them made no-ops). This splits that figure
up. Every rank records, for each all-reduce of its step, when it entered the call and when it
left it, on the machine's monotonic clock (`time.perf_counter`, CLOCK_MONOTONIC on Linux: the
same clock in every process). Per call over the ranks of its group:

- `skew`: the last rank's entry minus the first's. The first waits that long for its peers:
  the lag the planner's sync wait prices (plan/sync_wait.py, from compute between calls);
- `exchange`: from the last entry to the first exit, when every rank is inside the call;
  what the calibration's back-to-back timings price (paraxis/train/calibrate/collectives.py);
- `exit lag`: the last rank's exit minus the first's. A rank that leaves first goes back to
  its compute while a peer is still finishing the call: the lag carries into the next call's
  skew.

A call's time on a rank is its own exit minus its own entry; `mean call` is the ranks' mean.
The step is the bench's (tools.probes.cpu_tp_probe.model_step: global batch 16 x 128 tokens).
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass

from paraxis.dist.testing import run_distributed
from paraxis.spec.layout import Layout

# (entered, left, message bytes) of one call on one rank, perf_counter seconds
Call = tuple[float, float, int]


@dataclass(frozen=True)
class CallSplit:
    """One call over its group's ranks, in seconds."""

    bytes: int
    mean_call: float
    skew: float
    exchange: float
    exit_lag: float


def split_call(calls: list[Call]) -> CallSplit:
    """The same call as each rank of its group recorded it."""
    entered, left = [c[0] for c in calls], [c[1] for c in calls]
    return CallSplit(bytes=calls[0][2],
                     mean_call=statistics.mean(b - a for a, b, _ in calls),
                     skew=max(entered) - min(entered),
                     exchange=max(0.0, min(left) - max(entered)),
                     exit_lag=max(left) - min(left))


def split_step(per_rank: list[list[Call]]) -> list[CallSplit]:
    """A step's calls, the i-th of every rank together (the ranks of one group make the
    same calls in the same order: a collective pairs up that way or hangs)."""
    counts = {len(calls) for calls in per_rank}
    if len(counts) != 1:
        raise ValueError(f"the ranks made different numbers of all-reduces: {sorted(counts)}")
    return [split_call(list(same)) for same in zip(*per_rank, strict=True)]


def timeline_body(text: str, steps: int, model: str = "") -> list[list[Call]]:
    """On every rank: train, then record every all-reduce of `steps` steps."""
    import time

    import torch
    import torch.distributed as dist

    from tools.probes.cpu_tp_probe import model_step

    real_all_reduce, log = dist.all_reduce, []

    def recorded(tensor: torch.Tensor, *args: object, **kwargs: object) -> object:
        entered = time.perf_counter()
        work = real_all_reduce(tensor, *args, **kwargs)
        log.append((entered, time.perf_counter(), tensor.numel() * tensor.element_size()))
        return work

    dist.all_reduce = recorded
    step = model_step(text, model)
    for _ in range(2):  # warm-up: connections, allocator
        step()
    recorded_steps = []
    for _ in range(steps):
        log.clear()
        step()
        recorded_steps.append(list(log))
    return recorded_steps


def summary(calls: list[CallSplit]) -> str:
    def ms(values: list[float]) -> str:
        return f"{statistics.mean(values) * 1e3:.2f}"

    exchanges = sorted(c.exchange for c in calls)
    return (f"{len(calls)} calls: mean call {ms([c.mean_call for c in calls])} ms, skew "
            f"{ms([c.skew for c in calls])}, exchange {ms(exchanges)} (median "
            f"{statistics.median(exchanges) * 1e3:.2f}, range {exchanges[0] * 1e3:.2f}-"
            f"{exchanges[-1] * 1e3:.2f}), exit lag {ms([c.exit_lag for c in calls])}; all "
            f"calls {sum(c.mean_call for c in calls) * 1e3:.0f} ms of the step")


def split_groups(layout: Layout, ranks: list[list[list[Call]]]
                 ) -> dict[tuple[int, ...], list[list[CallSplit]]]:
    """{TP group's ranks: its steps, each split call by call}: `ranks` holds every rank's
    recorded steps, by rank. A TP group's ranks make the same calls in the same order; ranks of
    different groups (pipeline stages, data-parallel replicas) need not, so each group is
    paired on its own."""
    return {tuple(members): [split_step(list(per_rank)) for per_rank in
                             zip(*(ranks[r] for r in members), strict=True)]
            for members in layout.groups("tp")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("layout", nargs="?", default="dp=1,tp=2",
                        help="a layout with TP (tp > 1); each TP group is split on its own")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--model", default="", help="a preset (default: the bench's model)")
    args = parser.parse_args()
    layout = Layout.parse(args.layout)
    if layout.tp < 2:
        parser.error(f"{args.layout}: give a layout with tensor parallelism (tp > 1), such as "
                     "dp=1,tp=2")
    ranks = run_distributed(timeline_body, layout.world_size,
                            (args.layout, args.steps, args.model), timeout_s=600)
    print(f"{args.layout}: every all-reduce of a step, its ranks on one clock (ms)")
    groups = split_groups(layout, ranks)
    for members, steps in groups.items():
        if len(groups) > 1:
            print(f"TP group of ranks {list(members)}:")
        for index, calls in enumerate(steps):
            print(f"step {index}: {summary(calls)}")
            large = [c for c in calls if c.bytes == max(c.bytes for c in calls)]
            if len(large) < len(calls):
                print(f"  its {large[0].bytes:,}-byte calls: {summary(large)}")


if __name__ == "__main__":
    main()
