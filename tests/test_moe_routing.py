"""DeepSeek-V3's routing: sigmoid scores and group-limited (node-limited) choice.

`router_score = "sigmoid"` scores each expert on its own (DeepSeek-V3 eq. 15) and weighs the
chosen ones by their scores renormalised; `route_groups` / `route_group_limit` cut the
experts into equal groups and let each token choose only inside its best groups, a group
scored by the sum of its best top_k / limit scores (DeepSeek-V3 Sec. 2.1.2; Megatron-LM's
--moe-router-num-groups / --moe-router-group-topk). Checked against a plain-Python
reading of those rules token by token, and on ranks: with the routing bias too, dp2 x ep2
trains like one device.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from paraxis.dist.testing import RankContext, as_layout, run_on_ranks
from paraxis.model.checkpoint.convert import export_hf
from paraxis.model.transformer import MLP
from paraxis.parallel.experts.layer import MoE
from paraxis.spec.errors import ParaxisError
from paraxis.spec.model_config import PRESETS, ModelConfig
from paraxis.train.config import RunConfig
from paraxis.train.loop import run_training

# tiny-moe's 8 experts in 4 groups of 2, a token's top 2 from its best group
DEEPSEEK_LIKE = dict(router_score="sigmoid", route_groups=4, route_group_limit=1,
                     expert_bias=True, expert_bias_rate=0.01)


def _config(**changes: object) -> ModelConfig:
    return dataclasses.replace(PRESETS["tiny-moe"], **{**DEEPSEEK_LIKE, **changes})


def _layer(cfg: ModelConfig) -> MoE:
    torch.manual_seed(0)
    return MoE(cfg, lambda width: MLP(cfg, width))


def test_sigmoid_scores_weigh_the_chosen_experts_renormalised() -> None:
    layer = _layer(_config(route_groups=0, route_group_limit=0, expert_bias=False))
    tokens = torch.randn(16, 64)
    weights, chosen, probs = layer.route(tokens)
    scores = torch.sigmoid(layer.router(tokens).float())
    assert torch.equal(chosen, scores.topk(2, dim=-1).indices)
    picked = scores.gather(-1, chosen)
    assert torch.allclose(weights, picked / picked.sum(-1, keepdim=True))
    # the balance loss averages scores normalised over the experts
    assert torch.allclose(probs, scores / scores.sum(-1, keepdim=True))


def test_groups_limit_each_token_to_its_best_groups() -> None:
    cfg = _config(expert_bias=False)
    layer = _layer(cfg)
    tokens = torch.randn(64, 64)
    _, chosen, _ = layer.route(tokens)
    scores = torch.sigmoid(layer.router(tokens).float())
    per_group = cfg.n_experts // cfg.route_groups
    limit = cfg.route_group_limit
    for token in range(tokens.shape[0]):
        row = scores[token].tolist()
        # a group's score: the sum of its best top_k / limit = 2 expert scores
        group_scores = [sum(sorted(row[g * per_group:(g + 1) * per_group])[-2:])
                        for g in range(cfg.route_groups)]
        best = sorted(range(cfg.route_groups), key=lambda g: -group_scores[g])[:limit]
        allowed = [e for g in best for e in range(g * per_group, (g + 1) * per_group)]
        want = sorted(allowed, key=lambda e: -row[e])[:cfg.top_k]
        assert sorted(chosen[token].tolist()) == sorted(want), token
    # the limit bites: free routing sends some tokens to two groups, this one never
    free = _layer(_config(route_groups=0, route_group_limit=0, expert_bias=False))
    spans = [{e // per_group for e in row.tolist()} for row in free.route(tokens)[1]]
    assert any(len(groups) > 1 for groups in spans)
    assert all(len({e // per_group for e in row.tolist()}) == 1 for row in chosen)


@pytest.mark.parametrize(("changes", "message"), [
    (dict(router_score="tanh"), "router_score 'tanh' is unknown"),
    (dict(route_groups=3), "route_groups 3 must divide n_experts"),
    (dict(route_group_limit=5), "route_group_limit 5 be within 1..route_groups"),
    (dict(route_groups=8, route_group_limit=1), "top_k / route_group_limit at most"),
    (dict(route_groups=2, route_group_limit=2, top_k=3), "multiple of route_group_limit 2"),
])
def test_bad_routing_fields_are_one_line_errors(changes: dict, message: str) -> None:
    with pytest.raises(ParaxisError, match=message) as error:
        _config(**changes)
    assert "\n" not in str(error.value)


def test_a_dense_model_refuses_routing_fields() -> None:
    for field in (dict(router_score="sigmoid"), dict(route_group_limit=4)):
        with pytest.raises(ParaxisError, match="need a mixture of experts"):
            dataclasses.replace(PRESETS["tiny-llama"], **field)


# --------------------------------------------------------------------------- on ranks


def _train(model: str, layout: str, root: str) -> list[float]:
    cfg = RunConfig.from_flags(model=model, steps=4, global_batch=8, seq_len=64, warmup=1,
                               device="cpu", quiet=True, layout=as_layout(layout),
                               checkpoint_dir=root, checkpoint_every=4)
    return [r["loss"] for r in run_training(cfg)]


def _on_ranks(ctx: RankContext, model: str, root: str) -> list[float]:
    return _train(model, str(ctx.layout), f"{root}/{ctx.layout}")


def test_dp2_ep2_routes_and_trains_like_one_device(tmp_path) -> None:
    path = tmp_path / "deepseek-like.json"
    path.write_text(json.dumps(dataclasses.asdict(_config(name="deepseek-like"))))
    want = _train(str(path), "dp=1", str(tmp_path / "one"))
    (by_rank,) = run_on_ranks(["dp=2,ep=2"], _on_ranks, str(path), str(tmp_path),
                              timeout_s=300)
    assert max(abs(a - b) for a, b in zip(by_rank[0], want, strict=True)) <= 1e-5
    # Mixtral's format routes by a softmax over all experts: it cannot hold this model
    with pytest.raises(ParaxisError, match="Mixtral's format routes by a softmax"):
        export_hf(tmp_path / "one" / "step-00000004", tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_the_routing_is_described_where_it_is_shown() -> None:
    """`paraxis experts` and the report name the routing a model runs (moe.config_checks)."""
    from paraxis.spec.model_config import routing_text

    assert routing_text(PRESETS["mixtral-8x7b"]) == "top 2 of 8 by softmax scores"
    deepseek = _config()
    text = routing_text(deepseek)
    assert ("sigmoid" in text) == (deepseek.router_score == "sigmoid")
    assert ("groups" in text) == bool(deepseek.route_groups)
    assert ("routing bias" in text) == deepseek.expert_bias
