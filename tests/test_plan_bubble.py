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
from paraxis.spec.model_config import PRESETS
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


@pytest.mark.parametrize("kind, virtual", [("interleaved", 2), ("interleaved", 3), ("zb-v", 2),
                                           ("1f1b", 1), ("zb-h1", 1)])
def test_the_held_chunks_weigh_each_chunk_and_repeat_after_2p_microbatches(kind, virtual):
    """`schedules.peak_held`: with every chunk weighing one it is `peak_in_flight`; with
    uneven chunks the peak is the schedule's own (the chunks held at once, each by its
    weight); and a schedule of 2 P microbatches holds what a longer one does (the warm-up
    whole, then the steady state repeats), which the planner's count reads
    (`stages.held_stages`)."""
    import random

    from paraxis.spec.schedules import peak_held

    rng = random.Random(virtual)
    for stages in (2, 3, 4):
        counts = build_schedule(kind, stages, 4 * stages, virtual).peak_in_flight()
        chunks = virtual if kind != "zb-v" else 2
        assert peak_held(kind, stages, 4 * stages, virtual,
                         [[1] * chunks] * stages) == counts
        weights = [[rng.randint(1, 5) for _ in range(chunks)] for _ in range(stages)]
        short = peak_held(kind, stages, 2 * stages, virtual, weights)
        assert all(peak_held(kind, stages, m * stages, virtual, weights) == short
                   for m in (3, 5))


def test_the_planner_counts_uneven_chunks_as_they_are_held():
    """The runtime's partition gives GPT-2 124M's zb-v first stage chunks of 3 and 1 blocks
    (the head's cost); its 1F1B-like warm-up holds four microbatches of the 3-block chunk at
    once, 12 blocks' activations, where equal chunks of 2 would be 8."""
    from paraxis.plan.stages import held_stages, partition_of

    cfg = PRESETS["gpt2-124m"]
    partition = partition_of(cfg, 2, 2, 1024, "v")
    blocks = tuple(tuple(len(partition.blocks_of(stage, chunk)) for chunk in range(2))
                   for stage in range(2))
    assert blocks[0] == (3, 1)
    held = held_stages("zb-v", 2, 8, 2, blocks)
    assert held[0] * sum(blocks[0]) == 12
