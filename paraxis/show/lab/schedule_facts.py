"""Pipeline schedules for the lab page: every kind's compute order, from the generators.

The page embeds, for every (kind, P, M, v) on its sliders, each stage's order of F, B and W
as `build_schedule` makes it, and runs those orders against a clock in JavaScript
(`simulate` in core.js) so that a slow stage can be any stage without
embedding a timeline per setting. `python_timelines` is what that clock must reproduce: the
library's own `Schedule.simulate` on the same costs; the browser test compares the two over
every setting.
"""

from __future__ import annotations

from fractions import Fraction

from paraxis.spec.errors import ParaxisError
from paraxis.spec.schedules import COMPUTE, FIXED_VIRTUAL, KINDS, build_schedule

# The sliders' ranges. Every setting is simulated again by the browser test against the
# library, so they hold the course's examples (P = 4; M = 4, 8, 16) and not every integer.
STAGES = [2, 3, 4, 5, 6, 8]
MICROBATCHES = [1, 2, 3, 4, 6, 8, 12, 16]
INTERLEAVED_VIRTUAL = [2, 3, 4]  # the v slider; the other kinds run their own v
# Course ch. 7: "if stage 0 takes 10ms and stage 3 takes 20ms" - a slow stage takes twice as long.
SLOW_FACTOR = 2.0
FORWARD_COST, BACKWARD_COST = 1.0, 2.0  # backward twice the forward (Narayanan et al. 2021)
# The overhead slider: a fixed cost per microbatch per stage, as a fraction of one stage's
# forward over the whole batch (course ch. 4: smaller microbatches, smaller bubble, more
# overhead; tune). A model the page labels as one; the pipeline widget applies it.
MICROBATCH_OVERHEADS = [0.0, 0.01, 0.02, 0.05, 0.1]
DEFAULT_OVERHEAD = 0.02


def key(kind: str, stages: int, microbatches: int, virtual: int) -> str:
    return f"{kind}/{stages}/{microbatches}/{virtual}"


def kind_virtual(kind: str) -> list[int]:
    """The v a kind runs with on the page: the slider's for interleaved, else its own."""
    return INTERLEAVED_VIRTUAL if kind == "interleaved" else [FIXED_VIRTUAL.get(kind, 1)]


def schedule_settings() -> list[tuple[str, int, int, int]]:
    """Every (kind, P, M, v) the sliders reach."""
    return [(kind, p, m, v) for kind in KINDS for p in STAGES for m in MICROBATCHES
            for v in kind_virtual(kind)]


def slow_settings(stages: int) -> list[int | None]:
    """Every choice of the slow-stage control: none, or any one stage."""
    return [None, *range(stages)]


def schedule_facts() -> dict:
    """Per setting the compute order of each stage as flat [kind, microbatch, chunk] triples
    (kind 0 F, 1 B, 2 W) with the schedule's real v and placement, or the library's error
    (interleaved needs M a multiple of P; only interleaved takes v > 1)."""
    orders = {}
    for kind, p, m, v in schedule_settings():
        try:
            schedule = build_schedule(kind, p, m, v)
        except ParaxisError as error:
            orders[key(kind, p, m, v)] = {"error": str(error)}
            continue
        orders[key(kind, p, m, v)] = {
            "virtual": schedule.virtual, "placement": schedule.placement,
            "orders": [[n for a in schedule.compute_order(s)
                        for n in (COMPUTE.index(a.kind), a.microbatch, a.chunk)]
                       for s in range(p)]}
    return {"kinds": list(KINDS), "stages": STAGES, "microbatches": MICROBATCHES,
            "virtual": INTERLEAVED_VIRTUAL, "slow_factor": SLOW_FACTOR,
            "kind_virtual": {kind: kind_virtual(kind)[0] for kind in KINDS
                             if kind != "interleaved"},  # the slider's v for interleaved
            "forward_cost": FORWARD_COST, "backward_cost": BACKWARD_COST,
            "overheads": MICROBATCH_OVERHEADS, "overhead": DEFAULT_OVERHEAD, "orders": orders}


def stage_cost_lists(stages: int, slow_stage: int | None) -> tuple[list[float], list[float]]:
    """Forward and backward cost per stage, one stage `SLOW_FACTOR` times slower (course
    ch. 7: the pipeline runs at the speed of its slowest stage)."""
    scale = [SLOW_FACTOR if s == slow_stage else 1.0 for s in range(stages)]
    return [FORWARD_COST * x for x in scale], [BACKWARD_COST * x for x in scale]


def python_timelines(kind: str, stages: int, microbatches: int, virtual: int) -> list[dict]:
    """The library's figures for one schedule under every slow-stage choice
    (`slow_settings`): each stage's compute events [start, end], makespan, bubble (as a
    float and as the fraction the page prints) and peak activations held."""
    schedule = build_schedule(kind, stages, microbatches, virtual)
    figures = []
    for slow in slow_settings(stages):
        timeline = schedule.simulate(*stage_cost_lists(stages, slow))
        figures.append({
            "events": [[[e.start, e.end] for e in events if e.action.kind in COMPUTE]
                       for events in timeline.events],
            "makespan": timeline.makespan, "bubble": timeline.bubble_fraction,
            "fraction": fraction_text(timeline.bubble_fraction),
            "peak": schedule.peak_in_flight()})
    return figures


def fraction_text(value: float) -> str:
    """"3/7": the bubble as an exact fraction. Every cost is a whole number of small units,
    so the bubble is a ratio of integers far below a million: the closest fraction with a
    denominator under a million is it, float noise removed."""
    f = Fraction(value).limit_denominator(10**6)
    return f"{f.numerator}/{f.denominator}"
