"""The mixture-of-experts block on one device: shapes and parameter counts, routing as
Mixtral routes, the aux loss's injected gradient equal to adding it to the loss, capacity."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from paraxis.model.transformer import build_model
from paraxis.parallel.experts.layer import aux_loss_value, moe_layers, set_aux_loss_scale
from paraxis.spec.errors import ParaxisError
from paraxis.spec.model_config import PRESETS, ModelConfig


@pytest.mark.parametrize("name", ["tiny-moe", "tiny-moe-shared"])
def test_parameter_counts_match_the_model(name: str) -> None:
    cfg = PRESETS[name]
    model = build_model(cfg)
    assert sum(p.numel() for p in model.parameters()) == cfg.num_params()
    per_expert = cfg.expert_params()
    idle = cfg.n_moe_layers * (cfg.n_experts - cfg.top_k) * per_expert
    assert cfg.num_active_params() == cfg.num_params() - idle


def test_published_moe_shapes_have_their_published_sizes() -> None:
    # Mixtral 8x7B: 46.7B total, 12.9B active; 8x22B: 141B, 39B (Mistral AI's model cards);
    # DeepSeek-V3: 671B total, 37B active (its attention modelled as plain MHA).
    for name, total, active in (("mixtral-8x7b", 46.7, 12.9), ("mixtral-8x22b", 141, 39),
                                ("deepseek-v3-style", 671, 37)):
        cfg = PRESETS[name]
        assert cfg.num_params() / 1e9 == pytest.approx(total, rel=0.01)
        assert cfg.num_active_params() / 1e9 == pytest.approx(active, rel=0.05)


def test_first_dense_layers_keep_a_dense_mlp() -> None:
    model = build_model(PRESETS["tiny-moe-shared"])
    assert hasattr(model.blocks[0], "mlp") and not hasattr(model.blocks[0], "moe")
    assert all(hasattr(b, "moe") for b in list(model.blocks)[1:])
    assert moe_layers(model)[0].shared.up.weight.shape[0] == 48


def test_routing_is_mixtrals_softmax_topk_renormalised() -> None:
    cfg = PRESETS["tiny-moe"]
    layer = moe_layers(build_model(cfg, seed=3))[0]
    tokens = torch.randn(10, cfg.d_model)
    weights, chosen, _ = layer.route(tokens)
    logits = tokens @ layer.router.weight.T
    # Hugging Face's MixtralSparseMoeBlock: softmax in fp32, topk, divide by the kept sum
    expected = F.softmax(logits, dim=-1, dtype=torch.float).topk(2, dim=-1)
    assert torch.equal(chosen, expected.indices)
    torch.testing.assert_close(weights, expected.values / expected.values.sum(-1, True))
    # the output is the weighted sum of the chosen experts
    out = layer(tokens.unsqueeze(0)).squeeze(0)
    by_hand = torch.stack([sum(w * layer.experts[int(e)](t) for w, e in zip(ws, es,
                                                                            strict=True))
                           for t, ws, es in zip(tokens, weights, chosen, strict=True)])
    torch.testing.assert_close(out, by_hand)


def test_injected_aux_gradient_equals_adding_the_aux_loss() -> None:
    # the router's regulariser: the load-balancing loss and ST-MoE's z-loss
    cfg = PRESETS["tiny-moe-shared"].replace(aux_loss_coef=0.1, z_loss_coef=0.01)
    x = torch.randint(0, 256, (2, 32))
    y = torch.randint(0, 256, (2, 32))
    injected = build_model(cfg, seed=1)
    set_aux_loss_scale(moe_layers(injected), 0.5)  # as an engine does for two microbatches
    (injected(x, y) * 0.5).backward()

    explicit = build_model(cfg, seed=1)
    set_aux_loss_scale(moe_layers(explicit), 0.0)  # nothing injected: the aux loss is added by hand
    auxes: list[torch.Tensor] = []
    zs: list[torch.Tensor] = []

    def recompute_aux(layer: torch.nn.Module, inputs: tuple[torch.Tensor, ...],
                      output: torch.Tensor) -> None:
        tokens = inputs[0].reshape(-1, cfg.d_model)
        logits = layer.router(tokens)
        probs = F.softmax(logits, dim=-1, dtype=torch.float32)
        auxes.append(layer._aux_loss(layer.last_counts, probs, tokens.shape[0]))
        zs.append((torch.logsumexp(logits, dim=-1) ** 2).mean())

    for layer in moe_layers(explicit):
        layer.register_forward_hook(recompute_aux)
    loss = explicit(x, y)
    (0.5 * (loss + cfg.aux_loss_coef * sum(auxes) + cfg.z_loss_coef * sum(zs))).backward()
    for (name, a), (_, b) in zip(injected.named_parameters(), explicit.named_parameters(),
                                 strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-8, msg=name)
    assert aux_loss_value(injected) == pytest.approx(cfg.aux_loss_coef * float(sum(auxes).detach()))
    # the router's gradient really comes partly from the aux loss
    plain = build_model(cfg.replace(aux_loss_coef=0.0, z_loss_coef=0.0), seed=1)
    (plain(x, y) * 0.5).backward()
    router = "blocks.1.moe.router.weight"
    assert not torch.allclose(dict(plain.named_parameters())[router].grad,
                              dict(injected.named_parameters())[router].grad)


def test_aux_loss_is_one_when_balanced_and_larger_when_not() -> None:
    cfg = PRESETS["tiny-moe"]
    layer = moe_layers(build_model(cfg))[0]
    uniform = torch.full((16, cfg.n_experts), 1 / cfg.n_experts)
    balanced = torch.full((cfg.n_experts,), 4)
    assert float(layer._aux_loss(balanced, uniform, 16)) == pytest.approx(1.0)
    skewed = torch.zeros(cfg.n_experts, dtype=torch.long)
    skewed[0] = 32
    peaked = torch.zeros(16, cfg.n_experts)
    peaked[:, 0] = 1
    assert float(layer._aux_loss(skewed, peaked, 16)) == pytest.approx(cfg.n_experts)


def test_capacity_factor_drops_the_late_tokens_of_a_full_expert() -> None:
    cfg = PRESETS["tiny-moe"].replace(capacity_factor=1.0)
    layer = moe_layers(build_model(cfg))[0]
    chosen = torch.tensor([[0, 1]] * 6 + [[2, 3]] * 2)  # 8 tokens, top 2, 8 experts
    keep = layer._within_capacity(chosen)  # capacity ceil(1.0 * 8 * 2 / 8) = 2 per expert
    assert keep is not None and layer.last_dropped == 8
    assert keep[:2].all() and not keep[2:6].any() and keep[6:].all()
    dropless = moe_layers(build_model(PRESETS["tiny-moe"]))[0]
    assert dropless._within_capacity(chosen) is None


def test_moe_shapes_are_checked_in_one_line() -> None:
    base = PRESETS["tiny-llama"]
    with pytest.raises(ParaxisError, match="top_k 9 exceeds n_experts 8"):
        base.replace(n_experts=8, top_k=9, d_ff_expert=32)
    with pytest.raises(ParaxisError, match="need n_experts > 0"):
        base.replace(top_k=2)
    with pytest.raises(ParaxisError, match="llama-style"):
        ModelConfig("m", "gpt2", 256, 2, 64, 4, 4, 256, 128, n_experts=4, top_k=1,
                    d_ff_expert=32)
