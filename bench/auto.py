"""Is `--layout auto` right on this machine? The planner's top 5, trained side by side.

For each setting (a tiny model, a global batch, a rank count), the planner searches on this
machine's calibrated profile exactly as `paraxis train --layout auto` does
(`paraxis.auto_layout.plan_for`), and its five fastest layouts each train as a real
`paraxis train` run (gloo ranks) for a short burst, interleaved over rounds with the order
rotated (`paraxis.plan.verify`), so that the machine's drifting load lands on all five alike.
Reported per setting: the measured ranking next to the predicted one, Spearman's rank
correlation of the two step times, and whether the auto pick (the planner's first) ran
within 10% of the fastest measured. Nothing is fitted to the measurements.
"""

from __future__ import annotations

import math
import statistics
import tempfile
from pathlib import Path

from paraxis.auto_layout import plan_for
from paraxis.config import RunConfig
from paraxis.plan.verify import summary, verify

TOP = 5
# (model, ranks, global batch): different tiny models, batch sizes and rank counts
SETTINGS = [("tiny", 2, 8), ("tiny-llama", 2, 32), ("tiny-llama", 4, 16), ("tiny", 4, 32),
            ("tiny-moe", 4, 16), ("tiny-llama", 8, 16)]
QUICK_SETTINGS = [("tiny", 2, 8)]
SEQ_LEN = 128


def measure_setting(model: str, ranks: int, global_batch: int, seq_len: int, top: int,
                    rounds: int, steps: int, warmup: int, log=print) -> dict:  # noqa: ANN001
    """The planner's top `top` for one setting, predicted and measured (module docstring)."""
    cfg = RunConfig.from_flags(model=model, nproc=ranks, global_batch=global_batch,
                               seq_len=seq_len, layout="auto")
    choice, source, _ = plan_for(cfg, ranks)
    candidates = choice.result.top(top)
    log(f"{model} on {ranks} ranks, global batch {global_batch}: priced on {source}")
    args = ["--model", model, "--nproc", str(ranks), "--global-batch", str(global_batch),
            "--seq-len", str(seq_len), "--precision", cfg.train.precision]
    with tempfile.TemporaryDirectory(prefix="paraxis-auto-bench-") as folder:
        rows = verify(candidates, args, Path(folder), rounds, steps, warmup, log)
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
    rounds, steps, warmup = (1, 4, 1) if quick else (2, 10, 3)
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
        "this machine's calibrated profile as `paraxis train --layout auto` does, and its "
        f"fastest layouts each train as a real `paraxis train` run: {data['rounds']} rounds, "
        "each running every layout once in a rotated order (so a slow spell of this shared "
        f"machine lands on all of them), {data['steps']} steps a run, the median of rank 0's "
        f"step times after {data['warmup']}; a layout's figure is the median over its "
        "rounds. Spearman: rank correlation of predicted and measured step time over those "
        "layouts. Pick: how much slower the auto pick (the planner's first) ran than the "
        "fastest measured; the criterion is within 10%.",
        "",
        "| model | ranks | batch | auto pick | predicted | measured | fastest measured | "
        "pick vs fastest | within 10% | Spearman |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in settings:
        rows = s["rows"]
        pick, fastest = rows[0], min(rows, key=lambda r: r["measured_s"])
        lines.append(
            f"| {s['model']} | {s['ranks']} | {s['global_batch']} | `{pick['layout']}` | "
            f"{pick['predicted_s']:.3f} s | {pick['measured_s']:.3f} s | "
            f"`{fastest['layout']}` {fastest['measured_s']:.3f} s | "
            f"{s['pick_over_fastest']:+.1%} | {'yes' if s['pick_within_10pct'] else 'no'} | "
            f"{_rho(s['spearman'])} |")
    within = sum(s["pick_within_10pct"] for s in settings)
    rhos = [s["spearman"] for s in settings if not math.isnan(s["spearman"])]
    lines += ["", f"The pick is within 10% of the fastest measured in {within} of "
              f"{len(settings)} settings; median Spearman "
              f"{_rho(statistics.median(rhos)) if rhos else 'n/a'}.", ""]
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


def _rho(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:+.2f}"
