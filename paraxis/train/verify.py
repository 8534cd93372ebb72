"""Check the planner's ranking, not only its times: train its top K layouts side by side.

    rows = verify(result.top(3), train_args=["--model", "tiny", "--global-batch", "16"],
                  folder=Path("runs/verify"))
    spearman([r.predicted_s for r in rows], [r.measured_s for r in rows])

Each layout runs as a real `paraxis train` (its own ranks, gloo on a CPU) for a short burst;
its measured step time is rank 0's steady step time, as the report measures a run
(`run_records.steady`: the median after the warm-up steps).
On a shared machine the load drifts from minute to minute, so the layouts are interleaved:
every round runs each of them once, the order rotated from round to round, and a layout's
figure is the median over its rounds. A slow spell then lands on every layout alike instead
of on whichever happened to run during it. Subprocesses only: nothing here imports torch.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from paraxis.files.run_records import load_metrics, steady
from paraxis.plan.cost import Estimate
from paraxis.spec.errors import ParaxisError

STEPS = 10  # per burst
ROUNDS = 2  # bursts of each layout, interleaved


@dataclass
class Measured:
    """One layout: predicted and measured step time, and its place in each ranking."""

    layout: str
    predicted_s: float
    runs_s: list[float] = field(default_factory=list)  # one median per round
    predicted_rank: int = 0  # 1 = fastest
    measured_rank: int = 0

    @property
    def measured_s(self) -> float:
        return statistics.median(self.runs_s)


def ranks_of(values: list[float]) -> list[float]:
    """1-based ranks, ties sharing the mean of their places (Spearman's convention)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation: Pearson's correlation of the ranks (nan when either
    side has a single rank, e.g. fewer than two layouts)."""
    rx, ry = ranks_of(xs), ranks_of(ys)
    n = len(rx)
    if n < 2:
        return float("nan")
    mx, my = sum(rx) / n, sum(ry) / n
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sx = sum((a - mx) ** 2 for a in rx) ** 0.5
    sy = sum((b - my) ** 2 for b in ry) ** 0.5
    return cov / (sx * sy) if sx and sy else float("nan")


def burst(layout: str, train_args: list[str], metrics: Path, steps: int = STEPS,
          timeout_s: float = 600.0) -> float:
    """Train `layout` for `steps` steps with `paraxis train` (`train_args` give the model,
    batch, ranks, ...); rank 0's steady step time (`run_records.steady`)."""
    metrics.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "paraxis", "train", *train_args, "--layout", layout,
               "--steps", str(steps), "--warmup", "0", "--quiet", "--log-every",
               str(steps), "--metrics-file", str(metrics)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s,
                          check=False)
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ParaxisError(f"the verification run of {layout} failed (exit "
                           f"{done.returncode}): {said}")
    return steady(load_metrics(metrics), "step_time_s")


def verify(candidates: list[Estimate], train_args: list[str], folder: Path,
           rounds: int = ROUNDS, steps: int = STEPS,
           log: Callable[[str], object] = print) -> list[Measured]:
    """Run every candidate `rounds` times, interleaved (module docstring); rows in the
    planner's order with both ranks filled in."""
    rows = [Measured(str(e.layout), e.step_time_s, predicted_rank=i + 1)
            for i, e in enumerate(candidates)]
    for round_ in range(rounds):
        shift = round_ % len(rows)
        for index in [*range(shift, len(rows)), *range(shift)]:
            row = rows[index]
            seconds = burst(row.layout, train_args,
                            folder / f"layout{index + 1}-round{round_ + 1}" / "metrics.jsonl",
                            steps)
            row.runs_s.append(seconds)
            log(f"  round {round_ + 1}: #{index + 1} {row.layout}: {seconds:.4f} s per step")
    measured = ranks_of([r.measured_s for r in rows])
    for row, rank in zip(rows, measured, strict=True):
        row.measured_rank = round(rank)
    return rows


def summary(rows: list[Measured]) -> dict[str, float | bool]:
    """The figures a verification is judged by: Spearman's rho of predicted against
    measured step times, and how much slower the planner's pick ran than the fastest."""
    fastest = min(r.measured_s for r in rows)
    pick = rows[0].measured_s
    return {"spearman": spearman([r.predicted_s for r in rows], [r.measured_s for r in rows]),
            "pick_over_fastest": pick / fastest - 1,
            "pick_within_10pct": pick <= 1.10 * fastest}


def table(rows: list[Measured]) -> list[str]:
    """The measured ranking next to the predicted one, as text lines."""
    lines = [f"{'#pred':>5} {'#meas':>5} {'predicted':>10} {'measured':>10}  layout"]
    for r in rows:
        lines.append(f"{r.predicted_rank:>5} {r.measured_rank:>5} {r.predicted_s:>9.4f}s "
                     f"{r.measured_s:>9.4f}s  {r.layout}")
    s = summary(rows)
    rho = s["spearman"]
    said = ("n/a (the predicted or measured times tie)" if rho != rho  # nan
            else f"{rho:+.2f}")
    lines.append(f"Spearman rank correlation {said} over {len(rows)} layouts; "
                 f"the pick ran {s['pick_over_fastest']:+.1%} vs the fastest measured")
    noise = round_noise(rows)
    measured = [r.measured_s for r in rows]
    gap = max(measured) / min(measured) - 1
    if noise > 0 and gap <= noise:
        lines.append(f"Noise: between rounds one layout's median moved by up to {noise:.0%}, "
                     f"more than the {gap:.1%} the measured layouts span: this machine does "
                     "not order them; more rounds (--verify-rounds) or a quieter machine would")
    elif noise > 0:
        lines.append(f"Noise: between rounds one layout's median moved by up to {noise:.0%}; "
                     f"the measured layouts span {gap:.1%}")
    return lines


def round_noise(rows: list[Measured]) -> float:
    """The largest spread of one layout's medians over the rounds, (max - min) / median:
    measured differences smaller than this are the machine's noise, not the layouts'."""
    return max(((max(r.runs_s) - min(r.runs_s)) / r.measured_s for r in rows
                if len(r.runs_s) > 1), default=0.0)
