"""Build the report: the plan from the shared inputs, then every section, then one page.

    report = build_report(PlanInputs(model="tiny", gpus=8, layout="dp=2,tp=2,pp=2",
                                     global_batch=16), run_dir="runs/demo/parallel")
    report.lesson.shown["interleaved"].bubble_fraction    # the numbers behind the pictures
    report.forecast.error                                 # forecast / measured - 1

The file needs no network to view: CSS is inline, pictures are data: URIs, there are no
scripts or web fonts. Every number comes from the planner, the schedules, the simulators or
the run's own files; this package only arranges them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from paraxis.plan.cost import Estimate, evaluate
from paraxis.plan.hardware import Cluster
from paraxis.plan.inputs import PlanInputs
from paraxis.plan.search import SearchResult, search
from paraxis.show.report.measured import Forecast, MeasuredRun, load_run, run_section
from paraxis.show.report.pictures import pictures
from paraxis.show.report.pipeline import Lesson, pipeline_section
from paraxis.show.report.text import defence_section, plan_section
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import ModelConfig
from paraxis.train.hardware import Hardware, choose_hardware


@dataclass
class Plan:
    inputs: PlanInputs
    hardware: Hardware
    cfg: ModelConfig
    cluster: Cluster
    seq_len: int
    layout: Layout
    estimate: Estimate
    search: SearchResult | None  # None when the search found nothing that fits
    chosen_by: str  # "planner", "user", or "auto" (the run's --layout auto picked it)

    @property
    def memory(self) -> dict[str, float]:
        """The planner's memory of the busiest stage, per device (`device_memory`)."""
        return self.device_memory(self.estimate)

    def device_memory(self, estimate: Estimate) -> dict[str, float]:
        """An estimate's memory per device; on a CPU its reserve is a rank's process baseline
        (interpreter, PyTorch, gloo), as `paraxis calibrate` measured it."""
        return dict(estimate.memory)


def make_plan(hardware: Hardware) -> Plan:
    """The plan for `hardware.inputs`: the given layout priced, else the planner's pick."""
    inputs = hardware.inputs
    cfg = inputs.model_config()
    cluster = inputs.cluster()
    precision = inputs.precision_rule()
    seq_len = inputs.sequence_length(cfg)
    try:
        result: SearchResult | None = search(cfg, cluster, seq_len, inputs.global_batch,
                                             precision=precision)
    except ParaxisError:
        result = None  # no layout satisfies the rules; a user layout may still be given
    if inputs.layout is not None:
        layout, chosen_by = Layout.parse(inputs.layout), "user"
    elif result and result.ranked:
        layout, chosen_by = result.ranked[0].layout, "planner"
    else:
        reason = "" if result is None else \
            f" ({len(result.too_big)} layouts priced, none fits in memory)"
        raise ParaxisError(f"the planner found no layout for {cfg.name} on "
                           f"{hardware.ranks(cluster.world_size)}{reason}; add GPUs or give "
                           "--layout")
    layout.validate(cluster.world_size, cfg, inputs.global_batch, seq_len)
    estimate = evaluate(cfg, layout, cluster, seq_len, inputs.global_batch, precision)
    return Plan(inputs, hardware, cfg, cluster, seq_len, layout, estimate, result, chosen_by)


@dataclass
class Report:
    title: str
    plan: Plan
    lesson: Lesson  # the pipeline pictures' numbers
    run: MeasuredRun | None
    forecast: Forecast | None  # the run's forecast next to its measurement
    sections: list[tuple[str, str, str]]  # (anchor, heading, HTML body)

    def html(self) -> str:
        from paraxis.show.viz.html import page

        return page(self.title, f"layout {self.plan.layout}; written by `paraxis report`",
                    self.sections)


def build_report(inputs: PlanInputs, run_dir: str | Path | None = None) -> Report:
    """Plan (or price the given layout), draw everything, and add the run in `run_dir` (its
    metrics.jsonl and optional *trace*.json) when given."""
    run = load_run(Path(run_dir)) if run_dir is not None else None
    if inputs.precision is None:  # a run computes in `paraxis train`'s default, fp32
        inputs = dataclasses.replace(inputs, precision="fp32" if run else "mixed")
    if inputs.gpus is None:  # as many as the layout given has ranks, else one
        gpus = Layout.parse(inputs.layout).world_size if inputs.layout else 1
        inputs = dataclasses.replace(inputs, gpus=gpus)
    world = inputs.gpus
    if inputs.layout is not None:  # a layout that cannot run fails before any calibration
        cfg = inputs.model_config()
        Layout.parse(inputs.layout).validate(world, cfg, inputs.global_batch,
                                             inputs.sequence_length(cfg))
    hardware = choose_hardware(inputs, run.folder if run else None, world,
                               inputs.model or "tiny")
    plan = make_plan(hardware)
    if run is not None and run.picked_step_s is not None and plan.chosen_by == "user":
        plan = dataclasses.replace(plan, chosen_by="auto")  # --layout auto picked it
    sections = [("plan", "Plan", plan_section(plan)),
                ("defence", "Defence", defence_section(plan))]
    lesson_html, lesson = pipeline_section(plan, run)
    sections += pictures(plan, ("pipeline", "Pipeline schedules", lesson_html), run)
    forecast = None
    if run is not None:
        body, forecast = run_section(plan, run)
        sections.append(("run", "Measured vs predicted", body))
    where = hardware.ranks(plan.cluster.world_size)
    return Report(f"paraxis report: {plan.cfg.name} on {where}", plan, lesson, run, forecast,
                  sections)


def write_report(out_path: str | Path = "report.html", model: str = "tiny", gpus: int = 1,
                 gpu: str | None = None, gpus_per_node: int | None = None,
                 seq_len: int | None = None,
                 global_batch: int = 16, layout: Layout | str | None = None,
                 run_dir: str | Path | None = None, hardware: str | None = None,
                 precision: str | None = None) -> Path:
    """`build_report` from keyword inputs, written to `out_path` (returned)."""
    inputs = PlanInputs(model=model, gpus=gpus, gpu=gpu, gpus_per_node=gpus_per_node,
                        hardware=hardware, precision=precision, seq_len=seq_len,
                        global_batch=global_batch,
                        layout=None if layout is None else str(layout))
    return save(build_report(inputs, run_dir), out_path)


def save(report: Report, out_path: str | Path) -> Path:
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report.html())
    return out
