"""Pipeline schedules for the lab page: every kind's compute order, from the generators.

The page embeds, for every (kind, P, M, v) on its sliders, each stage's order of F, B and W
as `build_schedule` makes it, and runs those orders against a clock in JavaScript
(`simulate` in lab.js) so that a slow stage can be any stage at any factor without
embedding a timeline per setting. `python_timeline` is what that clock must reproduce: the
library's own `Schedule.simulate` on the same costs; the browser test compares the two over
every setting.
"""

from __future__ import annotations

from fractions import Fraction

from paraxis.errors import ParaxisError
from paraxis.schedules import COMPUTE, KINDS, build_schedule

STAGES = list(range(2, 9))
MICROBATCHES = list(range(1, 17))
VIRTUAL = [1, 2, 3, 4]
SLOW_FACTORS = [1, 1.5, 2, 3]
FORWARD_COST, BACKWARD_COST = 1.0, 2.0  # backward twice the forward (Narayanan et al. 2021)


def key(kind: str, stages: int, microbatches: int, virtual: int) -> str:
    return f"{kind}/{stages}/{microbatches}/{virtual}"


def schedule_settings() -> list[tuple[str, int, int, int]]:
    """Every (kind, P, M, v) the sliders reach."""
    return [(kind, p, m, v) for kind in KINDS for p in STAGES for m in MICROBATCHES
            for v in VIRTUAL]


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
            "virtual": VIRTUAL, "slow_factors": SLOW_FACTORS,
            "forward_cost": FORWARD_COST, "backward_cost": BACKWARD_COST, "orders": orders}


def stage_cost_lists(stages: int, slow_stage: int | None, factor: float
                     ) -> tuple[list[float], list[float]]:
    """Forward and backward cost per stage, one stage `factor` times slower (course ch. 7:
    the pipeline runs at the speed of its slowest stage)."""
    scale = [factor if s == slow_stage else 1.0 for s in range(stages)]
    return [FORWARD_COST * x for x in scale], [BACKWARD_COST * x for x in scale]


def python_timeline(kind: str, stages: int, microbatches: int, virtual: int,
                    slow_stage: int | None = None, factor: float = 1.0) -> dict:
    """The library's figures for one setting: each stage's compute events [start, end],
    makespan, bubble (as float and as the fraction the page prints) and peak activations."""
    schedule = build_schedule(kind, stages, microbatches, virtual)
    forward, backward = stage_cost_lists(stages, slow_stage, factor)
    timeline = schedule.simulate(forward, backward)
    return {"events": [[[e.start, e.end] for e in events if e.action.kind in COMPUTE]
                       for events in timeline.events],
            "makespan": timeline.makespan, "bubble": timeline.bubble_fraction,
            "fraction": fraction_text(timeline.bubble_fraction),
            "peak": schedule.peak_in_flight()}


def fraction_text(value: float) -> str:
    """"3/7": the bubble as the smallest fraction within float noise of it."""
    f = Fraction(value).limit_denominator(1000)
    return f"{f.numerator}/{f.denominator}"
