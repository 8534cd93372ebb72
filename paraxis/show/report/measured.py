"""The run next to its forecast: step time, throughput, memory, and the measured trace.

Measured figures come from the run's folder (metrics.jsonl from `paraxis train
--metrics-file`, and a pipeline run's trace.json); forecast ones from the planner's
`Estimate` on the hardware the run ran on (`paraxis.train.run_hardware`).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from paraxis.files.host_steal import DISTURBED_STEAL
from paraxis.files.run_records import (
    DISTURBED_SPREAD,
    found_beside,
    load_metrics,
    spread,
    steady,
    steal,
)
from paraxis.files.trace import load_trace, to_chrome_trace
from paraxis.plan.compute import mfu
from paraxis.plan.cost import PREDICTION_TOLERANCE
from paraxis.show.report.plan import Plan
from paraxis.show.report.text import duration, size, times
from paraxis.show.viz.html import esc, figure, table
from paraxis.show.viz.pipeline import measured_bubble, predicted_vs_measured
from paraxis.show.viz.run import plot_run
from paraxis.show.viz.style import figure_data_uri
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import Layout
from paraxis.train.calibrate.quick import calibration_steal

if TYPE_CHECKING:
    from paraxis.train.run_hardware import Hardware


@dataclass
class MeasuredRun:
    folder: Path
    records: list[dict]  # one per step, from the metrics file
    trace_path: Path | None
    events: list[dict]  # the pipeline executor's trace; empty without one
    metrics_file: Path  # where `records` came from

    @property
    def virtual(self) -> int:
        return max((e["chunk"] for e in self.events), default=0) + 1

    @property
    def microbatches(self) -> int:
        return max((e["microbatch"] for e in self.events), default=0) + 1

    @property
    def measured_bubble(self) -> float:
        return measured_bubble(self.events)

    @property
    def picked_step_s(self) -> float | None:
        """The step time `--layout auto` predicted when it picked the run's layout (each
        metrics record carries it), or None for a layout given by hand."""
        return next((r["predicted_step_s"] for r in self.records
                     if r.get("predicted_step_s") is not None), None)

    def schedule(self, layout: Layout) -> str:
        """The schedule the trace ran: the layout's, or interleaved if it has chunks."""
        return layout.schedule if self.virtual == 1 or layout.schedule == "interleaved" \
            else "interleaved"


@dataclass(frozen=True)
class Forecast:
    """The planner's step time for the run, and the run's own (steady-state medians)."""

    hardware: str  # what it was priced for
    predicted_step_s: float
    measured_step_s: float
    spread: float = 0.0  # of the measured steps (run_records.spread)
    steal: float | None = None  # CPU time a VM's host took during the steps (host_steal.py)
    calibration_steal: float | None = None  # ... during the profile's timings, at most

    @property
    def error(self) -> float:
        return self.predicted_step_s / self.measured_step_s - 1

    @property
    def disturbed(self) -> bool:
        """Whether other load shared the machine while the run ran, or while the profile
        it is priced on was timed (run_records, paraxis/files/host_steal.py)."""
        return bool(self._reasons())

    def _reasons(self, brief: bool = False) -> list[str]:
        reasons = []
        if self.spread > DISTURBED_SPREAD:
            reasons.append(f"steps spread {self.spread:.0%}" if brief else
                           f"the run's steps spread widely (interquartile range "
                           f"{self.spread:.0%} of the median)")
        if self.steal is not None and self.steal > DISTURBED_STEAL:
            reasons.append(f"the VM's host took {self.steal:.0%} of the CPU in the run"
                           if brief else f"the virtual machine's host took {self.steal:.0%} "
                           "of its CPU time during the run's steps")
        if self.calibration_steal is not None and self.calibration_steal > DISTURBED_STEAL:
            reasons.append(f"{self.calibration_steal:.0%} while the profile was timed"
                           if brief else f"the host took {self.calibration_steal:.0%} of the "
                           "CPU time while the profile was timed")
        return reasons

    def brief(self) -> str:
        """The caveat in a few words, for a console line ("" for an undisturbed run)."""
        reasons = self._reasons(brief=True)
        return f"other load shared the machine ({', '.join(reasons)})" if reasons else ""

    def caveat(self) -> str:
        """A sentence for a disturbed run ("" otherwise)."""
        reasons = self._reasons()
        if not reasons:
            return ""
        said = "; ".join(reasons)
        return (f"{said[0].upper()}{said[1:]}: other load shared this machine, so the "
                "measured step, or the prices, are not this layout's alone; run it again on "
                "a quiet machine to compare.")


def metrics_path(run: Path) -> Path:
    """A run given as its folder (its metrics.jsonl) or as its --metrics-file itself."""
    return run if run.is_file() else run / "metrics.jsonl"


def load_run(run: Path) -> MeasuredRun:
    """The run `paraxis train --metrics-file` wrote: that file (or a folder's metrics.jsonl),
    with the trace.json and config.toml the run wrote beside it (`run_records.beside`;
    in a folder of its own, any *trace*.json there)."""
    if not run.exists():
        raise ParaxisError(f"--run {run} does not exist; give the metrics file a run wrote "
                           "(`paraxis train --metrics-file FILE`) or its folder")
    metrics = metrics_path(run)
    if not metrics.is_file():
        raise ParaxisError(f"{run} has no metrics.jsonl; give the metrics file a run wrote "
                           "(`paraxis train --metrics-file FILE`) or its folder")
    folder = metrics.parent
    trace = found_beside(metrics, "trace.json")
    if trace is None and metrics.name == "metrics.jsonl":  # a run's own folder: any trace
        traces = sorted(folder.glob("*trace*.json"))
        trace = traces[0] if traces else None
    return MeasuredRun(folder, load_metrics(metrics), trace,
                       load_trace(trace) if trace else [], metrics)


def _picked(run: MeasuredRun, forecast: Forecast) -> str:
    """What --layout auto predicted when it picked the layout, beside the forecast here."""
    if run.picked_step_s is None:
        return ""
    error = run.picked_step_s / forecast.measured_step_s - 1
    return (f"When the run started, --layout auto picked this layout predicting "
            f"{duration(run.picked_step_s)} ({error:+.0%} off), on the profile timed before "
            "the run; the forecast here prices the means of its timings before and after "
            "the run. ")


def run_section(plan: Plan, run: MeasuredRun) -> tuple[str, Forecast]:
    e, gpu, hw = plan.estimate, plan.cluster.gpu, plan.hardware
    records = run.records
    measured_tps = steady(records, "tokens_per_s")
    measured_mem = max(r.get("peak_mem_bytes", 0) for r in records)
    measured_mfu = mfu(plan.cfg, plan.seq_len, measured_tps, plan.cluster.world_size,
                       gpu.peak_flops)
    label = hw.ranks(plan.cluster.world_size)
    forecast = Forecast(label, e.step_time_s, steady(records, "step_time_s"),
                        spread(records, "step_time_s"), steal(records),
                        calibration_steal(hw.inputs.hardware) if hw.cpu else None)
    error = forecast.error
    memory = plan.memory["total"]
    parts = [
        f"<p>From <code>{esc(run.metrics_file)}</code>: {len(records)} steps "
        f"(medians skip the first steps' warm-up). Forecast for {esc(label)}, the hardware "
        f"the run ran on, {_priced(hw)}.{_host(forecast)}</p>",
        f"<p class=\"callout\">Step time: predicted {duration(e.step_time_s)}, measured "
        f"{duration(forecast.measured_step_s)}: the prediction is {error:+.0%} off "
        f"({'within' if abs(error) <= PREDICTION_TOLERANCE else 'outside'} "
        f"{PREDICTION_TOLERANCE:.0%}). {_picked(run, forecast)}{forecast.caveat()}</p>",
        table(["", "predicted", "measured", "measured vs predicted"], [
            ("throughput (tokens/s)", f"{e.tokens_per_s:,.0f}", f"{measured_tps:,.0f}",
             times(measured_tps / e.tokens_per_s, "faster", "slower")),
            ("step time", duration(e.step_time_s), duration(forecast.measured_step_s),
             times(forecast.measured_step_s / e.step_time_s, "longer", "shorter")),
            (f"MFU (of {gpu.name} peak)", f"{e.mfu:.1%}", f"{measured_mfu:.1%}", "-"),
            (f"peak memory per {hw.device}", size(memory),
             size(measured_mem) if measured_mem else "not recorded",
             times(measured_mem / memory, "more", "less") if measured_mem else "-"),
            ("loss, first -> last step", "-",
             f"{records[0]['loss']:.3f} -> {records[-1]['loss']:.3f}", "-")]),
        figure(figure_data_uri(plot_run(records, e.tokens_per_s, label, memory, hw.device)),
               "run metrics", "Measured on every step (peak memory: rank 0"
               + ("; on a CPU the process's resident set, which also holds PyTorch itself, "
                  "where the planner counts tensors" if hw.cpu else "")
               + ") against the planner's forecast."),
    ]
    parts.append(_trace(plan, run))
    return "".join(parts), forecast


def _trace(plan: Plan, run: MeasuredRun) -> str:
    if run.trace_path is None:
        return ("<p class=\"muted\">No trace in the run folder (a file named *trace*.json): "
                "no measured timeline.</p>")
    fig, predicted, measured = predicted_vs_measured(
        run.events, run.schedule(plan.layout), run.microbatches, run.virtual)
    chrome = base64.b64encode(json.dumps(to_chrome_trace(run.events)).encode()).decode("ascii")
    name = run.trace_path.name
    return (figure(figure_data_uri(fig), "predicted vs measured timeline",
                   f"{name}: bubble predicted {predicted:.0%}, measured {measured:.0%}. "
                   "The predicted panel is the run's own schedule simulated with the trace's "
                   "mean forward and backward; what it does not explain is messages, waiting "
                   "and launch overheads.")
            + f'<p><a download="{esc(run.trace_path.stem)}.chrome.json" '
              f'href="data:application/json;base64,{chrome}">Save this trace as Chrome '
              "trace JSON</a> (open it in chrome://tracing or the Perfetto UI).</p>")


def _host(forecast: Forecast) -> str:
    """A sentence on the CPU time a VM's host took, where it was measured
    (paraxis/files/host_steal.py)."""
    if forecast.steal is None:
        return ""
    timed = ("" if forecast.calibration_steal is None else
             f", and at most {forecast.calibration_steal:.0%} while the profile was timed")
    return (f" A virtual machine's host took {forecast.steal:.0%} of its CPU time during the "
            f"run's steps{timed} (above {DISTURBED_STEAL:.0%} a run or a profile counts as "
            "disturbed).")


def _priced(hw: Hardware) -> str:
    """Where the forecast's prices come from, as HTML."""
    if hw.inputs.hardware:
        return (f"as calibrated in <code>{esc(hw.inputs.hardware)}</code>: "
                f"{esc(hw.source)}")
    return f"from {esc(hw.source)}"
