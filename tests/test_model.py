"""The reference model: shapes agree with ModelConfig, init depends on (seed, name) only."""

import pytest
import torch

from paraxis.model.init_weights import init_parameter
from paraxis.model.transformer import build_model
from paraxis.spec.model_config import PRESETS


@pytest.mark.parametrize("name", ["tiny", "tiny-llama", "small", "small-llama"])
def test_parameter_count_matches_the_config_formula(name):
    cfg = PRESETS[name]
    model = build_model(cfg)
    assert sum(p.numel() for p in model.parameters()) == cfg.num_params()


def test_gpt2_124m_has_its_published_size():
    assert abs(PRESETS["gpt2-124m"].num_params() - 124e6) / 124e6 < 0.03
    assert abs(PRESETS["llama2-7b"].num_params() - 6.74e9) / 6.74e9 < 0.01
    assert abs(PRESETS["llama2-70b"].num_params() - 69e9) / 69e9 < 0.01


@pytest.mark.parametrize("name", ["tiny", "tiny-llama"])
def test_forward_gives_logits_and_a_finite_loss(name):
    cfg = PRESETS[name]
    model = build_model(cfg, seed=1)
    idx = torch.randint(0, cfg.vocab_size, (2, 16))
    assert model(idx).shape == (2, 16, cfg.vocab_size)
    loss = model(idx, torch.randint(0, cfg.vocab_size, (2, 16)))
    assert torch.isfinite(loss) and abs(loss.item() - torch.log(torch.tensor(256.0))) < 0.5


def test_init_is_a_function_of_seed_and_name_only():
    cfg = PRESETS["tiny-llama"]
    a, b, c = build_model(cfg, seed=3), build_model(cfg, seed=3), build_model(cfg, seed=4)
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters(),
                                  strict=True):
        assert torch.equal(pa, pb)
        if pa.dim() >= 2:
            assert not torch.equal(pa, pc), name
    # A stage that builds only block 3 gets block 3's weights without building blocks 0-2.
    lone = torch.empty_like(a.blocks[3].attn.q.weight)
    init_parameter("blocks.3.attn.q.weight", lone, cfg, seed=3)
    assert torch.equal(lone, a.blocks[3].attn.q.weight)


def test_causality():
    cfg = PRESETS["tiny-llama"]
    model = build_model(cfg)
    idx = torch.randint(0, 256, (1, 12))
    changed = idx.clone()
    changed[0, 8] = (changed[0, 8] + 1) % 256
    assert torch.allclose(model(idx)[0, :8], model(changed)[0, :8])


@pytest.mark.parametrize("mode", ["selective", "full", "block"])
def test_recompute_gives_the_same_gradients(mode):
    cfg = PRESETS["tiny-llama"]
    idx = torch.randint(0, 256, (2, 16))
    plain, recomputed = build_model(cfg), build_model(cfg)
    if mode == "block":  # the first block only a checkpoint (the block method)
        recomputed.set_recompute("full", 1, "block")
        assert [block.recompute for block in recomputed.blocks] == [True] + [False] * (
            cfg.n_layers - 1)
    else:
        recomputed.set_recompute(mode)
    plain(idx, idx).backward()
    recomputed(idx, idx).backward()
    for p, q in zip(plain.parameters(), recomputed.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=1e-7)
