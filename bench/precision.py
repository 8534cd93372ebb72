"""Each precision policy next to fp32: how far its losses and gradient norms move, and the
model-state bytes per parameter a rank holds (counted tensors) next to the planner's.

The tiny model (bf16 matmuls run ~70x slower than fp32 on this CPU), three steps from the
same weights and batches on the layouts whose bounds tests/test_precision.py checks (dp, tp
with sp, pp, ZeRO 0-3, 3D), against one process in fp32; the largest relative difference
over the layouts. Bytes: one rank of dp=2 ZeRO-0.
"""

from __future__ import annotations

import torch

from paraxis.dist.testing import RankContext, run_on_ranks
from paraxis.engine.data_parallel import DataParallelEngine
from paraxis.model.transformer import build_model
from paraxis.parallelize import build_engine
from paraxis.plan.memory import model_state_bytes
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import PRESETS
from paraxis.spec.precision import POLICIES, PRECISIONS
from paraxis.spec.runtime_options import RuntimeOptions

MODEL = PRESETS["tiny"]
LAUNCHES = [["dp=2,pp=2,zero=1,microbatches=2", "dp=2,tp=2,sp=true,zero=3,microbatches=2",
             "tp=2,pp=2,microbatches=2", "dp=4,zero=0", "dp=4,zero=2,microbatches=2"],
            ["dp=2,tp=2,sp=true,pp=2,zero=2,microbatches=2"]]
QUICK_LAUNCHES = [["dp=2,pp=2,zero=1,microbatches=2"]]


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return (torch.randint(0, 256, (8, 16), generator=g),
            torch.randint(0, 256, (8, 16), generator=g))


def _train(ctx: RankContext | None, name: str, steps: int) -> list[float]:
    """Losses then gradient norms of `steps` steps (one process when ctx is None)."""
    if ctx is None:
        engine = DataParallelEngine(build_model(MODEL, seed=0), Layout(), None,
                                    options=RuntimeOptions(precision=name))
    else:
        engine = build_engine(MODEL, ctx.layout, ctx.groups, "cpu", seed=0,
                              options=RuntimeOptions(precision=name))
    losses, norms = [], []
    for step in range(steps):
        x, y = _batch(step)
        if ctx is not None:
            x, y = (t.chunk(ctx.layout.dp)[ctx.groups.dp_rank] for t in (x, y))
        losses.append(engine.forward_backward(x, y))
        norms.append(engine.clip_grad_norm(1.0))
        engine.optimizer_step(1e-3)
        engine.zero_grad()
    return losses + norms


def _every_policy(ctx: RankContext, steps: int) -> dict[str, list[float]]:
    return {name: _train(ctx, name, steps) for name in POLICIES}


def _bytes(ctx: RankContext) -> dict[str, dict[str, int]]:
    out = {}
    for name in POLICIES:
        engine = DataParallelEngine(build_model(MODEL, seed=0), ctx.layout, ctx.groups,
                                    options=RuntimeOptions(precision=name))
        engine.forward_backward(*(t.chunk(2)[ctx.rank] for t in _batch(0)))
        engine.optimizer_step(1e-3)
        out[name] = engine.memory_report()
    return out


def run(quick: bool) -> dict:
    steps = 2 if quick else 3
    reference = _train(None, "fp32", steps)
    worst = {name: [0.0, 0.0] for name in POLICIES}
    launches = QUICK_LAUNCHES if quick else LAUNCHES
    for layouts in launches:
        for by_rank in run_on_ranks(layouts, _every_policy, steps, timeout_s=900):
            for name, got in by_rank[0].items():
                for which, part in enumerate((slice(0, steps), slice(steps, None))):
                    diff = max(abs(a / b - 1) for a, b in zip(got[part], reference[part],
                                                              strict=True))
                    worst[name][which] = max(worst[name][which], diff)
    counted = run_on_ranks("dp=2", _bytes)[0]
    params = MODEL.num_params()
    rows = []
    for name in POLICIES:
        planned = model_state_bytes(params, 2, 0, PRECISIONS[name])
        rows.append({"precision": name, "policy": POLICIES[name].describe(),
                     "loss_rel_diff": worst[name][0], "norm_rel_diff": worst[name][1],
                     "bytes_per_param": {k: v / params for k, v in counted[name].items()},
                     "planned_per_param": {k: v / params for k, v in planned.items()}})
    return {"layouts": [text for layouts in launches for text in layouts], "steps": steps,
            "rows": rows}


def render(section: dict) -> str:
    lines = ["## Precision policies next to fp32\n",
             f"Tiny model, {section['steps']} steps on each of {', '.join(section['layouts'])}; "
             "the largest relative difference from one fp32 process of the losses and of the "
             "gradient norms; model-state bytes per parameter (params + grads + optimizer) "
             "counted on one rank of dp=2 ZeRO-0, next to the planner's (docs/precision.md).\n",
             "| precision | loss vs fp32 | grad norm vs fp32 | counted B/param | planner |",
             "|---|---|---|---|---|"]
    for r in section["rows"]:
        counted = " + ".join(f"{v:.2f}" for v in r["bytes_per_param"].values())
        planned = " + ".join(f"{v:g}" for v in r["planned_per_param"].values())
        lines.append(f"| {r['precision']} | {r['loss_rel_diff']:.1e} | "
                     f"{r['norm_rel_diff']:.1e} | {counted} | {planned} |")
    return "\n".join(lines) + "\n"
