"""Pipeline pictures from `paraxis.spec.schedules`: simulated schedules side by side, and a
measured trace next to the schedule it ran.

Bubble figures come from `Timeline.bubble_fraction` (simulated) and from the trace's own
idle time (measured), never from a formula re-derived here.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from matplotlib.figure import Figure

from paraxis.files.trace import COMPUTE_KINDS, busy_fraction, trace_costs
from paraxis.show.viz.timeline import TimelinePanel, plot_timelines
from paraxis.spec.schedules import FIXED_VIRTUAL, Timeline, build_schedule

SCHEDULE_TITLES = {"gpipe": "GPipe (Huang et al. 2019)",
                   "1f1b": "1F1B (PipeDream-Flush, Narayanan et al. 2021)",
                   "interleaved": "interleaved 1F1B (Narayanan et al. 2021)",
                   "zb-h1": "ZB-H1 (Qi et al. 2023): backward split in B and W",
                   "zb-v": "ZB-V (Qi et al. 2024): two chunks per stage in a V"}
CLASSIC = ("gpipe", "1f1b", "interleaved")
ZERO_BUBBLE_PANELS = ("1f1b", "zb-h1", "zb-v")  # the zero-bubble picture keeps 1F1B for reference


def timeline_events(timeline: Timeline) -> list[dict]:
    """A simulated Timeline as trace events (stage = rank), the form `plot_timelines` and the
    Chrome trace take. Zero-length events (an isend posted) are dropped: nothing to draw."""
    events = []
    for stage, stage_events in enumerate(timeline.events):
        for e in stage_events:
            if e.end <= e.start and e.action.kind not in COMPUTE_KINDS:
                continue
            events.append({"rank": stage, "stage": stage, "kind": e.action.kind,
                           "microbatch": e.action.microbatch, "chunk": e.action.chunk,
                           "start_s": e.start, "end_s": e.end})
    return events


@dataclass(frozen=True)
class SimulatedSchedule:
    """The numbers behind one panel of `compare_schedules`."""

    kind: str
    virtual: int
    bubble_fraction: float  # Timeline.bubble_fraction of the simulated step
    peak_in_flight: int  # most (microbatch, chunk) activations any stage holds at once
    makespan_s: float


def compare_schedules(stages: int, microbatches: int, forward_s: float, backward_s: float,
                      comm_s: float = 0.0, virtual: int = 2, cost_note: str = "",
                      time_unit: str = "auto", kinds: tuple[str, ...] = CLASSIC,
                      weight_s: float | None = None
                      ) -> tuple[Figure, dict[str, SimulatedSchedule]]:
    """Schedules (default GPipe vs 1F1B vs interleaved with `virtual` chunks; ZERO_BUBBLE_PANELS for
    1F1B vs ZB-H1 vs ZB-V) for the same stages and microbatches, on one time axis. Returns
    the figure and what each panel shows (bubble, peak in-flight activations), keyed by
    schedule kind. `weight_s`: the W part of a split backward (default half of it)."""
    panels, shown = [], {}
    for kind in kinds:
        if kind == "interleaved" and (microbatches % stages or virtual < 2):
            continue  # Megatron's interleaving needs microbatches in groups of `stages`
        chunks = virtual if kind == "interleaved" else FIXED_VIRTUAL.get(kind, 1)
        schedule = build_schedule(kind, stages, microbatches, chunks)
        timeline = schedule.simulate(forward_s, backward_s, comm_s, weight_s)
        peak = max(schedule.peak_in_flight())
        shown[kind] = SimulatedSchedule(kind, chunks, timeline.bubble_fraction, peak,
                                        timeline.makespan)
        held = f"peak {peak} microbatches' activations held" if chunks == 1 else \
            f"v={chunks}, peak {peak} chunk activations of 1/{chunks} stage"
        panels.append(TimelinePanel(f"{SCHEDULE_TITLES[kind]}; {held}",
                                    timeline_events(timeline), timeline.bubble_fraction))
    note = f"\n({cost_note})" if cost_note else ""  # its own line: a long note is not cut
    fig = plot_timelines(panels, f"Pipeline schedules: {stages} stages, {microbatches} "
                                 f"microbatches{note}", time_unit=time_unit)
    return fig, shown


def measured_bubble(events: list[dict]) -> float:
    """Idle share of the measured step: 1 - compute time / (ranks x wall span)."""
    busy = busy_fraction(events)
    return 1 - sum(busy.values()) / len(busy) if busy else 0.0


def mean_costs(events: list[dict]) -> tuple[float, float]:
    """Mean forward and whole-backward (B, plus W when split) seconds per (microbatch,
    chunk) in a measured trace."""
    spans: dict[str, list[float]] = defaultdict(list)
    for e in events:
        if e["kind"] in COMPUTE_KINDS:
            spans[e["kind"]].append(e["end_s"] - e["start_s"])
    backward = sum(spans["B"]) / max(len(spans["B"]), 1)
    if spans["W"]:
        backward += sum(spans["W"]) / len(spans["W"])
    return sum(spans["F"]) / max(len(spans["F"]), 1), backward


def predicted_vs_measured(events: list[dict], kind: str, microbatches: int,
                          virtual: int = 1) -> tuple[Figure, float, float]:
    """The measured trace under the same schedule simulated with the trace's own mean F/B
    times: the difference is what the schedule alone does not explain (communication,
    stragglers, launch overheads). Returns (figure, predicted bubble, measured bubble)."""
    stages = len({e["stage"] for e in events})
    forward_s, backward_s = mean_costs(events)
    # Ranks of one stage (its dp and tp ranks) run the same actions at the same time: one
    # lane per stage shows the first of them, so their bars do not pile up in one lane.
    first = {}
    for e in events:
        first.setdefault(e["stage"], e["rank"])
    drawn = [e for e in events if e["rank"] == first[e["stage"]]]
    ranks = ", ".join(str(first[s]) for s in sorted(first))
    which = f" (ranks {ranks}: one per stage)" if len(drawn) < len(events) else ""
    # Each chunk's own measured F, B and W (an unbalanced pipeline stays unbalanced).
    schedule = build_schedule(kind, stages, microbatches, virtual)
    forward, backward, weight = trace_costs(events, stages, schedule.virtual,
                                            schedule.virtual_stage)
    timeline = schedule.simulate(forward, backward, 0.0,
                                 weight if schedule.split_backward else None)
    predicted, measured = timeline.bubble_fraction, measured_bubble(events)
    fig = plot_timelines(
        [TimelinePanel(f"predicted: {kind} at each chunk's traced times (mean F "
                       f"{forward_s * 1e3:.3g} ms, B {backward_s * 1e3:.3g} ms), sends free",
                       timeline_events(timeline), predicted),
         TimelinePanel(f"measured: the runtime's trace of one step{which}", drawn, measured)],
        f"Pipeline step, predicted vs measured ({stages} stages, {microbatches} microbatches)",
        time_unit="ms")
    return fig, predicted, measured
