"""Each precision policy next to fp32: how far its losses and gradient norms move, and the
model-state bytes per parameter a rank holds (counted tensors) next to the planner's.

The tiny model (bf16 matmuls run ~70x slower than fp32 on this CPU) on dp=2 x pp=2 with
ZeRO-1, three steps from the same weights and batches; the same measurement the suite's
tolerances rest on (tests/test_precision.py). Bytes: dp=2 ZeRO-0, one rank.
"""

from __future__ import annotations

import torch

from paraxis.data_parallel import DataParallelEngine
from paraxis.layout import Layout
from paraxis.model import build_model
from paraxis.model_config import PRESETS
from paraxis.plan.memory import model_state_bytes
from paraxis.plan.precision import PRECISIONS
from paraxis.precision import POLICIES
from paraxis.runtime.distributed import build_groups
from paraxis.runtime.parallelize import build_engine
from paraxis.testing import run_distributed

MODEL = PRESETS["tiny"]
LAYOUT = Layout.parse("dp=2,pp=2,zero=1,microbatches=2")


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return (torch.randint(0, 256, (8, 16), generator=g),
            torch.randint(0, 256, (8, 16), generator=g))


def _train(name: str, steps: int) -> tuple[list[float], list[float]]:
    groups = build_groups(LAYOUT)
    engine = build_engine(MODEL, LAYOUT, groups, "cpu", seed=0, precision=name)
    losses, norms = [], []
    for step in range(steps):
        x, y = (t.chunk(LAYOUT.dp)[groups.dp_rank] for t in _batch(step))
        losses.append(engine.forward_backward(x, y))
        norms.append(engine.clip_grad_norm(1.0))
        engine.optimizer_step(1e-3)
        engine.zero_grad()
    return losses, norms


def _bytes(name: str) -> dict[str, int]:
    layout = Layout(dp=2)
    engine = DataParallelEngine(build_model(MODEL, seed=0), layout, build_groups(layout),
                                precision=name)
    engine.forward_backward(*(t.chunk(2)[0] for t in _batch(0)))
    engine.optimizer_step(1e-3)
    return engine.memory_report()


def run(quick: bool) -> dict:
    steps = 2 if quick else 3

    def body() -> dict:
        return {name: {"run": _train(name, steps), "bytes": _bytes(name)} for name in POLICIES}

    result = run_distributed(body, LAYOUT.world_size, timeout_s=900)[0]
    reference_losses, reference_norms = result["fp32"]["run"]
    rows = []
    params = MODEL.num_params()
    for name, got in result.items():
        losses, norms = got["run"]
        planned = model_state_bytes(params, 2, 0, PRECISIONS[name])
        rows.append({
            "precision": name, "policy": POLICIES[name].describe(),
            "loss_rel_diff": max(abs(a / b - 1) for a, b in zip(losses, reference_losses,
                                                                 strict=True)),
            "norm_rel_diff": max(abs(a / b - 1) for a, b in zip(norms, reference_norms,
                                                                strict=True)),
            "bytes_per_param": {k: v / params for k, v in got["bytes"].items()},
            "planned_per_param": {k: v / params for k, v in planned.items()}})
    return {"layout": str(LAYOUT), "steps": steps, "rows": rows}


def render(section: dict) -> str:
    lines = ["## Precision policies next to fp32\n",
             f"Tiny model, {section['layout']}, {section['steps']} steps; largest relative "
             "difference from fp32 of the loss and of the gradient norm; model-state bytes per "
             "parameter counted on one rank of dp=2 ZeRO-0 (params + grads + optimizer) next to "
             "the planner's (docs/precision.md).\n",
             "| precision | loss vs fp32 | grad norm vs fp32 | counted B/param | planner |",
             "|---|---|---|---|---|"]
    for r in section["rows"]:
        counted = "+".join(f"{v:.2f}" for v in r["bytes_per_param"].values())
        planned = "+".join(f"{v:g}" for v in r["planned_per_param"].values())
        lines.append(f"| {r['precision']} | {r['loss_rel_diff']:.1e} | "
                     f"{r['norm_rel_diff']:.1e} | {counted} | {planned} |")
    return "\n".join(lines) + "\n"
