"""Expert tensor parallelism (layout `etp` = tp): each expert split over the tp ranks.

With etp = tp every routed expert and the shared experts are split as the dense MLP is
(gate and up by columns, down by rows) inside one TP region around the MoE block
(`tensor_parallel.apply.ExpertsRegion`), so no tp rank repeats another's expert work.
Checked on tiny-moe-shared (a dense first block, a shared expert) with the router z-loss
and the aux-loss-free routing bias, 6 steps, one launch of 4 ranks:

- dp2 x tp2 (no SP), dp2 x tp2 (SP) x ep2 with ZeRO-3, tp2 (SP) x pp2 with full
  recompute train like one device: losses within 1e-5 step by step, gradient norms within
  1e-5 relatively, the same biases;
- dp2 x tp2 (SP) x ep2 with etp = 1 resumes the etp = 2 ZeRO-3 run's step-3 checkpoint
  and goes on like one device (checkpoints cross etp);
- under a capacity factor whole experts with SP gather the sequence: dp2 x tp2 (SP) x ep2
  drops, step by step, the assignments dp2 x tp2 without SP drops, and trains its numbers;
- each rank holds 1/tp of every expert: its parameter count is the planner's
  (`plan.memory.stage_local_params`);
- the TP plan and the checkpoint converter agree on which dims are split; bad etp values
  are one-line errors; a run with whole experts under tp (etp = 1) says they repeat their
  work.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
from pathlib import Path

import pytest
import torch

from paraxis.dist.testing import RankContext, as_layout, run_on_ranks
from paraxis.model.checkpoint import read_full_state
from paraxis.model.transformer import parameter_shapes
from paraxis.parallel.tensor.apply import tp_plan, tp_split_dim
from paraxis.parallelize import build_engine
from paraxis.plan.experts import feed_forward
from paraxis.plan.memory import stage_local_params
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import PRESETS, ModelConfig
from paraxis.spec.partition import partition_layers
from paraxis.train.config import RunConfig
from paraxis.train.loop import run_training

STEPS, SAVE_AT, SEQ = 6, 3, 64
LOSS_TOL = NORM_TOL = 1e-5
LAYOUTS = ["dp=2,tp=2,etp=2", "dp=2,tp=2,etp=2,sp=true,ep=2,zero=3",
           "tp=2,etp=2,sp=true,pp=2,microbatches=2,recompute=full,zero=1",
           "dp=2,tp=2,sp=true,ep=2,zero=3", "dp=2,tp=2"]
RESUMES = {LAYOUTS[3]: LAYOUTS[1]}  # layout -> the layout whose step-3 checkpoint it resumes
# Whole experts under a capacity factor: with SP the block gathers the sequence, so each tp
# rank drops what the dp rank's whole sequence overflows, as without SP (a shard's capacity
# would drop other tokens). At 0.5 every block drops assignments.
CAPACITY, GATHERS = 0.5, (LAYOUTS[3], LAYOUTS[4])


def _config(**changes: object) -> ModelConfig:
    return dataclasses.replace(PRESETS["tiny-moe-shared"], **{
        "name": "tiny-moe-etp", "z_loss_coef": 1e-3, "expert_bias": True,
        "expert_bias_rate": 0.01, **changes})


CFG = _config()
BIASES = [f"blocks.{i}.moe.expert_bias" for i in range(CFG.first_dense_layers, CFG.n_layers)]


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("model") / "tiny-moe-etp.json"
    path.write_text(json.dumps(dataclasses.asdict(CFG)))
    path.with_name("capacity.json").write_text(json.dumps(dataclasses.asdict(
        CFG.replace(capacity_factor=CAPACITY))))
    return str(path)


def _run(model: str, layout: str, root: str, **options: object) -> list[tuple[float, ...]]:
    """(loss, gradient norm, aux loss, z-loss) of every step (and the assignments each block
    dropped, under a capacity factor)."""
    fields = dict(model=model, steps=STEPS, global_batch=8, seq_len=SEQ, warmup=2,
                  device="cpu", quiet=True, layout=as_layout(layout), checkpoint_dir=root,
                  checkpoint_every=SAVE_AT)
    return [(r["loss"], r["grad_norm"], r["aux_loss"], r["z_loss"],
             *([tuple(r["dropped_tokens"])] if "dropped_tokens" in r else []))
            for r in run_training(RunConfig.from_flags(**{**fields, **options}))]


def _saved(root: Path | str, layout: str, step: int) -> Path:
    return Path(root) / str(as_layout(layout)) / f"step-{step:08d}"


def _biases(checkpoint: Path) -> dict[str, torch.Tensor]:
    state = read_full_state(checkpoint)[1]
    return {name: state[name] for name in BIASES}


@pytest.fixture(scope="module")
def one_device(model_file: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One device's losses and last checkpoint, with one and with two microbatches."""
    runs = {}
    for microbatches in (1, 2):
        root = tmp_path_factory.mktemp(f"one-{microbatches}")
        layout = "dp=1" if microbatches == 1 else "dp=1,microbatches=2"
        runs[microbatches] = (_run(model_file, layout, str(root)), root / f"step-{STEPS:08d}")
    return runs


def _on_ranks(ctx: RankContext, model: str, root: str) -> dict:
    layout = str(ctx.layout)
    with contextlib.redirect_stderr(io.StringIO()) as notes:
        result: dict = {"losses": _run(model, layout, f"{root}/{layout}")}
    result["notes"] = notes.getvalue()
    engine = build_engine(CFG, ctx.layout, ctx.groups, "cpu", seed=0)
    result["params"] = sum(p.numel() for p in engine.model.parameters())
    result["pp_rank"] = ctx.groups.pp_rank
    source = {str(as_layout(k)): v for k, v in RESUMES.items()}.get(layout)
    if source is not None:
        result["resumed"] = _run(model, layout, f"{root}/{layout}-resumed",
                                 resume=str(_saved(root, source, SAVE_AT)))
    if layout in {str(as_layout(text)) for text in GATHERS}:
        result["capacity"] = _run(str(Path(model).with_name("capacity.json")), layout,
                                  f"{root}/{layout}-capacity", steps=3)
    return result


@pytest.fixture(scope="module")
def layouts(model_file: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[list, Path]:
    root = tmp_path_factory.mktemp("layouts")
    return run_on_ranks(LAYOUTS, _on_ranks, model_file, str(root), timeout_s=500), root


def _assert_close(what: str, steps: list[tuple[float, ...]],
                  want: list[tuple[float, ...]]) -> None:
    assert len(steps) == len(want), what
    # the routing metrics (aux and z-loss, averaged over dp, and over tp on shards)
    regulariser = max(abs(a[i] - b[i]) for a, b in zip(steps, want, strict=True) for i in (2, 3))
    assert regulariser <= LOSS_TOL, f"{what}: aux or z-loss differ by {regulariser:.2e}"
    worst = max(abs(a[0] - b[0]) for a, b in zip(steps, want, strict=True))
    assert worst <= LOSS_TOL, f"{what}: losses differ by {worst:.2e}"
    norms = max(abs(a[1] / b[1] - 1) for a, b in zip(steps, want, strict=True))
    assert norms <= NORM_TOL, f"{what}: gradient norms differ by {norms:.2e} (relative)"


def test_split_experts_train_like_one_device(one_device, layouts):
    results, root = layouts
    for text, by_rank in zip(LAYOUTS, results, strict=True):
        layout = as_layout(text)
        want, last = one_device[layout.microbatches]
        _assert_close(text, by_rank[0]["losses"], want)
        biases, wanted = _biases(_saved(root, text, STEPS)), _biases(last)
        assert all(torch.equal(biases[n], wanted[n]) for n in BIASES), text
        assert any(wanted[n].abs().max() > 0 for n in BIASES)  # the biases moved
        # whole experts that repeat their work on every tp rank: the run says so when it
        # starts; on SP's sequence shards (the etp=1 layout here) they do not
        assert ("repeats their work" in by_rank[0]["notes"]) == (
            feed_forward(CFG, layout) == "whole")
        if "resumed" in by_rank[0]:  # another etp's checkpoint
            _assert_close(f"{text} resuming {RESUMES[text]}", by_rank[0]["resumed"],
                          want[SAVE_AT:])


def test_whole_experts_under_a_capacity_factor_drop_what_the_whole_sequence_overflows(
        layouts):
    """SP's gather path (capacity factor, etp=1) trains the numbers of the same run without
    SP, where every tp rank holds the whole sequence: the same drops, losses and norms."""
    results, _ = layouts
    gathered, whole = (results[LAYOUTS.index(text)][0]["capacity"] for text in GATHERS)
    assert feed_forward(CFG.replace(capacity_factor=CAPACITY), as_layout(GATHERS[0])) \
        == "whole"
    assert all(min(step[4]) > 0 for step in whole), whole  # the capacity binds
    assert [step[4] for step in gathered] == [step[4] for step in whole]
    _assert_close(f"{GATHERS[0]} against {GATHERS[1]}", [step[:4] for step in gathered],
                  [step[:4] for step in whole])


def test_each_rank_holds_its_share_of_every_expert(layouts):
    """A rank's parameters: the planner's count of its stage, dense and experts (the
    planner divides the norms by tp with the matrices: they are whole on every rank)."""
    results, _ = layouts
    for text, by_rank in zip(LAYOUTS, results, strict=True):
        layout = as_layout(text)
        shares, split = stage_local_params(CFG, layout, SEQ), partition_layers(CFG, layout.pp)
        for result in by_rank:
            stage = result["pp_rank"]
            dense, experts = shares[stage]
            norms = CFG.d_model * (2 * len(split.blocks_of(stage)) + split.has_head(stage))
            assert result["params"] == round(dense + experts + norms * (layout.tp - 1)
                                             / layout.tp), text


def test_the_plan_splits_every_expert_like_the_dense_mlp():
    names = parameter_shapes(CFG)
    plan = tp_plan(split_experts=True)
    assert tp_split_dim("blocks.1.moe.experts.3.up.weight", plan) == 0
    assert tp_split_dim("blocks.1.moe.experts.3.gate.weight", plan) == 0
    assert tp_split_dim("blocks.1.moe.experts.3.down.weight", plan) == 1
    assert tp_split_dim("blocks.1.moe.shared.down.weight", plan) == 1
    assert tp_split_dim("blocks.1.moe.router.weight", plan) is None
    routed = [n for n in names if ".moe.experts." in n or ".moe.shared." in n]
    assert routed and all(tp_split_dim(n) is None for n in routed)  # etp = 1: whole
    assert all(tp_split_dim(n, plan) is not None for n in routed)


@pytest.mark.parametrize("text, model, message", [
    ("tp=2,etp=3", None, "must be 1 .* or tp=2"),
    ("etp=2", None, "must be 1 .* or tp=1"),
    ("tp=2,etp=2", PRESETS["tiny-llama"], "splits experts, and tiny-llama has none"),
    ("tp=2,etp=2", _config(d_ff_expert=47), "expert width 47 is not divisible by etp=2"),
])
def test_bad_etp_is_a_one_line_error(text, model, message):
    with pytest.raises(ParaxisError, match=message) as error:
        Layout.parse(text).validate(model=model)
    assert "\n" not in str(error.value)
