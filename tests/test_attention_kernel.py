"""The attention kernel is one fact: what paraxis.model.transformer's attention keeps for backward
is what the planner counts (paraxis/spec/kernels.py), and grouped K/V stay at kv-head
width."""

import pytest
import torch
import torch.nn.functional as F

from paraxis.model.transformer import Attention
from paraxis.plan.activations import attention_kernel_bytes, layer_activation_bytes
from paraxis.plan.hardware import GPUS, build_cluster
from paraxis.plan.layer_cost import layer_times
from paraxis.plan.memory import layout_memory
from paraxis.spec.errors import ParaxisError
from paraxis.spec.kernels import FLASH, MATH, RUNTIME_KERNEL, get_kernel
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import PRESETS, ModelConfig

GQA = ModelConfig("gqa", "llama", 256, 2, 64, 8, 2, 192, 256)  # 8 query heads, 2 kv heads


def _sdpa_node(out: torch.Tensor):
    """The attention kernel's autograd node, found by walking back from `out`."""
    stack, seen = [out.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if "ScaledDotProduct" in node.name():
            return node
        stack += [next_fn for next_fn, _ in node.next_functions]
    raise AssertionError("no scaled_dot_product_attention node in the graph")


def _saved_bytes(node) -> int:
    return sum(getattr(node, name).numel() * getattr(node, name).element_size()
               for name in dir(node) if name.startswith("_saved_")
               and isinstance(getattr(node, name), torch.Tensor))


@pytest.mark.parametrize("cfg", [GQA, PRESETS["tiny"]], ids=["gqa", "gpt2"])
def test_the_model_keeps_what_the_planner_counts(cfg: ModelConfig) -> None:
    batch, seq = 2, 128
    attention = Attention(cfg)
    x = torch.randn(batch, seq, cfg.d_model, requires_grad=True)
    node = _sdpa_node(attention(x))
    key = node._saved_key
    assert key.shape == (batch, cfg.n_kv_heads, seq, cfg.head_dim)  # never repeated
    # q, k, v, the output and the fp32 log-sum-exp: no s x s matrix anywhere
    assert _saved_bytes(node) == attention_kernel_bytes(cfg, seq, batch, RUNTIME_KERNEL,
                                                        element_bytes=4)


def test_gqa_kernel_equals_repeating_k_and_v() -> None:
    torch.manual_seed(0)
    q = torch.randn(2, 8, 64, 16, requires_grad=True)
    k, v = (torch.randn(2, 2, 64, 16, requires_grad=True) for _ in range(2))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    ref = F.scaled_dot_product_attention(q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1),
                                         is_causal=True)
    grad = torch.randn_like(out)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), grad),
                    torch.autograd.grad(ref, (q, k, v), grad), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_planner_presets_price_the_runtime_kernel() -> None:
    assert {gpu.attention_kernel for gpu in GPUS.values()} == {RUNTIME_KERNEL.name}
    with pytest.raises(ParaxisError, match="unknown attention kernel"):
        get_kernel("sparse")
    with pytest.raises(ParaxisError, match="attention_kernel='sparse' is unknown"):
        build_cluster("a100-80gb", 8, 8, {"attention_kernel": "sparse"})


@pytest.mark.parametrize("recompute", ["none", "selective"])
def test_flash_activations_grow_linearly_with_the_sequence(recompute: str) -> None:
    cfg = PRESETS["llama2-7b"]
    flash = [layer_activation_bytes(cfg, s, 1, 8, True, recompute) for s in (4096, 8192)]
    assert flash[1] == pytest.approx(2 * flash[0], rel=1e-12)
    if recompute == "none":  # the math kernel's scores grow with s^2
        math = [layer_activation_bytes(cfg, s, 1, 8, True, recompute, "math")
                for s in (4096, 8192)]
        assert math[1] > 3 * math[0] and math[0] > 2 * flash[0]


def test_a_long_sequence_run_fits_without_recompute() -> None:
    # Llama-2 7B at 8192 tokens on 8 GPUs, ZeRO-3, one sequence per microbatch, no recompute:
    # with the scores kept (math kernel) it would need ~190 GB per GPU; the flash kernel that
    # paraxis (and every serious GPU trainer) runs keeps it within an 80 GB GPU.
    cfg, layout = PRESETS["llama2-7b"], Layout(dp=8, zero=3)
    flash = layout_memory(cfg, layout, 8192, 1)["total"]
    math = layout_memory(cfg, layout, 8192, 1, attention="math")["total"]
    assert flash < 80e9 < 2 * 80e9 < math


def test_flash_core_time_skips_the_causal_half_and_recomputes_in_backward() -> None:
    cfg, layout = PRESETS["llama2-7b"], Layout(dp=1, tp=1)
    times = {}
    for kernel in (FLASH, MATH):
        cluster = build_cluster("a100-80gb", 8, 8, {"attention_kernel": kernel.name})
        times[kernel.name] = layer_times(cfg, layout, cluster, 8192, 1)
    # at 8192 tokens the core is a large share: flash's forward is well under math's
    assert times["flash"]["forward"] < 0.85 * times["math"]["forward"]
    assert times["flash"]["backward"] / times["flash"]["forward"] > 2.0
