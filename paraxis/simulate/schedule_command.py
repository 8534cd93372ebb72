"""`paraxis schedule`: one pipeline schedule's timeline, bubble and memory, in the terminal.

    paraxis schedule --kind 1f1b --stages 4 --microbatches 8
    paraxis schedule --kind interleaved --stages 2 --microbatches 4 --virtual 2 --json

The schedule itself is data (`paraxis.schedules`); this module only prints it.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from paraxis.schedules import KINDS, build_schedule, validate
from paraxis.viz.text_timeline import render_timeline


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--kind", default="1f1b", help=", ".join(KINDS))
    add("--stages", type=int, default=4, help="pipeline stages P")
    add("--microbatches", type=int, default=8, help="microbatches M per step")
    add("--virtual", type=int, default=1, help="model chunks per stage (interleaved)")
    add("--forward-cost", type=float, default=1.0, help="time of one forward (whole stage)")
    add("--backward-cost", type=float, default=2.0, help="time of one backward")
    add("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    schedule = validate(build_schedule(args.kind, args.stages, args.microbatches, args.virtual))
    timeline = schedule.simulate(args.forward_cost, args.backward_cost)
    peaks = schedule.peak_in_flight()
    if args.json:
        print(json.dumps({
            **schedule.to_dict(), "bubble_fraction": timeline.bubble_fraction,
            "bubble_ratio": timeline.idle_time / timeline.busy_time,
            "makespan": timeline.makespan, "peak_in_flight": peaks,
            "events": [[{**asdict(e.action), "start": e.start, "end": e.end} for e in stage]
                       for stage in timeline.events]}))
        return 0
    chunks = f", {args.virtual} chunks per stage" if args.virtual > 1 else ""
    print(f"{args.kind}: {args.stages} stages, {args.microbatches} microbatches{chunks} "
          f"(forward {args.forward_cost:g}, backward {args.backward_cost:g})")
    print(render_timeline(timeline))
    print(f"bubble fraction: {timeline.bubble_fraction:.1%} of the timeline "
          f"(idle / ideal = {timeline.idle_time / timeline.busy_time:.3f})")
    unit = " (microbatch-chunks)" if args.virtual > 1 else ""
    print(f"peak in-flight microbatches per stage{unit}: {peaks}")
    return 0
