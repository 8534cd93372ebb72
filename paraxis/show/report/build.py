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

from paraxis.plan.inputs import PlanInputs
from paraxis.show.report.measured import Forecast, MeasuredRun, load_run, run_section
from paraxis.show.report.pictures import pictures
from paraxis.show.report.pipeline import Lesson, pipeline_section
from paraxis.show.report.plan import Plan, make_plan
from paraxis.show.report.text import defence_section, plan_section
from paraxis.show.viz.html import page
from paraxis.spec.layout import Layout
from paraxis.train.run_hardware import Hardware, choose_hardware


@dataclass
class Report:
    title: str
    plan: Plan
    lesson: Lesson  # the pipeline pictures' numbers
    run: MeasuredRun | None
    forecast: Forecast | None  # the run's forecast next to its measurement
    sections: list[tuple[str, str, str]]  # (anchor, heading, HTML body)

    def html(self) -> str:
        return page(self.title, f"layout {self.plan.layout}; written by `paraxis report`",
                    self.sections)


def build_report(inputs: PlanInputs, run_dir: str | Path | None = None) -> Report:
    """Plan (or price the given layout), draw everything, and add the run in `run_dir` (its
    metrics.jsonl and optional *trace*.json) when given."""
    run = load_run(Path(run_dir)) if run_dir is not None else None
    plan, hardware = report_plan(inputs, run)
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


def report_plan(inputs: PlanInputs, run: MeasuredRun | None = None) -> tuple[Plan, Hardware]:
    """The plan a report of `inputs` (and of `run`, when given) draws, and the hardware it is
    priced on."""
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
    return plan, hardware


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
