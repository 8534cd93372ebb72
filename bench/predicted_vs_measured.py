"""The planner's predicted step time next to the measured one, layout by layout.

One model, one global batch, one calibrated hardware profile (`paraxis calibrate`, run by
`python -m bench` just before); each layout trains on real ranks (gloo, one thread each)
through the same engines `paraxis train` builds, and its median step time after warm-up (the
slowest rank's) is set beside `paraxis.plan.cost.evaluate` for that layout on that profile.
"""

from __future__ import annotations

import statistics

import torch

from bench.common import engine_step, measure_steps
from paraxis.layout import Layout
from paraxis.model_config import PRESETS, ModelConfig
from paraxis.plan.cost import Estimate, evaluate
from paraxis.plan.hardware import build_cluster
from paraxis.plan.precision import FP32_ADAM
from paraxis.testing import run_distributed

TARGET = 0.25  # issue 9: within 25% for at least 8 of the 10 layouts

# Hidden 256, 8 layers (so 2, 4 and 8 stages and 2 chunks per stage divide them evenly).
MODEL = PRESETS["small-llama"].replace(name="small-llama-8", n_layers=8)
QUICK_MODEL = PRESETS["tiny-llama"].replace(name="tiny-llama-8", n_layers=8)
LAYOUTS = [
    "dp=1",
    "dp=2",
    "dp=2,zero=3",
    "dp=4,zero=2,microbatches=2",
    "tp=2",
    "tp=2,sp=true",
    "pp=2,microbatches=4,schedule=1f1b",
    "pp=2,microbatches=8,schedule=gpipe",
    "pp=4,microbatches=8,schedule=interleaved,virtual_stages=2",
    "dp=2,tp=2",
    "dp=2,tp=2,pp=2,zero=1,microbatches=4,schedule=1f1b",
    "dp=8",
]
QUICK_LAYOUTS = ["dp=1", "tp=2", "pp=2,microbatches=4,schedule=1f1b"]


def setting(quick: bool) -> dict:
    if quick:
        return {"model": QUICK_MODEL, "global_batch": 8, "seq_len": 32, "steps": 2,
                "warmup": 1, "repeats": 1}
    return {"model": MODEL, "global_batch": 16, "seq_len": 128, "steps": 5, "warmup": 2,
            "repeats": 2}


def train_body(cfg: ModelConfig, layout: Layout, global_batch: int, seq_len: int, steps: int,
               warmup: int) -> dict:
    """On every rank: build the engine `paraxis train` would, time steps on a fixed batch."""
    from paraxis.runtime.build import build_engine
    from paraxis.runtime.distributed import build_groups
    from paraxis.train import TrainConfig

    groups = build_groups(layout)
    train_cfg = TrainConfig(seq_len=seq_len, global_batch=global_batch, quiet=True)
    engine = build_engine(cfg, layout, groups, torch.device("cpu"), train_cfg)
    tokens = torch.randint(0, cfg.vocab_size, (global_batch, seq_len + 1),
                           generator=torch.Generator().manual_seed(0))
    per_dp = global_batch // layout.dp  # this dp rank's rows, as the training loop slices
    rows = slice(groups.dp_rank * per_dp, (groups.dp_rank + 1) * per_dp)
    x, y = tokens[rows, :-1].contiguous(), tokens[rows, 1:].contiguous()
    return measure_steps(engine_step(engine, x, y, clip=1.0), steps, warmup)


def measure(cfg: ModelConfig, layout: Layout, s: dict) -> float:
    """Median over repeats of the slowest rank's median step time."""
    runs = [max(r["step_time_s"] for r in run_distributed(
        train_body, layout.world_size,
        (cfg, layout, s["global_batch"], s["seq_len"], s["steps"], s["warmup"]),
        timeout_s=900)) for _ in range(s["repeats"])]
    return statistics.median(runs)


def predict(cfg: ModelConfig, layout: Layout, profile: dict, global_batch: int,
            seq_len: int) -> Estimate:
    """The planner's estimate for `layout` on the calibrated machine, fp32 Adam as run."""
    cluster = build_cluster(gpus=layout.world_size, overrides=profile_overrides(profile))
    return evaluate(cfg, layout, cluster, seq_len, global_batch, FP32_ADAM)


def profile_overrides(profile: dict) -> dict:
    """The flat overrides build_cluster takes, from a profile document (hardware.py schema)."""
    return {**profile["gpu"], **profile["cluster"]}


def run(quick: bool, profile: dict, layouts: list[str] | None = None, log=print) -> dict:  # noqa: ANN001
    s = setting(quick)
    cfg = s["model"]
    rows = []
    for text in layouts or (QUICK_LAYOUTS if quick else LAYOUTS):
        layout = Layout.parse(text)
        layout = layout.validate(layout.world_size, cfg, s["global_batch"], s["seq_len"])
        estimate = predict(cfg, layout, profile, s["global_batch"], s["seq_len"])
        measured = measure(cfg, layout, s)
        error = estimate.step_time_s / measured - 1
        log(f"  {layout}: measured {measured:.3f} s, predicted {estimate.step_time_s:.3f} s "
            f"({error:+.0%})")
        rows.append({"layout": str(layout), "ranks": layout.world_size,
                     "measured_step_s": measured, "predicted_step_s": estimate.step_time_s,
                     "error": error,
                     "predicted_parts_s": {k: estimate.time[k] for k in (
                         "compute", "tp", "pp", "dp", "bubble", "optimizer")}})
    errors = [abs(r["error"]) for r in rows]
    return {"model": cfg.to_dict(), "global_batch": s["global_batch"],
            "seq_len": s["seq_len"], "steps": s["steps"], "warmup": s["warmup"],
            "repeats": s["repeats"], "rows": rows,
            "mean_abs_error": statistics.mean(errors),
            "within_target": sum(e <= TARGET for e in errors), "target": TARGET}


def render(data: dict) -> str:
    m = data["model"]
    lines = [
        "## Predicted vs measured step time",
        "",
        f"Model `{m['name']}` ({m['style']}, {m['n_layers']} layers, d_model {m['d_model']}, "
        f"vocab {m['vocab_size']}), global batch {data['global_batch']} x {data['seq_len']} "
        f"tokens, fp32, AdamW, clipping at 1.0. Measured: median of {data['steps']} steps "
        f"after {data['warmup']} warm-up, slowest rank, median of {data['repeats']} runs. "
        "Predicted: `paraxis.plan.cost.evaluate` for the layout on the calibrated profile "
        "above (no per-layout factor). Error = predicted / measured - 1.",
        "",
        "| layout | ranks | measured | predicted | error | predicted: compute | tp | pp | "
        "dp | bubble | optimizer |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["rows"]:
        parts = r["predicted_parts_s"]
        lines.append(
            f"| `{r['layout']}` | {r['ranks']} | {r['measured_step_s']:.3f} s | "
            f"{r['predicted_step_s']:.3f} s | {r['error']:+.0%} | "
            + " | ".join(f"{parts[k]:.3f}" for k in ("compute", "tp", "pp", "dp", "bubble",
                                                     "optimizer")) + " |")
    lines += ["", f"Mean absolute error {data['mean_abs_error']:.1%}; "
              f"{data['within_target']} of {len(data['rows'])} layouts within "
              f"{data['target']:.0%} (target: 8 of 10).", ""]
    return "\n".join(lines)
