"""FLOPs: Narayanan et al. 2021's formula, MFU vs HFU, and activations (Korthikanti 2022)."""

import pytest

from paraxis.plan.activations import layer_activation_bytes
from paraxis.plan.compute import (
    iteration_flops,
    mfu,
    model_flops_per_token,
    recompute_flops_per_token,
)
from paraxis.spec.model_config import PRESETS, ModelConfig

GPT3 = PRESETS["gpt3-175b"]


def narayanan_flops(batch: int, s: int, layers: int, h: int, vocab: int) -> float:
    # Narayanan et al. 2021 App.: 96 B s l h^2 (1 + s/6h + V/16lh), with full recomputation
    return 96 * batch * s * layers * h**2 * (1 + s / (6 * h) + vocab / (16 * layers * h))


def test_full_recompute_step_matches_narayanan_formula() -> None:
    # the paper counts the full attention square (causal=False)
    flops = iteration_flops(GPT3, 2048, 1536, "full", causal=False)
    expected = narayanan_flops(1536, 2048, GPT3.n_layers, GPT3.d_model, GPT3.vocab_size)
    # our count includes biases and norms (13h per layer), the paper's does not: < 0.1%
    assert flops["hardware"] == pytest.approx(expected, rel=1e-3)


def test_model_flops_exclude_recompute() -> None:
    no_recompute = 72 * 2048 * GPT3.n_layers * GPT3.d_model**2 * (
        1 + 2048 / (6 * GPT3.d_model) + GPT3.vocab_size / (12 * GPT3.n_layers * GPT3.d_model))
    assert model_flops_per_token(GPT3, 2048, causal=False) * 2048 == pytest.approx(
        no_recompute, rel=1e-3)
    flops = {r: iteration_flops(GPT3, 2048, 8, r) for r in ("none", "selective", "full")}
    assert flops["none"]["model"] == flops["full"]["model"] == flops["none"]["hardware"]
    assert flops["none"]["hardware"] < flops["selective"]["hardware"] < flops["full"]["hardware"]
    # full recompute = one more forward of the layers: 4/3 of the layers' training FLOPs
    extra = recompute_flops_per_token(GPT3, 2048, "full")
    assert extra / (model_flops_per_token(GPT3, 2048) - 6 * GPT3.d_model * GPT3.vocab_size) == \
        pytest.approx(1 / 3)


def test_causal_count_halves_the_attention_square() -> None:
    # Megatron-LM's count since 2025 (num_floating_point_operations, commit 8873b55): the
    # attention core counts the causal half of the s x s scores; PaLM's and Narayanan's the
    # full square. The weights and the head are counted alike.
    cfg, seq = PRESETS["llama3-8b"], 131072
    full, causal = (model_flops_per_token(cfg, seq, causal=c) for c in (False, True))
    square = 3 * cfg.n_layers * 4 * seq * cfg.d_model
    assert full - causal == pytest.approx(square / 2)


def test_six_n_rule_for_long_models() -> None:
    # Kaplan et al. 2020: ~6N FLOPs per token when s << 6h
    cfg = PRESETS["llama2-7b"]
    assert model_flops_per_token(cfg, 128) == pytest.approx(6 * cfg.num_params(), rel=0.02)


def test_mfu() -> None:
    cfg = PRESETS["llama2-7b"]
    per_token = model_flops_per_token(cfg, 4096)
    assert mfu(cfg, 4096, 1000.0, 8, per_token * 1000 / 4) == pytest.approx(0.5)


GPT_BLOCK = ModelConfig("gpt-block", "gpt2", 51200, 24, 2048, 16, 16, 8192, 2048)


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_activations_match_korthikanti_table_2(tp: int) -> None:
    s, b, h, a = 2048, 4, GPT_BLOCK.d_model, GPT_BLOCK.n_heads
    sbh = s * b * h
    score = 5 * a * s / h
    # Korthikanti et al. 2022 Table 2, per layer
    # the paper's kernel keeps the scores: the "math" attention kernel
    assert layer_activation_bytes(GPT_BLOCK, s, b, tp, attention="math") == pytest.approx(
        sbh * (10 + 24 / tp + score / tp))
    assert layer_activation_bytes(GPT_BLOCK, s, b, tp, sequence_parallel=tp > 1,
                                  attention="math") == \
        pytest.approx(sbh / tp * (34 + score) if tp > 1 else sbh * (34 + score))
    assert layer_activation_bytes(GPT_BLOCK, s, b, tp, tp > 1, "selective",
                                  "math") == pytest.approx(sbh * 34 / tp)
    assert layer_activation_bytes(GPT_BLOCK, s, b, tp, False, "full", "math") == \
        pytest.approx(2 * sbh)


def test_optimizer_step_is_hbm_bound_and_zero_splits_it() -> None:
    from paraxis.plan.compute import optimizer_traffic_per_param
    from paraxis.plan.cost import evaluate
    from paraxis.plan.hardware import build_cluster
    from paraxis.spec.layout import Layout
    from paraxis.spec.precision import MIXED_ADAM

    cfg = PRESETS["llama2-7b"]
    cluster = build_cluster("a100-80gb", 8, 8)
    hbm = cluster.gpu.hbm_bandwidth_Bps * cluster.gpu.hbm_efficiency
    # Adam: gradient read twice, fp32 master/m/v and the 16-bit weight read and written
    assert optimizer_traffic_per_param(MIXED_ADAM) == 2 * 2 + 2 * 12 + 2 * 2
    plain = evaluate(cfg, Layout(dp=4, tp=2), cluster, 4096, 8)
    assert plain.time["optimizer"] == pytest.approx(cfg.num_params() / 2 * 32 / hbm)
    sharded = evaluate(cfg, Layout(dp=4, tp=2, zero=1), cluster, 4096, 8)
    assert sharded.time["optimizer"] == pytest.approx(plain.time["optimizer"] / 4)
    assert sharded.step_time_s < plain.step_time_s


def test_paraxis_compiled_blocks_are_priced_without_megatrons_dropout():
    """`kernels="compiled"` (paraxis under torch.compile) fuses elementwise ops as Megatron's
    kernels do, but its GPT blocks have no dropout: no masks kept (2sbh a layer) and none of
    their traffic; a kernels setting it does not know is refused in one line. At 32 x 1024
    tokens, where the GPU's time is longer than the host's launches (a compiled block
    launches more kernels than Megatron's fused layer: smaller batches run host-bound)."""
    from paraxis.plan.cost import evaluate
    from paraxis.plan.hardware import build_cluster
    from paraxis.spec.errors import ParaxisError
    from paraxis.spec.layout import Layout

    cfg, seq, batch = PRESETS["gpt2-124m"], 1024, 32
    megatron, paraxis = (evaluate(cfg, Layout(), build_cluster("h100-sxm-80gb", 1, 1, {
        "kernels": kernels}), seq, batch) for kernels in ("fused", "compiled"))
    masks = 2 * seq * batch * cfg.d_model * cfg.n_layers
    assert megatron.memory["activations"] - paraxis.memory["activations"] == \
        pytest.approx(masks)
    assert paraxis.step_time_s < megatron.step_time_s
    with pytest.raises(ParaxisError, match="use fused, eager or compiled"):
        build_cluster("h100-sxm-80gb", 1, 1, {"kernels": "inductor"})
