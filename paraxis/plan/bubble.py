"""Pipeline bubble and in-flight microbatches, from the schedule objects the runtime executes.

GPipe, 1F1B and interleaved 1F1B are answered by the closed forms below, which
tests/test_plan_bubble.py proves equal to the simulated schedule objects
(`paraxis.spec.schedules`) over a grid of (kind, P, M, v): a search asks for thousands, and
a simulation costs milliseconds.

Zero-bubble schedules have no closed form over every cost ratio (their W fills the bubble,
so the idle time depends on F, B and W), but once M >= 2P each further microbatch adds only
busy time, never idle time (tests/test_zero_bubble.py checks it over a grid of costs): a
large one is simulated at M = 2P and its idle time kept.
"""

from __future__ import annotations

from functools import lru_cache
from typing import NamedTuple

from paraxis.plan.hardware import Cluster
from paraxis.spec.schedules import SPLIT_BACKWARD, build_schedule

SIMULATE_MAX_ACTIONS = 256  # P * M * v; a larger zero-bubble schedule is simulated at M = 2P


class PipelineFigures(NamedTuple):
    bubble_fraction: float  # idle share of the step's pipeline time
    # per stage: (microbatch, chunk) activation sets held at once; each is 1/v of the stage
    peak_in_flight: tuple[int, ...]
    source: str  # "schedule" (simulated) or "formula"


def bubble_formula(kind: str, stages: int, microbatches: int, virtual: int = 1) -> float:
    # Narayanan et al. 2021 Sec. 2.2: bubble/ideal = (P-1)/(v*M), so idle share
    # = (P-1)/(v*M + P-1); v = 1 gives GPipe's (P-1)/(M+P-1) (Huang et al. 2019 Sec. 2.3).
    del kind  # the same for GPipe and 1F1B: they differ in memory, not in idle time
    return (stages - 1) / (virtual * microbatches + stages - 1)


def in_flight_formula(kind: str, stages: int, microbatches: int,
                      virtual: int = 1) -> tuple[int, ...]:
    if kind == "gpipe":
        # GPipe (Huang et al. 2019): every microbatch's activations are held before backward.
        return tuple(microbatches for _ in range(stages))
    if kind == "1f1b" or virtual == 1:
        # PipeDream-Flush 1F1B (Narayanan et al. 2021 Sec. 2.2.1): stage s warms up P-s.
        return tuple(min(stages - stage, microbatches) for stage in range(stages))
    # Megatron interleaved warm-up: 2(P-s-1) + (v-1)P forwards, plus the steady-state one.
    return tuple(min(2 * (stages - stage - 1) + (virtual - 1) * stages + 1,
                     microbatches * virtual) for stage in range(stages))


def bubble_floor(kind: str, stages: int, microbatches: int, virtual: int = 1) -> float:
    """A floor under `pipeline_figures(...).bubble_fraction` whatever the work: 0 for a
    zero-bubble schedule (its W's fill the bubble by as much as the work allows); for the
    others the closed form, which their simulated timelines never fall below
    (tests/test_plan_bubble.py), less a rounding margin. Costs no simulation."""
    if stages == 1 or kind in SPLIT_BACKWARD:
        return 0.0
    return bubble_formula(kind, stages, microbatches, virtual) * (1 - 1e-9)


@lru_cache(maxsize=4096)
def pipeline_figures(kind: str, stages: int, microbatches: int, virtual: int = 1,
                     forward_cost: float = 1.0, backward_cost: float = 2.0,
                     weight_cost: float | None = None) -> PipelineFigures:
    """Bubble fraction and per-stage peak in-flight activations of one step (costs of one
    microbatch on a stage; `weight_cost`, the W part of a split backward, defaults to half)."""
    if stages == 1:
        return PipelineFigures(0.0, (1,), "formula")
    if kind not in SPLIT_BACKWARD:
        return PipelineFigures(bubble_formula(kind, stages, microbatches, virtual),
                               in_flight_formula(kind, stages, microbatches, virtual), "formula")
    small = stages * microbatches * virtual <= SIMULATE_MAX_ACTIONS
    if small or microbatches <= 2 * stages:
        schedule = build_schedule(kind, stages, microbatches, virtual)
        timeline = schedule.simulate(forward_cost, backward_cost, 0.0, weight_cost)
        return PipelineFigures(timeline.bubble_fraction, tuple(schedule.peak_in_flight()),
                               "schedule")
    short = build_schedule(kind, stages, 2 * stages, virtual)
    timeline = short.simulate(forward_cost, backward_cost, 0.0, weight_cost)
    idle = timeline.makespan - 2 * stages * (forward_cost + backward_cost)
    busy = microbatches * (forward_cost + backward_cost)
    return PipelineFigures(idle / (idle + busy), tuple(short.peak_in_flight()),
                           "schedule at M=2P")


def bubble_costs(schedule: str, forward: float, backward: float) -> tuple[float, ...]:
    """(forward, backward) relative to the forward, for `pipeline_figures`: only the
    split-backward (zero-bubble) schedules' bubble depends on them; rounded so a layout
    search reuses the simulation."""
    if schedule not in SPLIT_BACKWARD or forward <= 0:
        return ()
    return (1.0, round(backward / forward * 20) / 20)


def stage_share(cluster: Cluster, pp: int) -> float:
    """The compute share each of a stage's ranks of a node gets while the other stages
    idle: the cores shared among those alone (a whole core where they are no more than the
    cores)."""
    return cluster.share_with(max(1, cluster.gpus_per_node // pp))


def bubble_holds(cluster: Cluster, pp: int) -> bool:
    """Whether a 1F1B-family schedule's idle share holds whatever the work: on its own cores
    (a GPU, or no more ranks than cores); where idle ranks lend their cores it does not."""
    return cluster.compute_share >= stage_share(cluster, pp)
