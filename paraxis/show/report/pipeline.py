"""The pipeline section: the three schedules drawn where their lesson holds, then what the
run itself used and what its own trace measured.

The lesson: 1F1B holds fewer microbatches' activations than GPipe (P instead of M) for the
same bubble, and interleaving (v chunks per stage) shrinks the bubble (Narayanan et al. 2021,
sec. 2.2). It shows only when M > P and a forward takes far longer than a send. A small model
on CPU ranks is the opposite case (its sends dwarf its compute), so the pictures are then
priced for a model worth pipelining (REFERENCE), and the run's own numbers sit in a table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from paraxis.files.model_file import load_model_config
from paraxis.plan.cost import Estimate, evaluate
from paraxis.plan.hardware import build_cluster
from paraxis.show.report.plan import Plan
from paraxis.show.report.text import duration
from paraxis.show.viz.html import esc, figure, table
from paraxis.show.viz.pipeline import (
    ZERO_BUBBLE_PANELS,
    SimulatedSchedule,
    compare_schedules,
    mean_costs,
)
from paraxis.show.viz.style import figure_data_uri
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import Layout
from paraxis.spec.schedules import build_schedule

if TYPE_CHECKING:
    from paraxis.show.report.measured import MeasuredRun

REFERENCE = ("gpt2-1.5b", "a100-80gb")  # model and GPU of the pictures when the plan's don't
SEND_SHARE = 0.1  # the plan's own costs teach the lesson while a send is under 1/10 forward
NAMES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "interleaved 1F1B",
         "zb-h1": "ZB-H1", "zb-v": "ZB-V"}


@dataclass(frozen=True)
class StepCosts:
    """One microbatch on one whole stage (all its chunks)."""

    forward_s: float
    backward_s: float
    send_s: float  # one activation (or gradient) message between neighbouring stages


@dataclass(frozen=True)
class Lesson:
    stages: int
    microbatches: int
    costs: StepCosts
    costs_of: str  # whose costs the pictures are priced with
    shown: dict[str, SimulatedSchedule]  # per kind: what its panel shows


def priced_costs(estimate: Estimate, layout: Layout) -> StepCosts:
    """The planner's per-microbatch forward, backward (a recompute's rerun forward in it) and
    send of a pipelined plan, on its busiest stage (`cost.pipeline_time`)."""
    time, m = estimate.time, layout.microbatches
    send = time["pp_total"] / m / (2 * layout.virtual_stages)
    return StepCosts(time["forward"] / m, (time["compute"] - time["forward"]) / m, send)


def lesson_setting(plan: Plan) -> tuple[int, int, StepCosts, str]:
    """Stages, microbatches, costs and whose costs: M > P, a multiple of P (interleaving
    walks microbatches in groups of P), with sends small next to forwards."""
    stages = plan.layout.pp if plan.layout.pp > 1 else 4
    microbatches = stages * max(2, 8 // stages)
    if plan.layout.pp > 1:
        own = priced_costs(plan.estimate, plan.layout)
        if own.send_s <= SEND_SHARE * own.forward_s:
            return stages, microbatches, own, (
                f"{plan.cfg.name} on {plan.hardware.name}, priced by the planner")
    else:  # no pipeline in the plan: its own model split into stages, where that teaches
        layout = Layout(pp=stages, microbatches=microbatches, schedule="1f1b")
        try:
            layout.validate(stages, plan.cfg, microbatches, plan.seq_len)
        except ParaxisError:
            pass  # too few layers for the stages: the reference model below
        else:
            split = evaluate(plan.cfg, layout, plan.cluster.replace(nodes=1,
                                                                    gpus_per_node=stages),
                             plan.seq_len, microbatches)
            own = priced_costs(split, layout)
            if own.send_s <= SEND_SHARE * own.forward_s:
                return stages, microbatches, own, (
                    f"{plan.cfg.name} split into {stages} stages on {stages} x "
                    f"{plan.hardware.name}, priced by the planner")
    model, gpu = REFERENCE
    layout = Layout(pp=stages, microbatches=microbatches, schedule="1f1b")
    cfg = load_model_config(model)
    reference = evaluate(cfg, layout, build_cluster(gpu, stages), cfg.max_seq_len,
                         microbatches)
    return stages, microbatches, priced_costs(reference, layout), (
        f"{model} on {stages} x {gpu}, priced by the planner")


def pipeline_section(plan: Plan, run: MeasuredRun | None) -> tuple[str, Lesson]:
    stages, microbatches, costs, costs_of = lesson_setting(plan)
    fig, shown = compare_schedules(stages, microbatches, costs.forward_s, costs.backward_s,
                                   costs.send_s, virtual=max(plan.layout.virtual_stages, 2),
                                   cost_note=costs_of)
    lesson = Lesson(stages, microbatches, costs, costs_of, shown)
    gpipe, one, inter = (shown.get(k) for k in ("gpipe", "1f1b", "interleaved"))
    caption = (f"The same {stages} stages and {microbatches} microbatches under each schedule, "
               f"costs of {costs_of}: forward {duration(costs.forward_s)}, backward "
               f"{duration(costs.backward_s)}, one send {duration(costs.send_s)} per "
               f"microbatch. 1F1B holds {one.peak_in_flight} microbatches' activations where "
               f"GPipe holds {gpipe.peak_in_flight}, at the same bubble "
               f"({gpipe.bubble_fraction:.0%} and {one.bubble_fraction:.0%})")
    caption += (f"; interleaving {inter.virtual} chunks per stage shrinks the bubble to "
                f"{inter.bubble_fraction:.0%}." if inter else ".")
    parts = [figure(figure_data_uri(fig), "pipeline schedules", caption)]
    parts.append(_zero_bubble(stages, microbatches, costs, costs_of))
    parts.append(_what_the_run_used(plan, run, costs_of))
    return "".join(parts), lesson


def _zero_bubble(stages: int, microbatches: int, costs: StepCosts, costs_of: str) -> str:
    fig, shown = compare_schedules(stages, microbatches, costs.forward_s, costs.backward_s,
                                   costs.send_s, cost_note=costs_of, kinds=ZERO_BUBBLE_PANELS)
    one, h1, v = (shown[k] for k in ZERO_BUBBLE_PANELS)
    caption = (f"Splitting each backward in B (the input gradient the previous stage waits "
               f"for) and W (the weight gradients, half of it here) lets W fill the idle "
               f"slots: the bubble falls from {one.bubble_fraction:.0%} (1F1B) to "
               f"{h1.bubble_fraction:.0%} (ZB-H1) and {v.bubble_fraction:.0%} (ZB-V, two "
               f"chunks per stage). The price is memory: a microbatch keeps its activations "
               f"until its W, so every stage holds what 1F1B's first stage holds "
               f"({h1.peak_in_flight} microbatches; ZB-V {v.peak_in_flight} half-size "
               f"chunks).")
    return figure(figure_data_uri(fig), "zero-bubble schedules", caption)


def _what_the_run_used(plan: Plan, run: MeasuredRun | None, costs_of: str) -> str:
    layout = plan.layout
    if layout.pp == 1:
        return ("<p>This plan has no pipeline (pp=1): every rank runs the whole model, so "
                f"there is no bubble; the pictures above show a pipeline with the costs of "
                f"{esc(costs_of)}.</p>")
    own = priced_costs(plan.estimate, layout)
    schedule = build_schedule(layout.schedule, layout.pp, layout.microbatches,
                              layout.virtual_stages)
    timeline = schedule.simulate(own.forward_s, own.backward_s, own.send_s)
    in_flight = ("peak in flight (microbatches)" if layout.virtual_stages == 1 else
                 f"peak in flight (chunks of 1/{layout.virtual_stages} stage)")
    header = ["", "schedule", "microbatches", "forward", "backward", "send",
              "bubble (sends included)", in_flight]
    rows = [("this plan, priced", NAMES[layout.schedule], layout.microbatches,
             duration(own.forward_s), duration(own.backward_s), duration(own.send_s),
             f"{timeline.bubble_fraction:.0%}", max(schedule.peak_in_flight()))]
    if run is not None and run.events:
        forward, backward = mean_costs(run.events)
        rows.append(("this run, its trace", NAMES[run.schedule(layout)], run.microbatches,
                     duration(forward * run.virtual), duration(backward * run.virtual),
                     "-", f"{run.measured_bubble:.0%}", "-"))
    text = (f"<p>What this plan runs: {esc(NAMES[layout.schedule])} over {layout.pp} stages "
            f"with {layout.microbatches} microbatch(es) per step"
            + (", measured in the run's own trace (next section)" if len(rows) > 1 else "")
            + ".")
    if own.send_s > SEND_SHARE * own.forward_s:
        text += (f" Here a send ({duration(own.send_s)}) is not small next to a forward "
                 f"({duration(own.forward_s)}): the stages mostly wait on messages, where "
                 "the schedules differ little, so the picture above is priced for "
                 f"{esc(costs_of.split(',')[0])} instead.")
    return text + "</p>" + table(header, rows)
