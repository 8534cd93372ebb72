"""The step's kernels: q/k/v and gate/up each one GEMM, fused AdamW, and the compiled regions
(each block, the head with its loss) traced whole, without graph breaks."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from paraxis.engine.contract import adamw, init_adam_state
from paraxis.kernels.linear import project, stackable
from paraxis.model.transformer import build_model
from paraxis.parallel.tensor.layers import ColumnParallelLinear
from paraxis.spec.model_config import PRESETS
from paraxis.spec.optimizer import DEFAULT_ADAMW

GEMMS = {"mm", "addmm", "bmm", "baddbmm"}


class CountGemms(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in GEMMS:
            self.count += 1
        return func(*args, **(kwargs or {}))


def _gemms(function, *args) -> int:
    with CountGemms() as counter:
        function(*args)
    return counter.count


def test_attention_and_swiglu_project_in_one_gemm_each():
    cfg = PRESETS["tiny-llama"]
    model = build_model(cfg, seed=0)
    block = model.blocks[0]
    x = torch.randn(2, 16, cfg.d_model)
    # q/k/v: one GEMM, then o; gate/up: one, then down
    assert _gemms(block.attn, x) == 2
    assert _gemms(block.mlp, x) == 2
    q, k, v = project(x, [block.attn.q, block.attn.k, block.attn.v])
    for out, layer in zip((q, k, v), (block.attn.q, block.attn.k, block.attn.v), strict=True):
        torch.testing.assert_close(out, layer(x), rtol=1e-6, atol=1e-6)


def test_gpt2_biases_travel_with_their_weights():
    cfg = PRESETS["tiny"]
    attn = build_model(cfg, seed=0).blocks[0].attn
    x = torch.randn(2, 8, cfg.d_model)
    stacked = project(x, [attn.q, attn.k, attn.v])
    for out, layer in zip(stacked, (attn.q, attn.k, attn.v), strict=True):
        torch.testing.assert_close(out, layer(x), rtol=1e-6, atol=1e-6)


def test_a_layer_that_enters_the_tp_region_itself_runs_alone():
    linear = nn.Linear(8, 8)
    entering = ColumnParallelLinear.from_linear(linear, None, enter_region=True)
    inside = ColumnParallelLinear.from_linear(linear, None)
    assert stackable([inside, nn.Linear(8, 4)])
    assert not stackable([entering, nn.Linear(8, 4)])
    assert not stackable([nn.Linear(8, 4, bias=False), nn.Linear(8, 4)])  # biases mixed
    hooked = nn.Linear(8, 4)
    hooked.register_forward_pre_hook(lambda module, args: None)
    assert not stackable([hooked, nn.Linear(8, 4)])


def test_fused_adamw_steps_like_the_foreach_one():
    torch.manual_seed(0)
    tensors = [torch.randn(64, 48), torch.randn(48), torch.randn(300, 7)]
    results = []
    for fused in (True, False):
        params = [nn.Parameter(t.clone()) for t in tensors]
        optimizer = adamw(params[::2], params[1:2], DEFAULT_ADAMW)
        assert optimizer.defaults["fused"] is True
        if not fused:
            groups = [{"params": g["params"], "weight_decay": g["weight_decay"]}
                      for g in optimizer.param_groups]
            optimizer = torch.optim.AdamW(groups, lr=0.0, foreach=True,
                                          betas=DEFAULT_ADAMW.betas, eps=DEFAULT_ADAMW.eps)
            assert not optimizer.param_groups[0]["fused"]
        init_adam_state(optimizer)
        for step in range(3):
            for p in params:
                p.grad = torch.full_like(p, 0.1 * (step + 1)) + p.detach() * 0.01
            for group in optimizer.param_groups:
                group["lr"] = 1e-2
            optimizer.step()
        results.append(params)
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_compiled_regions_have_no_graph_breaks():
    """What `--compile` compiles (`parallelize.compile_blocks`): each block's `_forward` and
    the part's `head` (final norm, LM head, loss), each one graph."""
    for name in ("tiny", "tiny-llama"):
        cfg = PRESETS[name]
        model = build_model(cfg, seed=0)
        tokens = torch.randint(0, cfg.vocab_size, (2, 16))
        x = model.embed(tokens)
        for region, args in ((model.blocks[0]._forward, (x,)), (model.head, (x, tokens))):
            torch._dynamo.reset()
            explained = torch._dynamo.explain(region)(*args)
            assert explained.graph_break_count == 0, (name, explained.break_reasons)
            assert explained.graph_count == 1, name
