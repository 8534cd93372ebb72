"""How a run ended, read from its own records: the steps it took against the steps asked,
its peak memory against the device's and how that peak grows, the loss and gradient norm at
the end, and the planner's memory forecast for its layout beside the measured peak.

Every sentence says where its number comes from: measured (the metrics file `paraxis train
--metrics-file` wrote, its config.toml and checkpoints), or the planner's forecast
(`cost.evaluate`). The last two name the likely cause and what to do.

    lines = diagnose_run(records, RunEnd(10_000, 3_500, "stop"), device, forecast)
    for label, sentence in lines: print(f"{label}: {sentence}")
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from paraxis.files.run_records import WARMUP_STEPS, steady_records
from paraxis.plan.cost import Estimate
from paraxis.show.report.text import size
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import RECOMPUTE, ZERO_STAGES, Layout
from paraxis.spec.model_config import ModelConfig

MIN_FIT_POINTS = 10  # fewer steps after the warm-up than this: no trend is fitted
# a peak that rises less than this share of the device over the steps fitted is flat: the
# allocator's rounding and a first evaluation or checkpoint move it that much
FLAT_SHARE = 0.02
NEAR_FULL = 0.10  # a peak within this share of the device leaves no room for a larger batch
TAIL_SHARE, TAIL_MIN = 0.01, 10  # "just before the end": the last 1% of steps, 10 at least
REFERENCE_STEPS = 200  # the steps before the tail that the end is compared with
# a value this many times the median of the reference steps is a spike: thresholds of this
# command's, well above a sound run's step-to-step noise and well below a blow-up before NaN
LOSS_SPIKE, GRAD_SPIKE = 1.5, 5.0


@dataclass(frozen=True)
class RunEnd:
    """What the run's folder says besides its records (None: not known)."""

    steps_asked: int | None  # its config.toml's [train] steps
    last_checkpoint: int | None  # steps done by its newest complete checkpoint
    on_nan: str | None  # "stop": a NaN step ends the run before it is recorded
    exit_after: int | None = None  # its config.toml's [checkpoint] exit_after
    saves: bool = True  # it was given a checkpoint folder

    def stopped_as_asked(self, records: list[dict]) -> bool:
        """Whether the run ended after the step its exit_after names, as asked."""
        return self.exit_after is not None and records[-1]["step"] + 1 == self.exit_after


@dataclass(frozen=True)
class Device:
    capacity_bytes: float  # one rank's memory
    source: str  # where that figure comes from, in words
    cpu: bool  # the measured peak is the process's resident set, PyTorch included
    priced_cpu: bool = True  # with `cpu`: the forecast is a CPU profile's too (not a GPU's)


@dataclass(frozen=True)
class MemoryForecast:
    layout: Layout
    hardware: str  # "128 x a100-80gb"
    estimate: Estimate
    options: list[tuple[str, Estimate]]  # the layout changed to hold less, each priced


@dataclass(frozen=True)
class MemoryTrend:
    """A least-squares line through the peak memory of steps first..last."""

    bytes_per_step: float
    intercept_bytes: float
    first_step: int
    last_step: int
    source: str  # whose peak: rank 0's, or the fullest rank's

    def at(self, step: float) -> float:
        return self.intercept_bytes + self.bytes_per_step * step

    def reaches(self, capacity_bytes: float) -> float | None:
        """The step where the line reaches `capacity_bytes` (None: it does not rise)."""
        if self.bytes_per_step <= 0:
            return None
        return (capacity_bytes - self.intercept_bytes) / self.bytes_per_step

    def flat(self, capacity_bytes: float) -> bool:
        return self.bytes_per_step * (self.last_step - self.first_step) < (
            FLAT_SHARE * capacity_bytes)


def peak(record: dict) -> float | None:
    """A record's peak memory: every rank's largest where it was gathered, else rank 0's."""
    return record.get("peak_mem_bytes_max_rank", record.get("peak_mem_bytes"))


def memory_trend(records: list[dict]) -> MemoryTrend | None:
    """The fitted peak over the steps after the warm-up: the fullest rank's where enough
    logging steps gathered it, else rank 0's of every step; None with too few steps."""
    steady = steady_records(records)
    fullest = [(r["step"], r["peak_mem_bytes_max_rank"]) for r in steady
               if r.get("peak_mem_bytes_max_rank") is not None]
    source = "the fullest rank's peak (gathered on logging steps)"
    if len(fullest) < MIN_FIT_POINTS:
        fullest = [(r["step"], r["peak_mem_bytes"]) for r in steady
                   if r.get("peak_mem_bytes") is not None]
        source = "rank 0's peak"
    steps = [step for step, _ in fullest]
    if len(fullest) < MIN_FIT_POINTS or len(set(steps)) < 2:
        return None
    # ordinary least squares (Legendre 1805): the line nearest every point in squared bytes
    slope, intercept = statistics.linear_regression(steps, [value for _, value in fullest])
    return MemoryTrend(slope, intercept, steps[0], steps[-1], source)


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value)


def _median(records: list[dict], key: str) -> float | None:
    values = [r[key] for r in records if _finite(r.get(key))]
    return statistics.median(values) if values else None


@dataclass(frozen=True)
class Numerics:
    """The loss and gradient norm just before the end, against the steps before that."""

    first_bad: dict | None  # the first record whose loss or gradient norm is not finite
    skipped: int  # steps the run skipped (--on-nan skip, fp16 overflows)
    tail: list[dict]
    reference_steps: int  # the steps before the tail the medians are over
    loss_median: float | None  # over the reference steps
    grad_median: float | None
    loss_spike: dict | None  # the tail's record of highest loss, where it is a spike
    grad_spike: dict | None

    @property
    def reference(self) -> bool:
        return self.loss_median is not None or self.grad_median is not None

    def events(self) -> list[tuple[int, str]]:
        """What went wrong near the end, in step order: spikes, and the first value that is
        not finite."""
        found = []
        for name, key, spike, median in (
                ("gradient norm", "grad_norm", self.grad_spike, self.grad_median),
                ("loss", "loss", self.loss_spike, self.loss_median)):
            if spike is not None and median:
                found.append((spike["step"], f"the {name} spiked to {_number(spike[key])} at "
                                             f"step {spike['step']:,}, {spike[key] / median:.1f}x"
                                             " its median before"))
        if self.first_bad is not None:
            bad = self.first_bad
            name, key = (("loss", "loss") if not _finite(bad.get("loss"))
                         else ("gradient norm", "grad_norm"))
            found.append((bad["step"], f"the {name} turned {_number(bad.get(key, math.nan))} "
                                       f"at step {bad['step']:,}"))
        return sorted(found)


def numerics(records: list[dict]) -> Numerics:
    tail_size = max(TAIL_MIN, round(TAIL_SHARE * len(records)))
    if len(records) > tail_size + WARMUP_STEPS:
        tail, before = records[-tail_size:], steady_records(records)[:-tail_size][
            -REFERENCE_STEPS:]
    else:  # a short run: its first steps, from the initial weights, are the reference
        split = max(1, len(records) - tail_size)
        tail, before = records[split:], records[:split]
    loss_median, grad_median = _median(before, "loss"), _median(before, "grad_norm")

    def spike(key: str, median: float | None, ratio: float) -> dict | None:
        finite = [r for r in tail if _finite(r.get(key))]
        if median is None or not finite or median <= 0:
            return None
        top = max(finite, key=lambda r: r[key])
        return top if top[key] > ratio * median else None

    def sound(record: dict) -> bool:
        return _finite(record.get("loss")) and (
            "grad_norm" not in record or _finite(record["grad_norm"]))

    # where the steps that are not finite run on to the end, the first of them; else the
    # first in the tail (one skipped long before the end is not how the run ended)
    streak = len(records)
    while streak and not sound(records[streak - 1]):
        streak -= 1
    bad = records[streak] if streak < len(records) else next(
        (r for r in tail if not sound(r)), None)
    return Numerics(bad, sum(1 for r in records if r.get("skipped")), tail, len(before),
                    loss_median, grad_median, spike("loss", loss_median, LOSS_SPIKE),
                    spike("grad_norm", grad_median, GRAD_SPIKE))


def _number(value: float) -> str:
    return f"{value:.4g}" if math.isfinite(value) else str(value).replace("nan", "NaN")


def steps_sentence(records: list[dict], end: RunEnd) -> tuple[str, bool | None]:
    """(the steps recorded against those asked, whether the run stopped early: None where
    the steps asked are not known)."""
    first, last = records[0]["step"], records[-1]["step"]
    recorded = f"{first:,} to {last:,} ({len(records):,} records) are in the metrics file"
    if end.steps_asked is None:
        return (f"{recorded} (measured); no config.toml beside it says how many were asked "
                "for.", None)
    early = last + 1 < end.steps_asked
    said = (f"{recorded}, of the {end.steps_asked:,} its config.toml asks for "
            f"(measured): {'it stopped early' if early else 'it finished'}")
    if end.stopped_as_asked(records):
        said = (f"{recorded}, of the {end.steps_asked:,} its config.toml asks for (measured): "
                f"it stopped after step {end.exit_after:,}, where its exit_after asks")
    if early and end.last_checkpoint is not None:
        said += (f"; its newest checkpoint holds {end.last_checkpoint:,} steps done (`paraxis "
                 "train --resume auto` continues from there)")
    elif early:
        said += ("; it left no checkpoint in its checkpoint folder" if end.saves else
                 "; it saved no checkpoints (no --checkpoint-dir)")
    return said + ".", early


def headroom_sentence(records: list[dict], device: Device) -> str:
    top = max(records, key=lambda r: peak(r) or 0)
    value = peak(top) or 0
    ranks = top.get("peak_mem_bytes_by_rank")
    who = (f"the fullest rank, rank {ranks.index(max(ranks))} of {len(ranks)}," if ranks
           and len(ranks) > 1 else "rank 0")
    what = ("the process's resident set, PyTorch included" if device.cpu
            else "the allocator's peak")
    left = device.capacity_bytes - value
    return (f"{who} peaked at {size(value)} at step {top['step']:,} (measured: {what}), "
            f"against {size(device.capacity_bytes)} per {'rank' if device.cpu else 'GPU'} "
            f"({device.source}): {size(max(left, 0))} ({max(left, 0) / device.capacity_bytes:.0%}"
            f") left{'' if left >= 0 else f', {size(-left)} over'}.")


def trend_sentence(trend: MemoryTrend | None, records: list[dict], device: Device) -> str:
    if trend is None:
        steady = len(steady_records(records))
        return (f"{steady} step(s) after the warm-up are too few to fit a trend "
                f"({MIN_FIT_POINTS} at least).")
    per_1000 = trend.bytes_per_step * 1000
    sign = "rises" if per_1000 >= 0 else "falls"
    said = (f"a least-squares line through {trend.source} over steps {trend.first_step:,} to "
            f"{trend.last_step:,} (measured) {sign} {size(abs(per_1000))} per 1,000 steps, from "
            f"{size(trend.at(trend.first_step))} to {size(trend.at(trend.last_step))}")
    reach = trend.reaches(device.capacity_bytes)
    if trend.flat(device.capacity_bytes):
        return (f"{said}: flat (under {FLAT_SHARE:.0%} of the device over those steps).")
    if reach is None:
        return said + "."
    return (f"{said}; at that rate it reaches the {size(device.capacity_bytes)} of the "
            f"device at step {math.ceil(reach):,}.")


def forecast_sentence(forecast: MemoryForecast, records: list[dict], device: Device) -> str:
    memory = forecast.estimate.memory
    parts = ", ".join(f"{name} {size(memory[name])}" for name in (
        "params", "grads", "optimizer", "activations", "buffers") if memory.get(name))
    reserved = memory.get("reserved", 0.0)
    # a GPU's allocator peak leaves out the CUDA context the planner reserves; a CPU rank's
    # resident set holds the process baseline a CPU profile reserves
    if device.cpu and device.priced_cpu:
        compared = memory["total"]
        what = (f"in all per rank ({parts}, and {size(reserved)} for the process itself: "
                "the profile's baseline)")
    else:
        compared = memory["total"] - reserved
        what = (f"of tensors per GPU ({parts}; {size(reserved)} more is reserved for the "
                "CUDA context, which the allocator's peak leaves out)")
    steps = {r["step"]: peak(r) for r in (steady_records(records)[0], records[-1]) if peak(r)}
    if device.cpu and not device.priced_cpu:  # a resident set against a GPU's tensors
        against = ", ".join(f"{size(value)} at step {step:,}" for step, value in steps.items())
        against = (f"{against} (a CPU run's resident set, not comparable with a GPU's "
                   "forecast: give --hardware, a CPU profile of `paraxis calibrate`, to "
                   "compare)") if against else ""
    else:
        against = ", ".join(f"{size(value)} at step {step:,} ({value / compared:.2f}x the "
                            "forecast)" for step, value in steps.items())
    return (f"the planner forecasts {size(compared)} {what} on the fullest stage of "
            f"{forecast.layout} on {forecast.hardware}; measured: "
            f"{against or 'no peak recorded'}.")


def numerics_sentence(found: Numerics, last: dict) -> str:
    loss, grad = last.get("loss", math.nan), last.get("grad_norm")
    said = f"at the last step, {last['step']:,}, the loss is {_number(loss)}"
    if grad is not None:
        said += f" and the gradient norm {_number(grad)}"
    said += " (measured)"
    if found.reference:
        loss_median, grad_median = (_number(m if m is not None else math.nan)
                                    for m in (found.loss_median, found.grad_median))
        said += (f"; the last {len(found.tail)} steps against the median of the "
                 f"{found.reference_steps} before them (loss {loss_median}, gradient norm "
                 f"{grad_median}; a spike is over {LOSS_SPIKE:g}x and {GRAD_SPIKE:g}x)")
    notes = [text for _, text in found.events()]
    if found.skipped:
        notes.append(f"{found.skipped} step(s) were skipped")
    if notes:
        return f"{said}: {'; '.join(notes)}."
    return f"{said}: all finite, no spike." if found.reference else f"{said}: all finite."


def signed_size(value: float) -> str:
    return ("+" if value >= 0 else "-") + size(abs(value))


def option_text(options: list[tuple[str, Estimate]], base: Estimate) -> str:
    """The layout's lighter variants, each as the planner prices it."""
    return "; ".join(
        f"{name}: {size(e.memory['total'])} "
        f"({signed_size(e.memory['total'] - base.memory['total'])}, step "
        f"{e.step_time_s / base.step_time_s - 1:+.1%})" for name, e in options)


def lighter_layouts(layout: Layout, cfg: ModelConfig, global_batch: int, seq_len: int
                    ) -> list[tuple[str, Layout]]:
    """The layout with one change that holds less memory, where the rules allow it: the
    next recomputation, the next ZeRO stage, half the micro-batch."""
    options = []
    if layout.recompute != RECOMPUTE[-1]:
        heavier = RECOMPUTE[RECOMPUTE.index(layout.recompute) + 1]
        options.append((f"recompute={heavier}", layout.replace(recompute=heavier)))
    if layout.zero < ZERO_STAGES[-1] and layout.zero_ranks > 1:
        options.append((f"zero={layout.zero + 1}", layout.replace(zero=layout.zero + 1)))
    micro_batch = global_batch // (layout.dp * layout.microbatches)
    if micro_batch % 2 == 0:
        options.append((f"micro-batch {micro_batch // 2} (microbatches="
                        f"{2 * layout.microbatches})",
                        layout.replace(microbatches=2 * layout.microbatches)))
    kept = []
    for name, option in options:
        try:
            kept.append((name, option.validate(layout.world_size, cfg, global_batch, seq_len)))
        except ParaxisError:
            continue  # a rule of the layout forbids this change (its message is not needed)
    return kept


def numeric_cause(found: Numerics, end: RunEnd, early: bool | None) -> tuple[str, str]:
    story = ", then ".join(text for _, text in found.events())
    hidden = ("; under --on-nan stop the step that turns NaN ends the run before it is "
              "recorded, so the end may be that step" if end.on_nan == "stop"
              and found.first_bad is None and early is not False else "")
    ended = "; memory is not what ended it" if early is not False else ""
    resume = (f"resume from the checkpoint of {end.last_checkpoint:,} steps"
              if end.last_checkpoint is not None else "restart")
    return (f"the training diverged: {story}{hidden}{ended}.",
            f"{resume} with a lower --lr or a longer --warmup, keep --grad-clip, and under "
            "fp16 switch to bf16; --on-nan skip drops a rare bad batch instead of stopping.")


HEADROOM = ("activation memory grows with the micro-batch and the sequence, so raise "
            "recompute or lower the micro-batch, and a higher ZeRO stage shards the model "
            "states")


def memory_cause(records: list[dict], device: Device, trend: MemoryTrend | None,
                 early: bool | None, forecast: MemoryForecast | None) -> tuple[str, str] | None:
    """Out of memory, where the peak reaches the device by the end or sits near it."""
    top = max((peak(r) or 0) for r in records)
    capacity = device.capacity_bytes
    near = top >= (1 - NEAR_FULL) * capacity
    reach = trend.reaches(capacity) if trend is not None else None
    lighter = ""
    if forecast is not None and forecast.options:
        lighter = (f". The planner prices this layout holding less (per "
                   f"{'rank' if device.cpu else 'GPU'}, step time against "
                   f"{forecast.estimate.step_time_s:.3g} s): "
                   f"{option_text(forecast.options, forecast.estimate)}")
    last = records[-1]["step"]
    if (trend is not None and reach is not None and not trend.flat(capacity)
            and (near or early and reach <= 1.1 * (last + 1))):
        return (f"out of memory: the peak grows {size(trend.bytes_per_step * 1000)} per 1,000 "
                "steps though every step has the same shapes, and reaches the device's "
                f"{size(capacity)} at step {math.ceil(reach):,}"
                f"{', where the run ended' if early else ''}. Something outlives its step (a "
                "tensor kept with its graph, such as a loss appended without .item(), or a "
                "growing cache), or the allocator fragments.",
                "find what holds the memory (torch.cuda.memory._record_memory_history, then a "
                "snapshot; PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True against "
                f"fragmentation) and buy headroom meanwhile: {HEADROOM}{lighter}.")
    if near:
        return (f"out of memory: the peak sits within {NEAR_FULL:.0%} of the device's "
                f"{size(capacity)}, so one larger allocation on top (a longer batch, an "
                "evaluation, a checkpoint save) tips it over.",
                f"buy headroom: {HEADROOM}{lighter}.")
    return None


def cause(records: list[dict], end: RunEnd, device: Device, trend: MemoryTrend | None,
          found: Numerics, early: bool | None, forecast: MemoryForecast | None
          ) -> tuple[str, str]:
    """(the likely cause, what to do): numerics first (a diverged run ends whatever its
    memory), then memory, then the run's end itself."""
    if found.events():
        return numeric_cause(found, end, early)
    memory = memory_cause(records, device, trend, early, forecast)
    if memory is not None:
        return memory
    if early is None:
        return ("none in these records: memory stays clear of the device's and the loss and "
                "gradient norm are sound; whether the run took every step asked is not known "
                "without its config.toml.",
                "nothing to fix in these records; if the run ended early, read the launcher's "
                "log.")
    if not early:
        return ("none: the run finished its steps, with memory and numerics as above.",
                "nothing to fix here.")
    if end.stopped_as_asked(records):
        return (f"none: the run stopped after step {end.exit_after:,} as its exit_after asks, "
                "with memory and numerics as above.",
                f"`paraxis train --resume auto` runs on to step {end.steps_asked:,}.")
    stop = end.on_nan == "stop"  # the step that is not finite ends the run unrecorded
    return ("outside these records: memory stays clear of the device's and the loss and "
            "gradient norm are sound up to the last step recorded, so the process was ended "
            "from outside (a lost node, an NCCL timeout, preemption, a job's time limit)"
            + (", or the next step's loss or gradient norm was not finite and --on-nan stop "
               "ended the run before recording it" if stop else "") + ".",
            "read the launcher's and the scheduler's log for that time"
            + (" (paraxis's last line there names a step that was not finite)" if stop else "")
            + ", then resume with `paraxis train --resume auto`.")


def diagnose_run(records: list[dict], end: RunEnd, device: Device,
                 forecast: MemoryForecast | None) -> list[tuple[str, str]]:
    """(label, sentence) pairs, the likely cause and what to do last."""
    steps, early = steps_sentence(records, end)
    trend = memory_trend(records)
    found = numerics(records)
    lines = [("Steps", steps), ("Memory headroom", headroom_sentence(records, device)),
             ("Memory growth", trend_sentence(trend, records, device))]
    lines.append(("Forecast", forecast_sentence(forecast, records, device) if forecast else
                  "none: the run's layout is not known (no config.toml beside its metrics); "
                  "give --model and --layout to price it."))
    lines.append(("Loss and gradient norm", numerics_sentence(found, records[-1])))
    reason, fix = cause(records, end, device, trend, found, early, forecast)
    lines += [("Likely cause", reason), ("What to do", fix)]
    return lines
