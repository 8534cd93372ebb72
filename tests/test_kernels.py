"""The step's kernels: q/k/v and gate/up each one GEMM, fused AdamW, and the compiled regions
(each block, the head with its loss) traced whole, without graph breaks."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from paraxis.dist.testing import gpu_count, run_distributed
from paraxis.engine.optimizer import adamw, init_adam_state
from paraxis.kernels.linear import project, stackable
from paraxis.model.transformer import build_model
from paraxis.parallel.tensor.layers import ColumnParallelLinear
from paraxis.spec.model_config import PRESETS
from paraxis.spec.optimizer import DEFAULT_ADAMW
from paraxis.spec.runtime_options import RuntimeOptions

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
    """What `--compile` compiles, each one graph: the whole model where nothing in it
    communicates (`parallelize.compiles_whole`), else (`parallelize.compile_blocks`) each
    block's `_forward` and the part's `head` (final norm, LM head, loss); in a routed block
    its attention half and its experts."""
    for name in ("tiny", "tiny-llama"):
        cfg = PRESETS[name]
        model = build_model(cfg, seed=0)
        tokens = torch.randint(0, cfg.vocab_size, (2, 16))
        x = model.embed(tokens)
        # `compiles_whole`: the whole model, embedding to loss, where nothing in it
        # communicates; else each block's `_forward` and the head
        for region, args in ((model, (tokens, tokens)), (model.blocks[0]._forward, (x,)),
                             (model.head, (x, tokens))):
            torch._dynamo.reset()
            explained = torch._dynamo.explain(region)(*args)
            assert explained.graph_break_count == 0, (name, explained.break_reasons)
            assert explained.graph_count == 1, name
    # a routed block: its attention half, and an expert MLP at some token count
    cfg = PRESETS["tiny-moe"]
    block = build_model(cfg, seed=0).blocks[0]
    x = torch.randn(2, 16, cfg.d_model)
    for region, args in ((block._attend, (x,)), (block.moe.experts[0].forward,
                                                 (x.reshape(-1, cfg.d_model)[:7],))):
        torch._dynamo.reset()
        explained = torch._dynamo.explain(region)(*args)
        assert (explained.graph_count, explained.graph_break_count) == (1, 0)


def test_the_vocab_parallel_loss_keeps_its_collectives_eager():
    """Compiled with the head, the vocab-parallel loss's all-reduces must be marked as TP's
    others are (`comm.eager_collective`): unmarked, dynamo traced into the watchdog and broke
    on `time.monotonic`, warning every tp > 1 run under --compile."""
    import inspect

    from paraxis.parallel.tensor import comm, cross_entropy

    assert inspect.unwrap(cross_entropy._all_reduce) in {entry[0] for entry in comm._EAGER}


def test_the_compiled_model_checks_no_missing_attribute_before_each_call():
    """Compiled, every attribute the model's forward reads is a guard checked before each
    call of the graph; a read of an attribute a module lacks (`getattr(layer, "fp8",
    None)` on an `nn.Linear`) is the slow kind, nn.Module's Python `__getattr__` raising,
    about 1 us each: two a projection made the guards of GPT-2 124M take 218 us a forward
    on a CPU where the compiled reference's take 33 (`tools/probes/host_phases.py
    --guards`). The guards are the same whatever the backend: eager keeps inductor out of
    the suite."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    from paraxis.model.transformer import Transformer

    for name in ("tiny", "tiny-llama"):
        cfg = PRESETS[name]
        model = build_model(cfg, seed=0)
        tokens = torch.randint(0, cfg.vocab_size, (2, 16))
        torch._dynamo.reset()
        model.compile(backend="eager")
        model(tokens, tokens)
        (entry,) = _debug_get_cache_entry_list(Transformer.forward.__code__)
        guards = str(entry.guard_manager)
        assert "TENSOR_MATCH" in guards, name  # the tree printed is the guards checked
        assert "NO_HASATTR" not in guards, (name, [line for line in guards.splitlines()
                                                   if "NO_HASATTR" in line][:4])
    torch._dynamo.reset()


def _engine(precision: str = "fp32"):
    from paraxis.dist.groups import build_groups
    from paraxis.parallelize import build_engine
    from paraxis.spec.layout import Layout

    layout = Layout.parse("microbatches=2")
    return build_engine(PRESETS["tiny-llama"], layout, build_groups(layout), "cpu", seed=0,
                        options=RuntimeOptions(precision=precision))


def _batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(0, PRESETS["tiny-llama"].vocab_size, (4, 17),
                           generator=torch.Generator().manual_seed(seed))
    return tokens[:, :-1], tokens[:, 1:]


def test_train_step_is_the_step_of_the_float_calls():
    """`train_step` (what the loop runs) moves the weights exactly as forward_backward,
    clip_grad_norm and optimizer_step called one by one, and returns the same numbers."""
    queued, called = _engine(), _engine()
    for step in range(3):
        x, y = _batch(step)
        loss, norm = queued.train_step(x, y, 1e-2, 0.5)
        queued.zero_grad()
        assert float(loss) == called.forward_backward(x, y)
        assert float(norm) == called.clip_grad_norm(0.5)
        called.optimizer_step(1e-2)
        called.zero_grad()
    for (_, a), (_, b) in zip(queued.named_parameters(), called.named_parameters(),
                              strict=True):
        assert torch.equal(a, b)


def test_train_step_reads_nothing_back_from_the_device(monkeypatch):
    """No tensor becomes a Python number inside the step (each such read makes the host
    wait for a GPU): float(), .item(), .tolist() and bool() of a tensor fail while it runs."""
    for precision in ("fp32", "bf16"):
        engine = _engine(precision)
        x, y = _batch(0)
        engine.train_step(x, y, 1e-2, 1.0)  # first step: state set up
        engine.zero_grad()

        def refuse(*args, **kwargs):
            raise AssertionError("the step read a tensor on the host")

        with monkeypatch.context() as patch:
            for name in ("__float__", "item", "tolist", "__bool__", "__int__"):
                patch.setattr(torch.Tensor, name, refuse)
            with pytest.raises(AssertionError, match="read a tensor"):
                float(torch.ones(()))
            loss, norm = engine.train_step(x, y, 1e-2, 1.0)
        assert 0 < float(loss) < 20 and float(norm) > 0, precision


def test_a_step_that_is_not_finite_leaves_weights_and_adam_alone():
    """Decided on the device: the fused kernel's found_inf skips the update, the moments and
    the step count, with fp32 weights and with bf16 ones over fp32 masters."""
    for precision in ("fp32", "bf16"):
        engine = _engine(precision)
        engine.train_step(*_batch(0), 1e-2, 1.0)
        engine.zero_grad()
        before = [p.detach().clone() for _, p in engine.named_parameters()]
        state = [{k: v.clone() for k, v in s.items()} for s in engine.optimizer.state.values()]
        param = engine.named_parameters()[3][1]
        hook = param.register_hook(lambda grad: grad * float("inf"))
        loss, norm = engine.train_step(*_batch(1), 1e-2, 1.0)
        hook.remove()
        engine.zero_grad()
        assert torch.isfinite(loss) and not torch.isfinite(norm)
        for (_, p), old in zip(engine.named_parameters(), before, strict=True):
            assert torch.equal(p, old), precision
        for s, old in zip(engine.optimizer.state.values(), state, strict=True):
            for key, value in s.items():
                assert torch.equal(value, old[key]), (precision, key)
        # and the next finite step goes on as usual
        engine.train_step(*_batch(2), 1e-2, 1.0)
        assert not all(torch.equal(p, old) for (_, p), old in
                       zip(engine.named_parameters(), before, strict=True))


def test_stacked_projections_keep_the_weights_not_a_stacked_copy():
    """One GEMM forward; for backward the input and the weights themselves are kept (as
    separate linears keep them), never their stacked copy; gradients as separate linears'."""
    torch.manual_seed(0)
    layers = [nn.Linear(32, 32), nn.Linear(32, 8), nn.Linear(32, 8)]
    x = torch.randn(4, 5, 32, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        outs = project(x, layers)
    stacked_rows = sum(layer.weight.shape[0] for layer in layers)
    assert not any(t.dim() == 2 and t.shape[0] == stacked_rows for t in saved)
    weights = {layer.weight.data_ptr() for layer in layers}
    assert weights <= {t.data_ptr() for t in saved}
    sum(o.square().sum() for o in outs).backward()
    got = [x.grad.clone()] + [p.grad.clone() for layer in layers for p in layer.parameters()]
    x.grad = None
    for layer in layers:
        layer.zero_grad()
    sum(layer(x).square().sum() for layer in layers).backward()
    want = [x.grad] + [p.grad for layer in layers for p in layer.parameters()]
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_layers_whose_call_is_more_than_their_gemm_run_apart():
    """A stack runs the layers' weights, never their calls: a layer that does more on its
    call (a subclass with a forward of its own, a backward hook, a hook on every module)
    runs as itself, and gets what its call does."""
    plain = [nn.Linear(8, 8), nn.Linear(8, 4)]
    assert stackable(plain)

    class Doubled(nn.Linear):  # e.g. a fake-quantised or low-rank linear
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return 2 * super().forward(x)

    doubled = Doubled(8, 4)
    assert not stackable([plain[0], doubled])
    x = torch.randn(3, 8)
    torch.testing.assert_close(project(x, [plain[0], doubled])[1], doubled(x))
    seen = []
    hook = plain[1].register_full_backward_hook(lambda *args: seen.append("layer"))
    assert not stackable(plain)
    sum(o.sum() for o in project(x.requires_grad_(), plain)).backward()
    assert seen == ["layer"]
    hook.remove()
    every = torch.nn.modules.module.register_module_forward_hook(
        lambda *args: seen.append("every"))
    try:
        assert not stackable(plain)
    finally:
        every.remove()
    assert stackable(plain)

    class Column(ColumnParallelLinear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return 2 * super().forward(x)

    weight = nn.Parameter(torch.randn(4, 8))
    assert ColumnParallelLinear(weight, None, None).stackable
    assert not Column(weight, None, None).stackable


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_fp8_projections_keep_no_stacked_copy_of_the_weights(recipe):
    """Under FP8 a stack keeps what separate layers keep for the backward, the Parameters
    themselves: tensorwise stacks and casts them inside its GEMM, forward and again in
    backward; rowwise, whose backward casts its 16-bit weight along the other dim, runs its
    layers apart, where stacking would keep a stacked 16-bit copy of the weights from
    forward to backward."""
    from paraxis.kernels.fp8 import Fp8Gemm
    from paraxis.kernels.linear import Fp8Linear

    torch.manual_seed(0)
    layers = [Fp8Linear.from_linear(nn.Linear(64, rows, bias=False), Fp8Gemm(recipe))
              for rows in (64, 16, 16)]
    assert stackable(layers) == (recipe == "tensorwise")
    x = torch.randn(2, 8, 64, requires_grad=True)
    saved = []
    with torch.autocast("cpu", dtype=torch.bfloat16), \
            torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        project(x, layers)
    weights = {layer.weight.untyped_storage().data_ptr() for layer in layers}
    copies = [t for t in saved if t.untyped_storage().data_ptr() not in weights
              and t.dim() == 2 and t.shape[-1] == 64 and t.shape[0] in (64, 96)]
    assert not copies, [(t.dtype, t.shape) for t in copies]
    assert weights <= {t.untyped_storage().data_ptr() for t in saved}


@pytest.mark.parametrize("tokens,stacks", [(4, False), (64, True)])
def test_the_input_gradient_stacks_the_weights_where_that_moves_fewer_bytes(tokens, stacks):
    """The input's gradient: one GEMM a weight, summed, with few tokens beside the weights'
    rows; one GEMM over the weights stacked in the backward with many (q/k/v at a GPU's
    batch: `kernels.stacked._stacks_for_input_grad`). Either way the gradients of separate
    linears, and the weight gradients one GEMM."""
    from paraxis.kernels.stacked import _stacks_for_input_grad

    torch.manual_seed(0)
    layers = [nn.Linear(16, 8), nn.Linear(16, 4), nn.Linear(16, 4)]
    assert _stacks_for_input_grad([8, 4, 4], tokens) == stacks
    x = torch.randn(tokens, 16, requires_grad=True)
    outs = project(x, layers)
    grad = torch.randn(tokens, 16)

    class Calls(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.names: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    with Calls() as calls:
        torch.autograd.backward(outs, list(grad.split([8, 4, 4], dim=-1)))
    gemms = [name for name in calls.names if name in GEMMS or name == "stacked_input_grad"]
    # the weights' one GEMM, and the input's: one stacked, or one a weight
    assert len(gemms) == (2 if stacks else 4), gemms
    assert ("stacked_input_grad" in gemms) == stacks
    got = [x.grad.clone()] + [p.grad.clone() for layer in layers for p in layer.parameters()]
    x.grad = None
    for layer in layers:
        layer.zero_grad()
    torch.autograd.backward([layer(x) for layer in layers], list(grad.split([8, 4, 4], dim=-1)))
    want = [x.grad] + [p.grad for layer in layers for p in layer.parameters()]
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_a_backward_through_the_stacked_input_gradient_is_exact():
    """A backward through the backward (`create_graph`, as a gradient penalty asks) where
    the input's gradient stacks the weights: torch's numeric gradient checks, fp64."""
    from paraxis.kernels.stacked import _stacks_for_input_grad, stacked_linear

    torch.manual_seed(0)
    assert _stacks_for_input_grad([2, 1, 1], 12)
    x = torch.randn(12, 4, dtype=torch.float64, requires_grad=True)
    weights = [torch.randn(rows, 4, dtype=torch.float64, requires_grad=True)
               for rows in (2, 1, 1)]
    torch.autograd.gradcheck(lambda x, *w: stacked_linear(x, list(w)), (x, *weights))
    torch.autograd.gradgradcheck(lambda x, *w: stacked_linear(x, list(w)), (x, *weights))


def test_stacked_projections_under_autocast_match_separate_ones():
    """bf16 autocast over fp32 weights: the backward computes in bf16 and hands each
    gradient back in its tensor's dtype, as autocast's casts do for separate linears."""
    torch.manual_seed(0)
    layers = [nn.Linear(32, 16), nn.Linear(32, 16)]
    x = torch.randn(3, 32, requires_grad=True)
    grads = []
    for stacked in (True, False):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            outs = project(x, layers) if stacked else [layer(x) for layer in layers]
        assert all(o.dtype == torch.bfloat16 for o in outs)
        sum(o.float().square().sum() for o in outs).backward()
        grads.append([x.grad.clone()] + [p.grad.clone() for layer in layers
                                         for p in layer.parameters()])
        x.grad = None
        for layer in layers:
            layer.zero_grad()
    for a, b in zip(*grads, strict=True):
        assert a.dtype == b.dtype == torch.float32
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)


def test_a_split_backward_computes_each_gradient_of_a_stack_once():
    """Zero-bubble schedules ask for the input gradient alone (B), then the weights' (W;
    engine/pipeline_parallel/split_backward.py): B the input's GEMMs alone (one per weight,
    summed), W the weights' one GEMM, neither the other's."""
    from paraxis.engine.pipeline_parallel.split_backward import backward_input

    layers = [nn.Linear(16, 16, bias=False), nn.Linear(16, 8, bias=False)]
    x = torch.randn(4, 16, requires_grad=True)  # a stage's input, as received
    out = torch.cat(project(x.tanh(), layers), dim=-1)
    grad = torch.randn_like(out)
    weights = [layer.weight for layer in layers]
    with CountGemms() as counter:
        grad_x, pending = backward_input(out, grad, x, weights)
    assert counter.count == len(weights)
    with CountGemms() as counter:
        pending.run()
    assert counter.count == 1
    torch.testing.assert_close(grad_x, (grad @ torch.cat(weights)) * (1 - x.tanh() ** 2))
    torch.testing.assert_close(torch.cat([w.grad for w in weights]), grad.t() @ x.tanh())


def test_autograd_grad_over_leaves_still_gets_every_gradient():
    """Where the engine cannot say what a pass needs (torch.autograd.grad to leaf tensors),
    the stack computes what was asked for anyway."""
    layers = [nn.Linear(8, 8), nn.Linear(8, 4)]
    x = torch.randn(3, 8, requires_grad=True)
    out = torch.cat(project(x, layers), dim=-1)
    grad_x, grad_w = torch.autograd.grad(out.square().sum(), [x, layers[0].weight])
    assert grad_x.shape == x.shape and grad_w.shape == layers[0].weight.shape


@pytest.mark.parametrize("rows,width,tokens", [(1024, 256, 16), (128, 1024, 256)])
def test_compiled_stacked_projection_keeps_no_stacked_weight_for_backward(rows, width, tokens):
    """Compiled, one GEMM over stacked weights keeps its input for the backward and not the
    stacked copy of the weights (the partitioner would save a copy the backward reads: 2.1 GB
    over Llama 3 8B's 8 blocks, paraxis/kernels/stacked.py), whether the input's gradient
    sums a GEMM a weight (few tokens) or stacks the weights again in the backward (many)."""
    from paraxis.kernels.stacked import _stacks_for_input_grad, stacked_linear
    from tools.probes.peak_memory import alive_at_peak, cpu_events

    assert _stacks_for_input_grad([rows, rows], 2 * tokens) == (tokens > rows)
    weights = [torch.randn(rows, width, requires_grad=True) for _ in range(2)]
    x = torch.randn(2, tokens, width, requires_grad=True)
    torch._dynamo.reset()
    project = torch.compile(lambda x: stacked_linear(x, weights).relu())
    project(x).sum().backward()  # compiled here, outside the count
    for w in weights:
        w.grad = None
    kept = []
    _, end, _ = alive_at_peak(cpu_events(lambda: kept.append(project(x))))
    output = kept[0].numel() * 4  # and the relu's mask, a byte an output
    copy = 2 * rows * width * 4
    assert end < output + kept[0].numel() + copy // 4, (end, output, copy)
    kept[0].sum().backward()
    grads = [w.grad.clone() for w in weights]
    for w in weights:
        w.grad = None
    torch.nn.functional.linear(x, torch.cat(weights)).relu().sum().backward()
    for got, w in zip(grads, weights, strict=True):
        torch.testing.assert_close(got, w.grad, rtol=0, atol=0)


@pytest.mark.skipif(gpu_count() == 0, reason="needs a CUDA GPU")
def test_on_a_gpu_the_compiled_stacked_input_gradient_matches_separate_linears():
    """On CUDA, compiled, bf16: q/k/v's input gradient as one GEMM over weights stacked in
    the custom operator (`kernels.stacked.stacked_input_grad`), against separate linears'.
    In a spawned rank: the suite's own process sees no GPU."""
    run_distributed(_compiled_stacked_input_gradient_on_cuda, 1, device="cuda", timeout_s=300)


def _compiled_stacked_input_gradient_on_cuda() -> None:
    from paraxis.kernels.stacked import _stacks_for_input_grad, stacked_linear

    torch.manual_seed(0)
    widths, tokens = (256, 64, 64), 512
    assert _stacks_for_input_grad(list(widths), tokens)
    weights = [(torch.randn(w, 256, device="cuda") / 16).bfloat16().requires_grad_()
               for w in widths]
    x = torch.randn(tokens, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: stacked_linear(x, weights).float().square().sum())
    compiled(x).backward()
    got = [x.grad.float()] + [w.grad.float() for w in weights]
    x.grad = None
    for w in weights:
        w.grad = None
    sum(torch.nn.functional.linear(x, w).float().square().sum() for w in weights).backward()
    want = [x.grad.float()] + [w.grad.float() for w in weights]
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2)
    torch._dynamo.reset()


def test_compiled_embedding_backward_holds_no_fp32_copy_of_a_bf16_table():
    """Compiled, the token embedding's backward makes the bf16 gradient alone: inductor's own
    decomposition of it would hold an fp32 table beside it (3x the gradient's bytes at
    once), 2.1 GB on Llama 3 8B (paraxis/kernels/embedding.py)."""
    from paraxis.kernels.embedding import Embedding
    from tools.probes.peak_memory import alive_at_peak, cpu_events

    table = Embedding(4096, 256).to(torch.bfloat16)
    ids = torch.randint(0, 4096, (2, 64))
    torch._dynamo.reset()
    lookup = torch.compile(lambda tokens: table(tokens).float().square().sum())
    lookup(ids).backward()  # compiled here, outside the count
    table.weight.grad = None
    peak, _, _ = alive_at_peak(cpu_events(lambda: lookup(ids).backward()))
    gradient = table.weight.numel() * 2
    assert table.weight.grad.dtype == torch.bfloat16
    assert peak < 1.25 * gradient, (peak, gradient)


def test_swiglu_keeps_its_inputs_and_recomputes_silu():
    """A Llama MLP's eager forward keeps the gate/up GEMM's output and the product, not
    silu(gate) (`kernels.activation`): 6sbf bytes, as `plan.activations` prices; the output
    and every gradient are autograd's own for `F.silu(gate) * up`, bit for bit."""
    import torch.nn.functional as F

    from paraxis.kernels.activation import swiglu
    from paraxis.model.transformer import MLP
    from paraxis.plan.activations import layer_activation_bytes

    cfg = PRESETS["tiny-llama"]
    mlp = MLP(cfg).to(torch.bfloat16)
    x = torch.randn(2, 8, cfg.d_model).bfloat16().requires_grad_()
    kept: dict[int, int] = {}  # storage -> bytes, of the MLP's width

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.shape[-1] in (cfg.d_ff, 2 * cfg.d_ff):
            kept[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = mlp(x)
    tokens = x.shape[0] * x.shape[1]
    assert sum(kept.values()) == 6 * tokens * cfg.d_ff  # gate and up, and the product
    mlp_bytes = (layer_activation_bytes(cfg, 8, 2) - layer_activation_bytes(cfg, 8, 2, mlp=False))
    assert mlp_bytes == 6 * tokens * cfg.d_ff
    assert out.shape == x.shape
    for shape in ((2, 8, cfg.d_ff), (16, cfg.d_ff)):
        gate, up = (torch.randn(shape).bfloat16().requires_grad_() for _ in range(2))
        ours = swiglu(gate, up)
        theirs = F.silu(gate) * up
        assert torch.equal(ours, theirs)
        g = torch.randn(shape).bfloat16()
        assert all(torch.equal(a, b) for a, b in zip(torch.autograd.grad(ours, (gate, up), g),
                                                     torch.autograd.grad(theirs, (gate, up), g),
                                                     strict=True))
