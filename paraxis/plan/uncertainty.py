"""How far a prediction can be trusted: the validated error band, ties within it, and the
hardware parameter that would decide a tie.

A step time is only as good as the cost model behind it. Its error was measured against
published runs it was never fitted on (GPUs: `python -m validation`, docs/validation.md, per
GPU) and against runs on this machine (CPU ranks: `python -m bench.predicted_vs_measured`,
docs/benchmarks.md). The root-mean-square relative error of those comparisons is the band
every prediction carries; two layouts whose predicted times differ by less than it are a tie
the model cannot break, and the defence says so, with the parameter (and by how much it
would have to differ from the preset) that would reorder them. tests/test_plan_uncertainty.py
recomputes both figures from their sources, so they cannot drift from the data.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import NamedTuple

from paraxis.plan.cost import Estimate
from paraxis.plan.hardware import Cluster
from paraxis.plan.hardware_values import FRACTIONS


class ErrorBand(NamedTuple):
    rms: float  # root-mean-square relative error of the validated predictions
    largest: float  # the largest relative error among them
    runs: int
    source: str
    fitted: bool = False  # the runs are those the model was fitted on: a fit error, not a test
    held_out: str = ""  # the GPU whose published, never-fitted runs these are ("": measured)

    @property
    def name(self) -> str:
        """What the band is, said plainly."""
        return ("fit error" if self.fitted else "held-out error" if self.held_out
                else "validated error")

    @property
    def over(self) -> str:
        if self.fitted:
            return f"RMS error over the {self.runs} runs it was fitted on"
        if self.held_out:
            return f"RMS error over {self.runs} published {self.held_out} runs never fitted"
        return f"RMS error over {self.runs} measured runs"


# Published GPU runs (docs/validation.md): rows of Narayanan 2021 and Korthikanti 2022.
GPU_BAND = ErrorBand(0.056, 0.103, 25, "docs/validation.md, python -m validation",
                     fitted=True)
# Published GPU runs held out from every fit (docs/validation.md, validation/heldout_runs.py:
# torchtitan, llm-foundry, BLOOM, FlashAttention, Llama 3, NeMo AutoModel, NVIDIA's DGX Cloud
# recipes; the FP8 rows,
# accounted apart, are not in it): what the model does on runs it never saw (recomputed by
# `python -m validation`; the largest errors left are runs whose sources do not state their
# kernel: Llama 3, NeMo AutoModel).
HELD_OUT_GPU_BAND = ErrorBand(0.104, 0.387, 275, "held-out rows of docs/validation.md",
                              held_out="GPU")
# The memory forecast against measured peaks (docs/planner.md: the one-GPU compiled steps of
# bench.gpu on an H200 within 1.4% of the forecast less its reserve): a layout that leaves
# less free is as likely to overflow as not, whatever the ranking says.
MEMORY_BAND = 0.014
# The same rows by GPU: a prediction carries the band of the GPU it is asked about (the A100
# rows come out 5.5% too slow on average, the H100 rows 0.9%: their errors differ).
HELD_OUT_BY_GPU = {
    "a100": ErrorBand(0.094, 0.284, 153, "held-out A100 rows of docs/validation.md",
                      held_out="A100"),
    "h100": ErrorBand(0.115, 0.387, 122, "held-out H100 rows of docs/validation.md",
                      held_out="H100"),
}
# This machine's CPU ranks (docs/benchmarks.json, section "predicted"): 84 layouts on a 2-core
# AMD EPYC VM whose host took none of the CPU time (paraxis/files/host_steal.py);
# docs/benchmarks.md says how the band moves between machines.
CPU_BAND = ErrorBand(0.097, 0.228, 84, "docs/benchmarks.md, python -m bench.predicted_vs_measured")


def gpu_family(name: str) -> str:
    """"h100-sxm-80gb" -> "h100": the chip, whatever its memory or form factor."""
    return name.split("-")[0].lower()


def error_band(cluster: Cluster) -> ErrorBand:
    """The band a prediction for `cluster` carries: this machine's CPU ranks' measured error,
    or the error on published runs of its GPU the model was never fitted on (of every GPU
    where none are of its kind). The fit's own error (`GPU_BAND`) is smaller and says less."""
    if cluster.cores_per_node:
        return CPU_BAND
    return HELD_OUT_BY_GPU.get(gpu_family(cluster.gpu.name), HELD_OUT_GPU_BAND)


def step_range(estimate: Estimate, band: ErrorBand) -> tuple[float, float]:
    """The step time's validated range, predicted x (1 -/+ rms)."""
    return estimate.step_time_s * (1 - band.rms), estimate.step_time_s * (1 + band.rms)


def ties(best: Estimate, ranked: list[Estimate], band: ErrorBand) -> list[Estimate]:
    """The layouts (after `best`) predicted within the band of it: a tie for the model."""
    return [e for e in ranked if e is not best
            and e.step_time_s <= best.step_time_s * (1 + band.rms)]


# The hardware parameters a tie may hinge on: (where it lives, field, what it means).
PARAMETERS = (
    ("gpu", "matmul_efficiency", "GEMM efficiency"),
    ("gpu", "nvlink_bandwidth_Bps", "NVLink bandwidth"),
    ("cluster", "inter_node_bandwidth_Bps", "network bandwidth per GPU"),
    ("gpu", "link_efficiency", "achieved share of link bandwidth"),
    ("gpu", "hbm_efficiency", "achieved share of HBM bandwidth"),
)


SEARCH_RANGE = (2 / 3, 3 / 2)


def _scaled(cluster: Cluster, where: str, name: str, factor: float) -> Cluster:
    if where == "gpu":
        value = getattr(cluster.gpu, name) * factor
        return cluster.replace(gpu=dataclasses.replace(cluster.gpu, **{name: value}))
    return cluster.replace(**{name: getattr(cluster, name) * factor})


def decider(best: Estimate, rival: Estimate, cluster: Cluster,
            price: Callable[[Estimate, Cluster], float]) -> tuple[str, float] | None:
    """The parameter that flips the order of `best` and `rival` with the smallest change,
    and the factor on it at which they tie, within x2/3 .. x3/2 of the preset (the range a
    calibration could plausibly move a datasheet-derived figure; an efficiency no further
    than 1), or None.

    `price(estimate, cluster)` re-prices an estimate's layout on a changed cluster.
    """
    found: tuple[str, float] | None = None

    def gap(where: str, name: str, log_factor: float) -> float:
        changed = _scaled(cluster, where, name, math.exp(log_factor))
        return price(rival, changed) / price(best, changed) - 1

    for where, name, meaning in PARAMETERS:
        now = gap(where, name, 0.0)
        ends = SEARCH_RANGE
        if name in FRACTIONS:  # an achieved share of a datasheet figure stops at all of it
            value = getattr(cluster.gpu if where == "gpu" else cluster, name)
            ends = tuple(end for end in (SEARCH_RANGE[0], min(SEARCH_RANGE[1], 1 / value))
                         if end != 1)
        for end in ends:
            if (gap(where, name, math.log(end)) > 0) == (now > 0):
                continue  # the order holds all the way to this end
            near, far = 0.0, math.log(end)  # bisect: the sign flips between near and far
            for _ in range(12):
                middle = (near + far) / 2
                if (gap(where, name, middle) > 0) == (now > 0):
                    near = middle
                else:
                    far = middle
            if found is None or abs(far) < abs(math.log(found[1])):
                found = (meaning, math.exp(far))
    return found
