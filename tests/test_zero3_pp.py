"""ZeRO-3 with pipeline parallelism trains exactly as one device does.

Checked in fp32 over 10 steps: losses within 1e-5 of one device's, step by step, and
the final weights too (gathered from their dp shards and tp slices), for

- dp2 x pp2 under 1F1B (reshard after forward, a tied GPT-2), interleaved (keep for the
  step, Llama), GPipe with selective recompute, zb-h1 with full recompute (W re-gathers its
  chunk), zb-v (tied copies on one stage) and zb-h1 on GPT-2 (LayerNorm's W gathers its
  chunk) - one launch of 4 ranks;
- dp2 x tp2 (sequence parallel) x pp2, interleaved with full recompute (Llama), and zb-v
  (GPT-2: sequence parallelism's LayerNorm also reads its weight in W) - one launch of 8
  ranks.

Every layout also counts the bytes its ZeRO collectives assemble in one step
(`data_parallel.flat.VOLUME`) and finds the planner's count (`plan.zero3.zero3_pipeline_volume`)
up to the pad of each flat unit (at most dp-1 elements); "step" gathers once, "forward" once
per microbatch for the forward and once for the backward. Each run saves a checkpoint at the
end: it holds the single-device weights, converts to one device and to another pipeline
layout unchanged, and a fresh engine loaded from it takes the next step exactly as the
trained one does.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from paraxis.dist.testing import RankContext, run_on_ranks
from paraxis.engine.contract import LocalEngine
from paraxis.engine.pipeline_parallel.zero3 import w_reads_weights
from paraxis.model.checkpoint import read_full_state
from paraxis.model.checkpoint.convert import convert
from paraxis.model.checkpoint.entries import KINDS
from paraxis.model.transformer import build_model
from paraxis.parallelize import materialize, parallelize
from paraxis.plan.grad_sync import zero3_kept
from paraxis.plan.memory import stage_local_params
from paraxis.plan.zero3 import zero3_pipeline_volume
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import PRESETS
from paraxis.spec.optimizer import AdamW
from paraxis.spec.precision import FP32_ADAM
from paraxis.spec.runtime_options import RuntimeOptions

STEPS, BATCH, SEQ, SEED = 10, 8, 16, 3
EPS = 1e-5  # as in tests/test_pp_3d.py: keeps Adam's 1/sqrt(v) from amplifying rounding
COUNTED_STEP = 1  # the step whose collectives are counted
FOUR = [("dp=2,pp=2,zero=3,schedule=1f1b,microbatches=4", "tiny"),
        ("dp=2,pp=2,zero=3,schedule=interleaved,virtual_stages=2,microbatches=4,"
         "zero3_reshard=step", "tiny-llama"),
        ("dp=2,pp=2,zero=3,schedule=gpipe,microbatches=2,recompute=selective", "tiny-llama"),
        ("dp=2,pp=2,zero=3,schedule=zb-h1,microbatches=4,recompute=full", "tiny-llama"),
        ("dp=2,pp=2,zero=3,schedule=zb-v,microbatches=4,zero3_reshard=step", "tiny"),
        # GPT-2's LayerNorm reads its weight in W: W gathers its chunk (freed after B)
        ("dp=2,pp=2,zero=3,schedule=zb-h1,microbatches=4", "tiny")]
EIGHT = [("dp=2,tp=2,pp=2,zero=3,schedule=interleaved,virtual_stages=2,microbatches=4,"
          "sp=true,recompute=full", "tiny-llama"),
         # sequence parallelism's LayerNorm reads its weight in W too
         ("dp=2,tp=2,pp=2,zero=3,schedule=zb-v,microbatches=4,sp=true", "tiny")]


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    return [(torch.randint(0, 256, (BATCH, SEQ), generator=generator),
             torch.randint(0, 256, (BATCH, SEQ), generator=generator)) for _ in range(STEPS)]


def _train(engine, rows: slice, on_step=None) -> list[float]:
    from paraxis.engine.data_parallel.flat import VOLUME

    losses = []
    for step, (x, y) in enumerate(_batches()):
        before = dict(VOLUME)
        losses.append(engine.forward_backward(x[rows], y[rows]))
        engine.clip_grad_norm(0.5)  # low enough to clip: the global norm must be right
        engine.optimizer_step(1e-3)
        engine.zero_grad()
        if on_step is not None and step == COUNTED_STEP:
            on_step({kind: VOLUME[kind] - before[kind] for kind in VOLUME})
    return losses


def _rank(ctx: RankContext, models: dict[str, str], root: str
          ) -> tuple[list[float], dict, dict]:
    from paraxis.model.checkpoint import load_checkpoint, save_checkpoint
    from paraxis.parallel.tensor.apply import gather_full

    layout, groups = ctx.layout, ctx.groups
    cfg = PRESETS[models[str(layout)]]
    engine = parallelize(cfg, layout, groups, "cpu", options=RuntimeOptions(adamw=AdamW(eps=EPS)))
    materialize(engine, cfg, SEED)
    per_dp = BATCH // layout.dp
    counted: dict = {}
    losses = _train(engine, slice(groups.dp_rank * per_dp, (groups.dp_rank + 1) * per_dp),
                    counted.update)
    units = engine.data_parallel.units
    counted["units"] = len(units)
    counted["expected"] = _planned(engine, layout, cfg)
    params = {}
    owned = dict(engine.named_parameters())
    for name, value in engine.data_parallel.full_parameters().items():  # dp gather
        params[name] = gather_full(value, owned[name], groups.tp_group).numpy()  # tp gather
    # A checkpoint of the sharded stage, loaded into a fresh engine, goes on identically.
    path = save_checkpoint(engine, f"{root}/{_directory(layout)}", STEPS, cfg.to_dict())
    resumed = parallelize(cfg, layout, groups, "cpu", options=RuntimeOptions(adamw=AdamW(eps=EPS)))
    load_checkpoint(resumed, path, cfg.to_dict(), ctx.rank)
    rows = slice(groups.dp_rank * per_dp, (groups.dp_rank + 1) * per_dp)
    x, y = _batches()[0]
    counted["next"] = [e.forward_backward(x[rows], y[rows]) for e in (engine, resumed)]
    return losses, params, counted


def _directory(layout: Layout) -> str:
    return str(layout).replace(",", "_").replace("=", "")


def _planned(engine, layout: Layout, cfg) -> dict[str, float]:
    """The planner's count for this rank's stage, from the runtime's parameter counts."""
    schedule = engine.schedule
    stage = engine.groups.pp_rank
    parts = engine.parts
    total = sum(p.numel() for part in parts for p in part.parameters())
    embedding = sum(p.numel() for part in parts if part.has_embedding
                    for name, p in part.named_parameters() if name.endswith("_emb.weight"))
    regathered = 0
    if schedule.split_backward and w_reads_weights(parts, layout.recompute):
        regathered = sum(p.numel() for chunk, part in enumerate(parts)
                         if schedule.virtual_stage(stage, chunk) > 0 for p in part.parameters())
    kept = zero3_kept(cfg, layout, FP32_ADAM, stage,
                      stage_local_params(cfg, layout, SEQ)[stage][0], SEQ)
    # the planner's own count of them, from the model's config (which splits a block's
    # norms and biases over tp too: 1% of a tiny block's parameters)
    again = regathered if layout.zero3_reshard == "forward" else 0
    assert kept.once == embedding and kept.regathered == pytest.approx(again, rel=0.01), (
        str(layout), stage, kept, embedding, regathered)
    return zero3_pipeline_volume(total, layout.microbatches, layout.zero3_reshard, 4, 4,
                                 embedding, regathered)


def _reference(model: str) -> tuple[list[float], dict[str, np.ndarray]]:
    engine = LocalEngine(build_model(PRESETS[model], seed=SEED), Layout(),
                         adamw=AdamW(eps=EPS))
    losses = _train(engine, slice(None))
    return losses, {n: p.detach().numpy() for n, p in engine.model.named_parameters()}


@pytest.mark.parametrize("launch", [FOUR, EIGHT], ids=["4-ranks", "8-ranks"])
def test_zero3_pipelines_train_like_one_device(launch, tmp_path):
    layouts = [Layout.parse(text) for text, _ in launch]
    models = {str(layout): model for layout, (_, model) in zip(layouts, launch, strict=True)}
    results = run_on_ranks(layouts, _rank, models, str(tmp_path), timeout_s=300)
    references = {model: _reference(model) for model in set(models.values())}
    for layout, by_rank in zip(layouts, results, strict=True):
        expected, weights = references[models[str(layout)]]
        seen = set()
        for losses, params, counted in by_rank:
            assert losses == pytest.approx(expected, rel=1e-5, abs=1e-5), str(layout)
            for name, value in params.items():
                want = weights[name if name in weights else "tok_emb.weight"]  # tied copy
                np.testing.assert_allclose(value, want, rtol=0, atol=1e-5,
                                           err_msg=f"{layout}: {name}")
                seen.add(name)
            pad = counted["units"] * (layout.dp - 1) * 4  # bytes of each unit's pad, at most
            gathers = layout.microbatches * 3 if layout.zero3_reshard == "forward" else 1
            assert 0 <= counted["all_gather"] - counted["expected"]["all_gather"] \
                <= gathers * pad, str(layout)
            assert 0 <= counted["reduce_scatter"] - counted["expected"]["reduce_scatter"] \
                <= pad, str(layout)
            assert counted["next"][0] == counted["next"][1], str(layout)  # exact resume
        assert seen >= set(weights), str(layout)
        # The checkpoint holds the full tensors, and converts to other layouts unchanged.
        saved = tmp_path / _directory(layout) / f"step-{STEPS:08d}"
        full = read_full_state(saved, kinds=KINDS)[1]
        for name, value in full.items():
            if name.startswith("param/"):
                np.testing.assert_allclose(value.numpy(), weights[name[6:]], rtol=0,
                                           atol=1e-5, err_msg=f"{layout}: {name}")
        for target in (Layout(), Layout.parse(FOUR[1][0])):
            converted = convert(saved, tmp_path / _directory(layout) / _directory(target), target)
            again = read_full_state(converted, kinds=KINDS)[1]
            assert sorted(again) == sorted(full)
            assert all(torch.equal(again[name], full[name]) for name in full)


def test_the_planner_prices_both_reshard_choices():
    """`paraxis plan` considers ZeRO-3 with pp > 1 under both choices: "step" gathers once
    (less dp traffic, the stage's weights held whole), "forward" per microbatch (more
    traffic, less memory), and ZeRO-3 holds less model state than ZeRO-1 by the shards."""
    from paraxis.plan.cost import evaluate
    from paraxis.plan.hardware import build_cluster
    from paraxis.plan.search import Constraints, search

    cfg = PRESETS["llama2-70b"]
    constraints = Constraints(pp=4, zero=3, tp=8, micro_batch=1)
    result = search(cfg, build_cluster("a100-40gb", 64, 8), 4096, 1024, constraints)
    priced = {e.layout.zero3_reshard for e in result.ranked} | {
        r.layout.zero3_reshard for r in result.too_big}
    assert priced == {"forward", "step"}
    # regathering is priced only at settings where keeping the chunks did not fit
    kept = {e.layout for e in result.ranked if e.layout.zero3_reshard == "step"}
    assert kept and all(e.layout.replace(zero3_reshard="step") not in kept
                        for e in result.ranked if e.layout.zero3_reshard == "forward")
    cluster = build_cluster("a100-80gb", 64, 8)
    layout = Layout(dp=2, tp=8, pp=4, zero=3, microbatches=32)
    forward, step = (evaluate(cfg, layout.replace(zero3_reshard=r), cluster, 4096, 64)
                     for r in ("forward", "step"))
    assert step.time["dp_total"] < forward.time["dp_total"]
    assert step.memory["buffers"] > forward.memory["buffers"]
    zero1 = evaluate(cfg, layout.replace(zero=1), cluster, 4096, 64)
    assert forward.memory["params"] == pytest.approx(zero1.memory["params"] / 2)
    assert forward.memory["grads"] == pytest.approx(zero1.memory["grads"] / 2)
    volume = zero3_pipeline_volume(100, 4, "forward", 2, 4, forward_only_params=10)
    assert volume == {"all_gather": 4 * 190 * 2, "reduce_scatter": 100 * 4}
    assert zero3_pipeline_volume(100, 4, "step", 2, 4)["all_gather"] == 200
