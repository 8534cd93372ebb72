"""`paraxis schedule`: one pipeline schedule's timeline, bubble and memory, in the terminal.

    paraxis schedule --kind 1f1b --stages 4 --microbatches 8
    paraxis schedule --kind zb-h1 --stages 4 --microbatches 8 --stage-scale 1,1,1,2
    paraxis schedule --kind interleaved --stages 2 --microbatches 4 --virtual 2 --json
    paraxis schedule --stages 2 --microbatches 8 --from-trace runs/demo/parallel/trace.json
    paraxis schedule --kind zb-v --stages 4 --model gpt2-124m   # costs of its stage split

Costs are per stage when a list is given (`--forward-cost 1,1,1,2`), or scaled per stage by
`--stage-scale` (2 = that stage is twice as slow), or those of a model's stage split (the
partition the runtime uses, priced by FLOPs: the head's stage is the heavy one), or measured
per chunk from a run's trace.
The schedule itself is data (`paraxis.spec.schedules`); this module only prints it.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from paraxis.files.trace import load_trace, trace_costs, traced_count, traced_placement
from paraxis.show.viz.text_timeline import render_timeline
from paraxis.spec.errors import ParaxisError
from paraxis.spec.schedules import (
    KINDS,
    SPLIT_BACKWARD,
    Schedule,
    build_schedule,
    validate,
)

MAX_COST = 1e6  # relative times: beyond it a timeline's sums lose their resolution
MIN_COST = 1e-6  # a forward, backward or factor below it: a stage that takes no time
# A timeline to print, not a cluster's step: P x M x v compute actions at most
MAX_ACTIONS = 100_000
MAX_STAGES = 1024  # rows of a timeline to read (a pipeline that deep has no schedule to see)


def _numbers(text: str) -> float | list[float]:
    try:
        values = [float(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number or a comma-separated "
                                         "list of numbers (one per stage)") from None
    if not all(0 <= v <= MAX_COST for v in values):  # nan fails every comparison
        raise argparse.ArgumentTypeError(f"{text!r}: costs and factors are relative times, "
                                         f"each between 0 and {MAX_COST:g}")
    return values[0] if len(values) == 1 else values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--kind", default="1f1b", help=", ".join(KINDS))
    add("--stages", type=int, default=4, help="pipeline stages P")
    add("--microbatches", type=int, default=8, help="microbatches M per step")
    add("--virtual", type=int, default=None,
        help="model chunks per stage (interleaved; default 2 there, as one chunk per stage "
             "is plain 1F1B)")
    add("--forward-cost", type=_numbers, default=None,
        help="time of one forward of a whole stage (default 1); a list gives one per stage "
             "(or chunk)")
    add("--backward-cost", type=_numbers, default=None,
        help="time of one whole backward (B + W; default 2); a number or a list per stage "
             "(or chunk)")
    add("--weight-cost", type=_numbers, default=None,
        help="time of the weight-gradient part W of the backward (default: half of it)")
    add("--stage-scale", type=_numbers, default=None,
        help="per-stage cost factors, e.g. 1,1,1,2: the last stage twice as slow")
    add("--from-trace", default=None, metavar="PATH",
        help="take per-chunk F/B/W costs from a run's trace.json (its stages and chunks)")
    add("--model", default=None,
        help="cost each chunk as the runtime splits this model (preset or .json/.toml file)")
    add("--seq-len", type=int, default=128,
        help="with --model: tokens per sequence, which weigh attention against the GEMMs in "
             "the split (paraxis train's default, 128)")
    add("--json", action="store_true", help="machine-readable output")


_PLACED = {"v": "in a V (zb-v)", "loop": "in a loop (interleaved)"}


def _scaled(value: float | list[float] | None, scale: list[float], schedule: Schedule
            ) -> float | list[float] | None:
    """Costs times each stage's factor: one cost or one per stage, or one per chunk (as
    --model and --from-trace give them), each scaled by the stage that holds it."""
    if value is None:
        return None
    stages = schedule.num_stages
    values = value if isinstance(value, list) else [value] * stages
    if len(values) == stages:
        return [v * s for v, s in zip(values, scale, strict=True)]
    if len(values) == schedule.num_virtual_stages:
        return [v * scale[schedule.place(chunk)[0]] for chunk, v in enumerate(values)]
    raise ParaxisError(f"--stage-scale needs per-stage costs, got {len(values)} values for "
                       f"{stages} stages; give one cost, or one per stage")


def _check_costs(forward: float | list[float], backward: float | list[float],
                 weight: float | list[float] | None, split: bool) -> None:
    """Every stage's forward and backward take time, and its W is a part of its backward
    (under a `split` backward, a part that takes time too)."""
    def listed(value: float | list[float]) -> list[float]:
        return value if isinstance(value, list) else [value]

    for name, values in (("forward", forward), ("backward", backward)):
        if min(listed(values)) < MIN_COST:
            raise ParaxisError(f"--{name}-cost {_text(values)}: every stage's must be at least "
                               f"{MIN_COST:g} (a stage that takes no time has no schedule)")
    if weight is not None:
        whole = listed(backward) * (len(listed(weight)) if not isinstance(backward, list)
                                    else 1)
        parts = listed(weight) * (len(whole) if not isinstance(weight, list) else 1)
        if any(w >= b for w, b in zip(parts, whole, strict=False)):
            raise ParaxisError(f"--weight-cost {_text(weight)} must be less than the backward "
                               f"{_text(backward)} it is part of (B = backward - W > 0)")
        if split and min(parts) < MIN_COST:
            raise ParaxisError(f"--weight-cost {_text(weight)}: a split backward's W must be at "
                               f"least {MIN_COST:g} (leave it out for half the backward)")


def run(args: argparse.Namespace) -> int:
    virtual = args.virtual if args.virtual is not None else 2 if args.kind == "interleaved" else 1
    if args.stages > MAX_STAGES:
        raise ParaxisError(f"--stages {args.stages} is over {MAX_STAGES:,} rows of timeline; a "
                           "few stages show the schedule (`paraxis plan` prices deep pipelines)")
    if args.stages * args.microbatches * virtual > MAX_ACTIONS:
        raise ParaxisError(f"--stages {args.stages} x --microbatches {args.microbatches} x "
                           f"{virtual} chunks is over {MAX_ACTIONS:,} actions to simulate; "
                           "a few stages and microbatches show the schedule")
    schedule = validate(build_schedule(args.kind, args.stages, args.microbatches, virtual))
    for flag, given in (("--model", args.model), ("--from-trace", args.from_trace)):
        if given is not None and not given.strip():  # "" would be silently ignored
            raise ParaxisError(f"{flag} is empty; give one, or leave the flag out")
        given_costs = [name for name, value in (
            ("--forward-cost", args.forward_cost), ("--backward-cost", args.backward_cost),
            ("--weight-cost", args.weight_cost)) if value is not None]
        if given and given_costs:  # the model's split or the trace sets every cost
            raise ParaxisError(f"{given_costs[0]} and {flag} both give the costs; leave "
                               f"{given_costs[0]} out (--stage-scale still scales {flag}'s)")
    forward = 1.0 if args.forward_cost is None else args.forward_cost
    backward = 2.0 if args.backward_cost is None else args.backward_cost
    weight = args.weight_cost
    source = f"forward {_text(forward)}, backward {_text(backward)}"
    if args.model:
        if args.seq_len < 1:
            raise ParaxisError(f"--seq-len {args.seq_len} must be at least 1")
        forward, backward = _partition_costs(args.model, schedule, args.seq_len)
        weight = None
        source = f"costs of {args.model}'s stage split, backward = 2 x forward"
    if args.from_trace:
        events = load_trace(args.from_trace)
        chunks = max(1, traced_count(events, "chunk"))
        placement = traced_placement(events)
        if chunks != schedule.virtual or (chunks > 1 and placement != schedule.placement):
            # a run's chunk costs belong to its own placement of the chunks
            kind = "1f1b or zb-h1" if chunks == 1 else "zb-v" if placement == "v" else \
                f"interleaved --virtual {chunks}"
            if chunks == schedule.virtual:
                raise ParaxisError(
                    f"the trace's run placed its {chunks} chunks per stage {_PLACED[placement]}"
                    f" and {args.kind} places them {_PLACED[schedule.placement]}: replay it "
                    f"with --kind {kind}, or record a run under {args.kind}")
            raise ParaxisError(f"the trace's run had {chunks} chunk(s) per stage and "
                               f"{args.kind} runs {schedule.virtual}: replay it with --kind "
                               f"{kind}, or record a run under {args.kind}")
        forward, backward, weight = trace_costs(events, schedule.num_stages,
                                                schedule.virtual, schedule.virtual_stage)
        if args.kind in SPLIT_BACKWARD and not any(weight):
            raise ParaxisError(f"the trace has no W (weight-gradient) events: its run did not "
                               f"split the backward, which {args.kind} does; replay it with "
                               "--kind 1f1b, or record a zb-h1 or zb-v run")
        source = f"costs per chunk measured in {args.from_trace}"
    if args.stage_scale is not None:
        scale = args.stage_scale if isinstance(args.stage_scale, list) else [args.stage_scale]
        if len(scale) != schedule.num_stages or min(scale) < MIN_COST:
            raise ParaxisError(f"--stage-scale needs {schedule.num_stages} factors of at least "
                               f"{MIN_COST:g}, got {_text(args.stage_scale)}")
        forward, backward = (_scaled(forward, scale, schedule),
                             _scaled(backward, scale, schedule))
        weight = _scaled(weight, scale, schedule)
        source += f", stage cost factors {_text(scale)}"
    if weight is not None:
        source += f", W {_text(weight)}"
    _check_costs(forward, backward, weight, args.kind in SPLIT_BACKWARD)
    timeline = schedule.simulate(forward, backward, 0.0, weight)
    peaks = schedule.peak_in_flight()
    idle = timeline.idle_by_stage()
    if args.json:
        print(json.dumps({
            **schedule.to_dict(), "bubble_fraction": timeline.bubble_fraction,
            "bubble_ratio": timeline.idle_time / timeline.busy_time,
            "makespan": timeline.makespan, "peak_in_flight": peaks, "idle_by_stage": idle,
            "events": [[{**asdict(e.action), "start": e.start, "end": e.end} for e in stage]
                       for stage in timeline.events]}))
        return 0
    chunks = f", {schedule.virtual} chunks per stage" if schedule.virtual > 1 else ""
    print(f"{args.kind}: {args.stages} stages, {args.microbatches} microbatches{chunks} "
          f"({source})")
    print(render_timeline(timeline))
    print(f"bubble fraction: {timeline.bubble_fraction:.1%} of the timeline "
          f"(idle / ideal = {timeline.idle_time / timeline.busy_time:.3f})")
    print("idle time per stage: " + ", ".join(f"{t:.3g}" for t in idle)
          + f" (of a step of {timeline.makespan:.3g})")
    unit = " (microbatch-chunks)" if schedule.virtual > 1 else ""
    held = " (until W: a split backward keeps them)" if schedule.split_backward else ""
    print(f"peak in-flight activations per stage{unit}: {peaks}{held}")
    return 0


def _partition_costs(model: str, schedule: Schedule, seq_len: int
                     ) -> tuple[list[float], list[float]]:
    """Forward cost per chunk (virtual stage) of the runtime's split of `model` at `seq_len`
    tokens, relative to the mean chunk, and backward at twice that."""
    from paraxis.files.model_file import load_model_config
    from paraxis.spec.partition import partition_layers

    cfg = load_model_config(model)
    cfg.check_seq_len(seq_len)
    split = partition_layers(cfg, schedule.num_stages, schedule.virtual, seq_len=seq_len,
                             placement=schedule.placement)
    mean = sum(split.costs) / len(split.costs)
    forward = [cost / mean for cost in split.costs]
    return forward, [2 * cost for cost in forward]


def _text(value: float | list[float] | None) -> str:
    if isinstance(value, list):
        return ",".join(f"{v:g}" for v in value)
    return "default" if value is None else f"{value:g}"
