"""Is `--layout auto` right on this machine? The planner's top 5, trained side by side.

For each setting (a tiny model, a global batch, a rank count), the planner searches on this
machine's calibrated profile exactly as `paraxis train --layout auto` does
(`paraxis.train.auto_layout.plan_for`), and its five fastest layouts train side by side: one
launch of the ranks builds the engine `paraxis train` builds for each of the five (on the
same ranks, each with its own process groups), and their steps alternate, the order rotated
every step, so a slow spell of this shared machine lands on all five alike (as the
paraxis-vs-peer rows pair their sides). A step counts at its slowest rank; a layout's figure
is the median over rounds (launches) of the median of its timed steps. `paraxis plan
--verify K` does the same with separate `paraxis train` runs (`paraxis.train.verify`); here
one launch per round keeps six settings within the time a bench run has. Reported per setting: the
measured ranking next to the predicted one, Spearman's rank correlation of the step times,
and whether the auto pick (the planner's first) ran within 10% of the fastest measured.
Nothing is fitted to the measurements.
"""

from __future__ import annotations

import math
import statistics
import time

import torch

from paraxis.dist.testing import run_distributed
from paraxis.plan.uncertainty import CPU_BAND
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import ModelConfig
from paraxis.train.auto_layout import plan_for
from paraxis.train.config import RunConfig
from paraxis.train.verify import Measured, ranks_of, summary

TOP = 5
# (model, ranks, global batch): different tiny models, batch sizes and rank counts
SETTINGS = [("tiny", 2, 8), ("tiny-llama", 2, 32), ("tiny-llama", 4, 16), ("tiny", 4, 32),
            ("tiny-moe", 4, 16), ("tiny-llama", 8, 16)]
QUICK_SETTINGS = [("tiny", 2, 8)]
SEQ_LEN = 128


def side_by_side(cfg: ModelConfig, layouts: list[Layout], global_batch: int, seq_len: int,
                 steps: int, warmup: int) -> list[list[float]]:
    """On every rank: an engine per layout, then `steps` rounds of one step of each, the
    order rotated each round; this rank's seconds per step, by layout."""
    import torch.distributed as dist

    from bench.common import engine_step
    from paraxis.dist.groups import build_groups
    from paraxis.parallelize import build_engine

    tokens = torch.randint(0, cfg.vocab_size, (global_batch, seq_len + 1),
                           generator=torch.Generator().manual_seed(0))
    steps_of = []
    for layout in layouts:
        groups = build_groups(layout)
        engine = build_engine(cfg, layout, groups, "cpu", seed=0, seq_len=seq_len)
        per_dp = global_batch // layout.dp  # this dp rank's rows, as the training loop slices
        rows = slice(groups.dp_rank * per_dp, (groups.dp_rank + 1) * per_dp)
        x, y = tokens[rows, :-1].contiguous(), tokens[rows, 1:].contiguous()
        steps_of.append(engine_step(engine, x, y, clip=1.0))
    times: list[list[float]] = [[] for _ in layouts]
    for round_ in range(warmup + steps):
        for index in [(round_ + k) % len(layouts) for k in range(len(layouts))]:
            dist.barrier()  # every rank starts the step together: its time is the step's
            started = time.perf_counter()
            steps_of[index]()
            if round_ >= warmup:
                times[index].append(time.perf_counter() - started)
    return times


def measure_setting(model: str, ranks: int, global_batch: int, seq_len: int, top: int,
                    rounds: int, steps: int, warmup: int, log=print) -> dict:  # noqa: ANN001
    """The planner's top `top` for one setting, predicted and measured (module docstring)."""
    cfg = RunConfig.from_flags(model=model, nproc=ranks, global_batch=global_batch,
                               seq_len=seq_len, layout="auto")
    choice, source, _ = plan_for(cfg, ranks)
    candidates = choice.result.top(top)
    log(f"{model} on {ranks} ranks, global batch {global_batch}: priced on {source}")
    layouts = [e.layout for e in candidates]
    rows = [Measured(str(e.layout), e.step_time_s, predicted_rank=i + 1)
            for i, e in enumerate(candidates)]
    for round_ in range(rounds):
        per_rank = run_distributed(side_by_side, ranks, (choice.cfg, layouts, global_batch,
                                                         seq_len, steps, warmup),
                                   timeout_s=1800)
        for index, row in enumerate(rows):
            slowest = [max(times) for times in zip(*(r[index] for r in per_rank),
                                                   strict=True)]
            row.runs_s.append(statistics.median(slowest))
            log(f"  round {round_ + 1}: #{index + 1} {row.layout}: "
                f"{row.runs_s[-1]:.4f} s per step (predicted {row.predicted_s:.4f} s)")
    for row, rank in zip(rows, ranks_of([r.measured_s for r in rows]), strict=True):
        row.measured_rank = round(rank)
    figures = summary(rows)
    log(f"  Spearman {figures['spearman']:+.2f}; pick {figures['pick_over_fastest']:+.1%} "
        "vs the fastest measured")
    return {"model": model, "ranks": ranks, "global_batch": global_batch, "seq_len": seq_len,
            "source": source, "considered": choice.result.considered,
            "rows": [{"layout": r.layout, "predicted_s": r.predicted_s,
                      "measured_s": r.measured_s, "runs_s": r.runs_s,
                      "predicted_rank": r.predicted_rank, "measured_rank": r.measured_rank}
                     for r in rows], **figures}


def run(quick: bool, log=print) -> dict:  # noqa: ANN001
    rounds, steps, warmup = (1, 3, 1) if quick else (5, 10, 2)
    settings = QUICK_SETTINGS if quick else SETTINGS
    results = [measure_setting(model, ranks, batch, 32 if quick else SEQ_LEN,
                               2 if quick else TOP, rounds, steps, warmup, log)
               for model, ranks, batch in settings]
    return {"rounds": rounds, "steps": steps, "warmup": warmup, "settings": results}


def render(data: dict) -> str:
    settings = data["settings"]
    lines = [
        "## `--layout auto`: the planner's top 5, measured side by side",
        "",
        "`python -m bench --only auto` (bench/auto.py). Per setting the planner searches on "
        "this machine's calibrated profile as `paraxis train --layout auto` does; its five "
        "fastest layouts are built as `paraxis train` builds them, in the same ranks, and "
        "their steps alternate (order rotated every step, a barrier before each), so a slow "
        f"spell of this shared machine lands on all of them: {data['rounds']} launches, "
        f"{data['warmup']} warm-up and {data['steps']} timed steps of each layout per launch; "
        "a step counts at its slowest rank, a layout's figure is the median over launches of "
        "its median step. Spearman: rank correlation of predicted and measured step time "
        "over the five. Pick: how much slower the auto pick (the planner's first) ran than "
        "the fastest measured; the criterion is within 10%.",
        "",
        "| model | ranks | batch | auto pick | predicted | measured | fastest measured | "
        "pick vs fastest | within 10% | Spearman | spread predicted | spread measured |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in settings:
        rows = s["rows"]
        pick, fastest = rows[0], min(rows, key=lambda r: r["measured_s"])
        lines.append(
            f"| {s['model']} | {s['ranks']} | {s['global_batch']} | `{pick['layout']}` | "
            f"{pick['predicted_s']:.3f} s | {pick['measured_s']:.3f} s | "
            f"`{fastest['layout']}` {fastest['measured_s']:.3f} s | "
            f"{s['pick_over_fastest']:+.1%} | {'yes' if s['pick_within_10pct'] else 'no'} | "
            f"{_rho(s['spearman'])} | {_spread(rows, 'predicted_s')} | "
            f"{_spread(rows, 'measured_s')} |")
    within = sum(s["pick_within_10pct"] for s in settings)
    rhos = [s["spearman"] for s in settings if not math.isnan(s["spearman"])]
    lines += ["", f"The pick is within 10% of the fastest measured in {within} of "
              f"{len(settings)} settings; median Spearman "
              f"{_rho(statistics.median(rhos)) if rhos else 'n/a'}. Spread: the slowest of "
              "the five over the fastest, predicted and measured; where the predicted spread "
              f"is inside the model's ±{CPU_BAND.rms:.0%} error on this machine "
              "(plan/uncertainty.py) the five are a tie for the model: it does not resolve "
              "differences that small, and the measured order among them is decided by what "
              "it prices too small and by this machine's noise (compare a layout's "
              "launches below).", "", _zero_line(settings), ""]
    for s in settings:
        lines += [f"<details><summary>{s['model']}, {s['ranks']} ranks, batch "
                  f"{s['global_batch']}: each layout (priced on {s['source']})</summary>", "",
                  "| # predicted | # measured | layout | predicted | measured (rounds) |",
                  "|---|---|---|---|---|"]
        lines += [f"| {r['predicted_rank']} | {r['measured_rank']} | `{r['layout']}` | "
                  f"{r['predicted_s']:.3f} s | {r['measured_s']:.3f} s ("
                  + ", ".join(f"{t:.3f}" for t in r["runs_s"]) + ") |" for r in s["rows"]]
        lines += ["", "</details>", ""]
    return "\n".join(lines)


def _zero_line(settings: list[dict]) -> str:
    """How often the fastest measured layout is one without ZeRO, and how often the
    planner's pick was: on gloo ZeRO's reduce-scatter plus all-gather may cost more than the
    one all-reduce they replace, more than the planner prices."""
    def plain(layout: str) -> bool:
        return ",zero=0" in layout

    fastest = sum(plain(min(s["rows"], key=lambda r: r["measured_s"])["layout"])
                  for s in settings)
    picked = sum(plain(s["rows"][0]["layout"]) for s in settings)
    return (f"The fastest measured layout has no ZeRO in {fastest} of {len(settings)} "
            f"settings; the planner's pick has none in {picked}.")


def _spread(rows: list[dict], key: str) -> str:
    values = [r[key] for r in rows]
    return f"{max(values) / min(values) - 1:+.0%}"


def _rho(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:+.2f}"
