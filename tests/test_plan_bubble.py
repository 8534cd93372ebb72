"""Pipeline bubble and in-flight microbatches: seeds' examples, and the closed forms the planner
uses for big schedules proven equal to the simulated schedule objects."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraxis.plan.bubble import (
    SIMULATE_MAX_ACTIONS,
    bubble_floor,
    bubble_formula,
    in_flight_formula,
    pipeline_figures,
)
from paraxis.spec.errors import ParaxisError
from paraxis.spec.schedules import build_schedule


@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
def test_seeds_bubble_examples(kind: str) -> None:
    assert pipeline_figures(kind, 4, 4).bubble_fraction == pytest.approx(3 / 7)
    assert pipeline_figures(kind, 4, 16).bubble_fraction == pytest.approx(3 / 19)
    # the closed form the planner reads, and the schedule object the runtime executes
    assert build_schedule(kind, 4, 16).bubble_fraction() == pytest.approx(3 / 19)


# the planner prices these kinds by the closed forms alone (plan/bubble.py)
GRID = [(kind, p, m, 1) for kind in ("gpipe", "1f1b") for p in (2, 3, 4, 5, 8)
        for m in (1, 2, 3, 4, 7, 8, 13)]
GRID += [("interleaved", p, m, v) for p in (2, 3, 4) for m in (p, 2 * p, 3 * p, 4 * p)
         for v in (2, 3, 4)]


@pytest.mark.parametrize("kind, stages, microbatches, virtual", GRID)
def test_closed_forms_equal_the_schedule_objects(kind: str, stages: int, microbatches: int,
                                                 virtual: int) -> None:
    schedule = build_schedule(kind, stages, microbatches, virtual)
    assert bubble_formula(kind, stages, microbatches, virtual) == pytest.approx(
        schedule.bubble_fraction(), abs=1e-12)
    assert list(in_flight_formula(kind, stages, microbatches, virtual)) == \
        schedule.peak_in_flight()


FLOOR_GRID = [(kind, p, m, v) for kind, depths in (("gpipe", (1,)), ("1f1b", (1,)),
                                                  ("interleaved", (2, 3, 4)),
                                                  ("zb-h1", (1,)), ("zb-v", (2,)))
              for p in (2, 3, 4, 5, 8) for m in range(1, 33) for v in depths
              if p * m * v <= SIMULATE_MAX_ACTIONS]


def test_the_bubble_floor_is_under_every_simulated_bubble() -> None:
    """The search's floors (plan/floor.py) take the closed form for a simulation: it must
    never be above the simulated timeline's idle share, whatever the microbatch count."""
    for kind, stages, microbatches, virtual in FLOOR_GRID:
        try:
            simulated = build_schedule(kind, stages, microbatches, virtual).bubble_fraction()
        except ParaxisError:  # a schedule these counts do not make
            continue
        assert bubble_floor(kind, stages, microbatches, virtual) <= simulated, (
            kind, stages, microbatches, virtual)
    assert bubble_floor("zb-h1", 4, 8) == 0.0 and bubble_floor("1f1b", 1, 8) == 0.0


@pytest.mark.parametrize("kind, virtual", [("1f1b", 1), ("interleaved", 2), ("gpipe", 1)])
def test_bubble_does_not_depend_on_the_backward_cost(kind: str, virtual: int) -> None:
    # The planner simulates once with backward = 2 x forward and reuses it for recompute (3x).
    schedule = build_schedule(kind, 4, 8, virtual)
    assert schedule.bubble_fraction(1, 3) == pytest.approx(schedule.bubble_fraction(1, 2))


def test_large_schedules_use_the_formula() -> None:
    figures = pipeline_figures("1f1b", 64, 1024)
    assert figures.source == "formula" and 64 * 1024 > SIMULATE_MAX_ACTIONS
    assert figures.bubble_fraction == pytest.approx(63 / 1087)
    assert figures.peak_in_flight[0] == 64 and figures.peak_in_flight[-1] == 1


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(["gpipe", "1f1b", "interleaved"]), st.integers(2, 8), st.integers(1, 40),
       st.integers(2, 4))
def test_bubble_falls_as_microbatches_grow(kind: str, stages: int, m: int, v: int) -> None:
    virtual = v if kind == "interleaved" else 1
    if kind == "interleaved":
        m = m * stages  # interleaved needs M a multiple of P
        step = stages
    else:
        step = 1
    fewer = pipeline_figures(kind, stages, m, virtual).bubble_fraction
    more = pipeline_figures(kind, stages, m + step, virtual).bubble_fraction
    assert more < fewer
