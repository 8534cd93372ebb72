"""Hybrid sharding (`dp_shard`): ZeRO within groups of dp ranks, replicas across them.

- The groups: rank order, shard groups of consecutive ranks (inside a node), the replicate
  groups across them, experts inside a shard group; bad values are one-line errors.
- Equivalence (fp32, 8 gloo ranks, one launch): ZeRO-1/2/3 sharded within groups of 2 or 4
  dp ranks, alone and with tp, pp (ZeRO-3 under a pipeline), cp and ep, train tiny models
  like one device, loss and gradient norm step by step; bf16, bf16-fp32grad and fp16 too,
  against the same policy sharded over every dp rank.
- Checkpoints: a hybrid run's step-3 checkpoint is written once (one copy of every shard)
  and resumes in a plain ZeRO layout and on one device like the straight run; a plain run's
  checkpoint resumes in a hybrid layout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from paraxis.dist.testing import RankContext, run_on_ranks
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import Layout
from paraxis.train.config import RunConfig
from paraxis.train.loop import run_training

ROOT = Path(__file__).parents[1]

LOSS_TOL, NORM_TOL = 1e-5, 5e-5


def _cfg(model: str, layout: str, steps: int = 5, **options) -> RunConfig:
    return RunConfig.from_flags(model=model, steps=steps, global_batch=16, seq_len=32,
                                lr=3e-3, warmup=2, quiet=True, layout=Layout.parse(layout),
                                **options)


# ------------------------------------------------------------------------------ groups


def test_shard_groups_are_consecutive_ranks_and_replicas_cross_them():
    layout = Layout(dp=4, dp_shard=2, tp=2, zero=1)
    # dp rank = copy * dp_shard + index in the shard group; tp innermost
    assert layout.groups("dp") == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert layout.groups("dp_shard") == [[0, 2], [4, 6], [1, 3], [5, 7]]
    assert layout.groups("dp_replicate") == [[0, 4], [2, 6], [1, 5], [3, 7]]
    # one shard group and its tp partners: ranks 0..3, one node of 4 GPUs
    assert sorted(layout.group_of(0, "dp_shard") + layout.group_of(1, "dp_shard")) == \
        [0, 1, 2, 3]
    assert (layout.shard_size, layout.replicas, layout.hybrid) == (2, 2, True)


def test_groups_with_context_and_expert_parallelism():
    layout = Layout(dp=4, dp_shard=2, cp=2, ep=2, zero=3)
    # a shard group is dp_shard x cp consecutive dp x cp ranks
    assert layout.groups("dp_shard") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert layout.groups("dp_replicate") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    # expert groups sit inside a shard group; the ranks there holding the same experts
    assert layout.groups("ep") == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert layout.groups("expert_shard") == [[0, 2], [1, 3], [4, 6], [5, 7]]


def test_plain_zero_is_one_shard_group():
    assert Layout(dp=4, dp_shard=4, zero=1) == Layout(dp=4, zero=1)  # dp_shard=dp: plain
    layout = Layout(dp=4, zero=2)
    assert layout.groups("dp_shard") == layout.groups("dp")
    assert not layout.hybrid and layout.replicas == 1


def test_layout_text_round_trip():
    layout = Layout.parse("dp=8,dp_shard=4,zero=3,tp=1")
    assert str(layout) == "dp=8,tp=1,pp=1,zero=3,dp_shard=4"
    assert Layout.parse(str(layout)) == layout


@pytest.mark.parametrize("text, says", [
    ("dp=4,dp_shard=3,zero=1", "must divide dp=4"),
    ("dp=4,dp_shard=-2,zero=1", "must divide dp=4"),
    ("dp=4,dp_shard=2", "zero=0 shards nothing"),
    ("dp=4,dp_shard=2,zero=1,ep=4", r"ep=4 must divide dp_shard\*cp = 2"),
])
def test_bad_values_are_one_line_errors(text, says):
    with pytest.raises(ParaxisError, match=says) as error:
        Layout.parse(text)
    assert "\n" not in str(error.value)


def test_command_line_refuses_a_bad_shard_size(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "paraxis", "train", "--model", "tiny", "--dp", "4",
         "--dp-shard", "3", "--zero", "1", "--nproc", "4", "--steps", "1"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)})  # a checkout not installed finds paraxis
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "dp_shard=3 must divide dp=4" in lines[0], result.stderr


# ---------------------------------------------------------------------- equivalence

# (model, layout, precision): every hybrid layout, fp32, against one device
HYBRID = [
    ("tiny", "dp=8,dp_shard=4,zero=1", "fp32"),
    ("tiny", "dp=8,dp_shard=2,zero=2,microbatches=2", "fp32"),
    ("tiny-llama", "dp=4,dp_shard=2,tp=2,zero=3", "fp32"),
    ("tiny", "dp=4,dp_shard=2,pp=2,zero=3,microbatches=2", "fp32"),
    ("tiny", "dp=2,dp_shard=1,pp=2,tp=2,zero=1,microbatches=2", "fp32"),
    ("tiny-llama", "dp=4,dp_shard=2,cp=2,zero=2", "fp32"),
    ("tiny-moe", "dp=4,dp_shard=2,ep=2,tp=2,zero=3", "fp32"),
    ("tiny-moe", "dp=4,dp_shard=2,cp=2,ep=4,zero=1", "fp32"),
    ("tiny", "dp=4,dp_shard=2,pp=2,zero=3,zero3_reshard=step,microbatches=2", "fp32"),
    # 16-bit policies against the same policy sharded over every dp rank (their twins)
    ("tiny", "dp=8,dp_shard=2,zero=3", "bf16"),
    ("tiny", "dp=8,zero=3", "bf16"),
    ("tiny", "dp=8,dp_shard=4,zero=2", "fp16"),
    ("tiny", "dp=8,zero=2", "fp16"),
    ("tiny", "dp=8,dp_shard=2,zero=1", "bf16-fp32grad"),
    ("tiny", "dp=8,zero=1", "bf16-fp32grad"),
]


def _reference(index: int, results: list, single: dict) -> list:
    model, layout, precision = HYBRID[index]
    if precision == "fp32":
        return single[model]
    plain = str(Layout.parse(layout).replace(dp_shard=0))
    twin = next(i for i, (m, text, p) in enumerate(HYBRID)
                if m == model and p == precision and str(Layout.parse(text)) == plain)
    return results[twin]


def _equivalence_body(ctx: RankContext, root: str) -> list:
    out = []
    for model, layout, precision in HYBRID:
        records = run_training(_cfg(model, layout, precision=precision))
        out.append([(r["loss"], r["grad_norm"]) for r in records])
    # checkpoints: a hybrid run writes step 3, plain ZeRO resumes it; and the other way
    run_training(_cfg("tiny-llama", "dp=4,dp_shard=2,tp=2,zero=3", checkpoint_dir=f"{root}/h",
                      exit_after=3))
    out.append([r["loss"] for r in run_training(
        _cfg("tiny-llama", "dp=8,zero=1", resume=f"{root}/h"))])
    run_training(_cfg("tiny-llama", "dp=8,zero=2", checkpoint_dir=f"{root}/p", exit_after=3))
    out.append([r["loss"] for r in run_training(
        _cfg("tiny-llama", "dp=8,dp_shard=2,zero=3", resume=f"{root}/p"))])
    return out


@pytest.mark.slow
def test_hybrid_layouts_train_like_one_device(tmp_path):
    results = run_on_ranks(8, _equivalence_body, str(tmp_path), timeout_s=400)[0]
    single = {}
    for model in {m for m, _, p in HYBRID if p == "fp32"} | {"tiny-llama"}:
        single[model] = [(r["loss"], r["grad_norm"])
                         for r in run_training(_cfg(model, "dp=1"))]
    for index, ((_model, layout, precision), steps) in enumerate(
            zip(HYBRID, results, strict=False)):
        reference = _reference(index, results, single)
        assert len(steps) == 5, layout
        for (loss, norm), (ref_loss, ref_norm) in zip(steps, reference, strict=True):
            tol = (LOSS_TOL, NORM_TOL) if precision == "fp32" else (1e-3, 1e-2)
            assert loss == pytest.approx(ref_loss, rel=tol[0]), (layout, precision)
            assert norm == pytest.approx(ref_norm, rel=tol[1]), (layout, precision)
    hybrid_to_plain, plain_to_hybrid = results[len(HYBRID):]
    straight = [loss for loss, _ in single["tiny-llama"]][3:]
    assert hybrid_to_plain == pytest.approx(straight, rel=LOSS_TOL)
    assert plain_to_hybrid == pytest.approx(straight, rel=LOSS_TOL)
    # one copy of every shard on disk: the manifest's files hold each tensor's pieces once
    one_device = [r["loss"] for r in run_training(
        _cfg("tiny-llama", "dp=1", resume=str(tmp_path / "h")))]
    assert one_device == pytest.approx(straight, rel=LOSS_TOL)
    manifest = json.loads(next(Path(tmp_path, "h").glob("step-*/manifest.json")).read_text())
    assert manifest["layout"] == "dp=4,tp=2,pp=1,zero=3,dp_shard=2"
    copy_0 = {f"rank-{rank:05d}.safetensors" for rank in range(4)}  # dp ranks 0, 1 x tp 2
    assert {piece["file"] for piece in manifest["pieces"]} == copy_0
    keys = [(p["kind"], p["name"], p["tp_index"], p["lo"]) for p in manifest["pieces"]]
    assert len(keys) == len(set(keys))


def _states_body(ctx: RankContext) -> tuple[int, int]:
    import torch

    from paraxis.dist.groups import build_groups
    from paraxis.parallelize import build_engine
    from paraxis.spec.model_config import PRESETS

    sizes = []
    for text in ("dp=8,zero=1", "dp=8,dp_shard=4,zero=1"):
        layout = Layout.parse(text)
        engine = build_engine(PRESETS["tiny"], layout, build_groups(layout),
                              torch.device("cpu"), seed=0, seq_len=32)
        sizes.append(engine.memory_report()["optimizer"])
    return tuple(sizes)


def test_states_are_sharded_within_the_shard_group_only():
    """ZeRO-1 over 8 ranks holds 1/8 of AdamW's moments per rank, within groups of 4 a
    quarter: twice as much (the pad of each bucket aside)."""
    plain, hybrid = run_on_ranks(8, _states_body, timeout_s=120)[0]  # rank 0's
    assert hybrid == pytest.approx(2 * plain, rel=0.01)


# ------------------------------------------------------------------------------ planner


def _thin_cluster(gpus: int = 128):
    from paraxis.plan.hardware import build_cluster, cluster_preset

    return build_cluster(gpus=gpus, overrides=cluster_preset("ethernet-1nic"))


def test_planner_states_shard_within_the_group():
    """A hybrid layout holds the model states of plain ZeRO over its shard group alone."""
    from paraxis.plan.memory import layout_memory
    from paraxis.spec.model_config import PRESETS

    cfg = PRESETS["llama2-7b"]
    hybrid = layout_memory(cfg, Layout(dp=64, dp_shard=8, zero=3), 4096, 1)
    plain_over_8 = layout_memory(cfg, Layout(dp=8, zero=3), 4096, 1)
    for key in ("params", "grads", "optimizer"):
        assert hybrid[key] == plain_over_8[key]


@pytest.mark.parametrize("text", ["dp=4,dp_shard=2,tp=2,zero=1", "dp=8,dp_shard=4,cp=2,zero=3",
                                  "dp=4,dp_shard=2,cp=2,ep=2,pp=2,zero=2"])
def test_planner_groups_are_the_layouts(text):
    """The planner's rank-0 groups (kept fast for the search) are `Layout.groups`' first,
    the groups the runtime builds."""
    from paraxis.plan.context import hybrid_group_ranks

    layout = Layout.parse(text)
    degrees = tuple(layout.degrees.items())
    shard = hybrid_group_ranks(degrees, layout.shard_size, "shard")
    assert list(shard) == layout.groups("dp_shard")[0]
    assert list(hybrid_group_ranks(degrees, layout.shard_size, "copies")) == \
        layout.groups("dp_replicate")[0]
    assert list(shard[::layout.ep]) == layout.groups("expert_shard")[0]


def test_planner_prices_the_copies_all_reduce_on_their_own_link():
    """Shard groups of 8 consecutive ranks ride NVLink; their 16 copies (one rank per node)
    share the node's one NIC; the all-reduce of each shard across them moves 2 (c-1)/c of
    1/8 of the gradients."""
    from paraxis.plan.comm import collective_time, copies_sync_time
    from paraxis.plan.context import copies_link, zero_link

    cluster = _thin_cluster()
    layout = Layout(dp=128, dp_shard=8, zero=1)
    shard, across = zero_link(layout, cluster), copies_link(layout, cluster)
    assert not shard.crosses_nodes and across.crosses_nodes and across.nodes == 16
    assert copies_link(Layout(dp=128, zero=1), cluster) is None
    params = 7e9
    seconds = copies_sync_time(params, 8, 1, 16, across, 2, 1, bucket_bytes=0)
    assert seconds == collective_time("all_reduce", params * 2 / 8, 16, across)
    assert seconds > 2 * (15 / 16) * params * 2 / 8 / across.bandwidth_Bps  # bytes at least


def test_search_picks_hybrid_sharding_on_a_thin_network_and_defends_it():
    """One 100 Gb/s NIC per 8-GPU node: ZeRO-3 over 128 ranks gathers every layer across the
    network, within a node it does not; the search finds that and the defence says so."""
    from paraxis.plan.cost import evaluate
    from paraxis.plan.explain import explain
    from paraxis.plan.search import Constraints, search
    from paraxis.spec.model_config import PRESETS
    from paraxis.spec.precision import PRECISIONS

    cfg, cluster = PRESETS["llama2-7b"], _thin_cluster()
    bf16 = PRECISIONS["bf16"]
    plain = evaluate(cfg, Layout(dp=128, zero=3, microbatches=4), cluster, 4096, 512, bf16)
    hybrid = evaluate(cfg, Layout(dp=128, dp_shard=8, zero=3, microbatches=4), cluster, 4096,
                      512, bf16)
    assert hybrid.fits and hybrid.step_time_s < plain.step_time_s / 2
    result = search(cfg, cluster, 4096, 512, Constraints(), bf16)
    best = result.ranked[0]
    assert best.layout.hybrid and best.layout.shard_size * best.layout.tp <= 8
    lines = explain(cfg, cluster, best, result, bf16)
    line = next(line for line in lines if line.startswith("DP="))
    assert f"sharded within groups of {best.layout.shard_size} dp ranks" in line
    assert "inside one node" in line and "Sharding over all" in line
    fixed = search(cfg, cluster, 4096, 512, Constraints(dp_shard=4), bf16)
    assert fixed.ranked and all(e.layout.shard_size == 4 for e in fixed.ranked)


def test_one_node_never_tries_hybrid_sharding():
    from paraxis.plan.hardware import build_cluster
    from paraxis.plan.search import search
    from paraxis.spec.model_config import PRESETS

    result = search(PRESETS["llama2-7b"], build_cluster(gpus=8), 4096, 64)
    assert result.ranked and not any(e.layout.hybrid for e in result.ranked)


def test_docs_table_is_what_the_planner_prints():
    """Every row of docs/hybrid.md's table, priced again."""
    from paraxis.plan.cost import evaluate
    from paraxis.plan.hardware import build_cluster, cluster_preset
    from paraxis.spec.model_config import PRESETS
    from paraxis.spec.precision import PRECISIONS

    text = (Path(__file__).resolve().parents[1] / "docs" / "hybrid.md").read_text()
    rows = [line.strip("|").split("|") for line in text.splitlines()
            if line.startswith("| ethernet-1nic") or line.startswith("| dgx-a100")]
    assert len(rows) == 8
    for cluster_name, layout, step, dp, gb in (map(str.strip, row) for row in rows):
        cluster = build_cluster(gpus=128, overrides=cluster_preset(cluster_name))
        e = evaluate(PRESETS["llama2-7b"], Layout.parse(layout), cluster, 4096, 512,
                     PRECISIONS["bf16"])
        assert (f"{e.step_time_s:.2f}", f"{e.time['dp']:.2f}",
                f"{e.memory['total'] / 1e9:.1f}") == (step, dp, gb), (cluster_name, layout)
