"""fp32 masters of 16-bit parameters stepped in one pass a unit (engine/data_parallel/masters.py,
kernels/master_adamw.py): torch's AdamW to fp32 rounding, clipping and fp16's unscaling inside
the pass, a non-finite step changing nothing, the parameters' own gradients and the reducer's
flat ones the same bits, and the step's ops the same for any depth."""

import functools

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from paraxis.dist.groups import build_groups
from paraxis.dist.testing import gpu_count, run_distributed
from paraxis.engine.data_parallel.buckets import GradReducer
from paraxis.kernels.master_adamw import master_adamw_
from paraxis.parallelize import build_engine
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import PRESETS
from paraxis.spec.runtime_options import RuntimeOptions
from paraxis.spec.units import MIB

TINY = PRESETS["tiny"]


def _train_microbatched(precision: str) -> tuple[list[torch.Tensor], list[float], object]:
    layout = Layout(microbatches=2)
    engine = build_engine(TINY, layout, build_groups(layout), "cpu", seed=0,
                          options=RuntimeOptions(precision=precision))
    g = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(3):
        x = torch.randint(0, TINY.vocab_size, (4, 16), generator=g)
        y = torch.randint(0, TINY.vocab_size, (4, 16), generator=g)
        loss, _ = engine.train_step(x, y, 1e-2, 1.0)
        losses.append(float(loss))
        engine.zero_grad()
    params = [p.detach().clone() for p in engine.model.parameters()]
    return params, losses, engine


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_one_rank_keeps_autograds_gradients_and_trains_the_same_bits(monkeypatch, precision):
    """Where nothing is reduced the gradients are autograd's own tensors (no flat buffer to
    fill and add into), dropped by zero_grad; the numbers are those of the flat buffers."""
    params, losses, engine = _train_microbatched(precision)
    assert engine.reducer.local
    assert all(p.grad is None for p in engine.model.parameters())
    # what a step holds, though none exists between steps
    assert engine.memory_report()["grads"] == sum(p.numel() * p.element_size()
                                                  for p in engine.model.parameters())
    engine.forward_backward(*[torch.randint(0, TINY.vocab_size, (4, 16))] * 2)
    assert all(unit.grad_full is None for unit in engine.units)  # no bucket
    grads = [p.grad for p in engine.model.parameters()]
    assert all(g is not None for g in grads)
    assert {id(g) for g in engine.reducer.grad_buffers()} == {id(g) for g in grads}
    monkeypatch.setattr(GradReducer, "KEEP_AUTOGRAD_GRADS", False)
    flat_params, flat_losses, flat = _train_microbatched(precision)
    assert not flat.reducer.local
    assert flat_losses == losses
    for ours, theirs in zip(params, flat_params, strict=True):
        assert torch.equal(ours, theirs)


@pytest.mark.parametrize("local", [True, False])
def test_a_parameter_no_backward_reached_has_a_zero_gradient(monkeypatch, local):
    """As in a bucket, so AdamW decays it as every layout does (None would skip it)."""
    from paraxis.engine.data_parallel.flat import FlatUnit

    monkeypatch.setattr(GradReducer, "KEEP_AUTOGRAD_GRADS", local)
    used, unused = (torch.nn.Parameter(torch.ones(3)) for _ in range(2))
    reducer = GradReducer([FlatUnit([used, unused], 1, 0)], None, shard_grads=False)
    assert reducer.local == local
    reducer.begin_microstep(sync=True, final=True)
    (2 * used).sum().backward()
    reducer.finish()
    assert torch.equal(used.grad, torch.full((3,), 2.0))
    assert torch.equal(unused.grad, torch.zeros(3))


def _adamw_on_copies(master, exp_avg, exp_avg_sq, grad, decayed, lr, steps, grad_scale,
                     found_inf):
    """torch's own AdamW.step on fp32 copies, the decayed range and the rest as its two
    groups, as `optimizer.adamw` makes them; after `steps` steps the moments are given.
    (The engine's step counts, and a non-finite step leaving them: tests/test_kernels.py.)"""
    params = [master[:decayed].clone(), master[decayed:].clone()]
    optimizer = torch.optim.AdamW([{"params": params[:1], "weight_decay": 0.1},
                                   {"params": params[1:], "weight_decay": 0.0}],
                                  lr=lr, betas=(0.9, 0.95), eps=1e-8, fused=True)
    for param, m, v, g in zip(params, exp_avg.split([decayed, len(master) - decayed]),
                              exp_avg_sq.split([decayed, len(master) - decayed]),
                              grad.float().split([decayed, len(master) - decayed]),
                              strict=True):
        optimizer.state[param] = {"step": torch.tensor(float(steps), device=param.device),
                                  "exp_avg": m.clone(),
                                  "exp_avg_sq": v.clone()}
        param.grad = g.clone()
    optimizer.grad_scale, optimizer.found_inf = grad_scale, found_inf
    optimizer.step()
    return (torch.cat(params), torch.cat([optimizer.state[p]["exp_avg"] for p in params]),
            torch.cat([optimizer.state[p]["exp_avg_sq"] for p in params]))


@pytest.mark.parametrize("device,compiled,dtype", [
    ("cpu", False, torch.bfloat16), ("cpu", False, torch.float16),
    ("cpu", True, torch.bfloat16),
    pytest.param("cuda", True, torch.bfloat16, marks=pytest.mark.skipif(
        gpu_count() == 0, reason="needs a CUDA GPU"))])
@pytest.mark.parametrize("nonfinite", [False, True])
def test_one_pass_steps_as_torchs_adamw_on_fp32_copies(device, compiled, nonfinite, dtype):
    """Master, moments and step count as torch's fused AdamW leaves fp32 copies of them, to
    fp32 rounding (the same formula in the same order), with the gradient scaled by
    1 / grad_scale and the decay on each unit's leading `decayed` elements only; the 16-bit
    parameters are the rounded masters; a non-finite step leaves all of them. Several units
    of different lengths and splits (none decayed, some, all) in one call, eager and
    compiled as on a GPU (here by inductor's CPU backend; on CUDA in a spawned rank, as the
    suite's own process sees no GPU)."""
    if device == "cuda":
        run_distributed(_one_pass_case, 1, (device, compiled, nonfinite, dtype),
                        device="cuda", timeout_s=300)
    else:
        _one_pass_case(device, compiled, nonfinite, dtype)


def _one_pass_case(device: str, compiled: bool, nonfinite: bool, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(0)
    steps = 3
    scale = torch.tensor(2.5, device=device)
    found_inf = torch.tensor(float(nonfinite), device=device)
    units, wants = [], []
    for n, decayed in ((1000, 700), (301, 0), (64, 64)):
        master, exp_avg, exp_avg_sq, grad = (t.to(device) for t in (
            torch.randn(n, generator=g), torch.randn(n, generator=g) * 1e-2,
            torch.rand(n, generator=g) * 1e-4, torch.randn(n, generator=g).to(dtype)))
        wants.append(_adamw_on_copies(master, exp_avg, exp_avg_sq, grad, decayed, 1e-2,
                                      steps - 1, scale, found_inf))
        units.append((master.clone(), exp_avg.clone(), exp_avg_sq.clone(), master.to(dtype),
                      grad, decayed, master))
    masters, exp_avgs, exp_avg_sqs, params, grads, decayed, before = (
        list(each) for each in zip(*units, strict=True))
    master_adamw_(masters, exp_avgs, exp_avg_sqs, params, grads, decayed,
                  torch.tensor(1e-2, device=device), 0.9, 0.95, 1e-8, 0.1,
                  torch.tensor(float(steps), device=device), scale, found_inf,
                  compiled=compiled)
    for index, want in enumerate(wants):
        ours = (masters[index], exp_avgs[index], exp_avg_sqs[index])
        for got, expected in zip(ours, want, strict=True):
            torch.testing.assert_close(got, expected, rtol=2e-6, atol=1e-7)
        assert torch.equal(params[index], masters[index].to(dtype))
        # a non-finite step changes nothing
        assert nonfinite == torch.equal(masters[index], before[index])


def test_the_engines_step_is_torchs_adamw_on_each_piece():
    """Through the engine (bf16, clipped): each piece's master and moments, as torch's AdamW
    steps fp32 copies of them from the bf16 gradients; the decayed pieces are the matrices,
    wherever they sit in their unit."""
    layout = Layout()
    engine = build_engine(TINY, layout, build_groups(layout), "cpu", seed=0,
                          options=RuntimeOptions(precision="bf16"))
    x = torch.randint(0, TINY.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    engine.forward_backward_on_device(x, x)
    grads = {id(p): p.grad.float().clone() for p in engine.model.parameters()}
    before = [(piece, view.clone()) for piece, view in engine.pieces]
    norm = engine.clip_grad_norm_on_device(1e-3)
    factor = float(1e-3 / (norm + 1e-6))
    assert factor < 1  # clipped
    engine.optimizer_step(1e-2)
    hyper = engine.optimizer.param_groups[0]
    flat = {m.untyped_storage().data_ptr() for m in engine.masters.exp_avgs}
    for (piece, master), (_, view) in zip(before, engine.pieces, strict=True):
        param = master.clone()
        optimizer = torch.optim.AdamW([param], lr=1e-2, betas=hyper["betas"], eps=hyper["eps"],
                                      weight_decay=0.1 if piece.param.dim() >= 2 else 0.0)
        param.grad = grads[id(piece.param)].reshape(-1)[piece.lo:piece.hi] * factor
        optimizer.step()
        torch.testing.assert_close(view, param, rtol=1e-5, atol=1e-7)
        state = engine.optimizer.state[view]
        assert state["exp_avg"].untyped_storage().data_ptr() in flat  # one flat pair a unit
        torch.testing.assert_close(state["exp_avg"], optimizer.state[param]["exp_avg"],
                                   rtol=1e-5, atol=1e-9)
        assert float(state["step"]) == 1


class _Launches(TorchDispatchMode):
    """The ops that compute (not views) and what `torch.cat` writes from what."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []
        self.mixed_cats = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not func.is_view:
            self.ops.append(str(func.overloadpacket))
        if func.overloadpacket is torch.ops.aten.cat and "out" in kwargs:
            self.mixed_cats += any(t.dtype != kwargs["out"].dtype for t in args[0])
        return func(*args, **kwargs)


def _step_launches(layers: int, precision: str = "bf16") -> _Launches:
    cfg = TINY.replace(n_layers=layers)
    layout = Layout()
    engine = build_engine(cfg, layout, build_groups(layout), "cpu", seed=0,
                          options=RuntimeOptions(precision=precision))
    x = torch.randint(0, cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    engine.forward_backward_on_device(x, x)
    with _Launches() as launches:
        engine.clip_grad_norm_on_device(1.0)
        engine.optimizer_step(1e-2)
    return launches


def test_the_step_computes_in_multi_tensor_ops_not_one_per_parameter():
    """Norm, clipping, the fp32 gradient copies, AdamW and the write-back of bf16 weights
    over fp32 masters are multi-tensor ops: a deeper model steps with the same ops, so on a
    GPU the host launches the same few kernels whatever the parameter count. (`torch.cat`
    of 16-bit gradients into an fp32 output would launch one copy per parameter there: its
    batched CUDA kernel wants one dtype.)"""
    shallow, deep = _step_launches(1), _step_launches(3)
    assert deep.ops == shallow.ops, (len(shallow.ops), len(deep.ops))
    assert shallow.mixed_cats == deep.mixed_cats == 0


def test_fp32_gradients_are_clipped_inside_the_masters_pass():
    """bf16 weights with fp32 gradients: the clipping factor goes into the masters' one pass
    (as for bf16 gradients), not a pass of its own over the gradients (8 bytes a parameter
    that the planner's count does not have), and steps as clipping them first would."""
    assert "aten._foreach_mul_" not in _step_launches(1, "bf16-fp32grad").ops
    layout = Layout()
    x = torch.randint(0, TINY.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    engines = [build_engine(TINY, layout, build_groups(layout), "cpu", seed=0,
                            options=RuntimeOptions(precision="bf16-fp32grad")) for _ in range(2)]
    for engine in engines:
        engine.forward_backward_on_device(x, x)
    norm = engines[0].clip_grad_norm_on_device(1e-3)
    factor = 1e-3 / (norm + 1e-6)
    assert float(factor) < 1  # clipped
    torch._foreach_mul_(engines[1].reducer.grad_buffers(), factor)  # clipped first
    for engine in engines:
        engine.optimizer_step(1e-2)
    for ours, clipped_first in zip(*(e.masters.masters for e in engines), strict=True):
        # g x f against g / (1 / f): a rounding apart, which AdamW scales by lr at most
        torch.testing.assert_close(ours, clipped_first, rtol=1e-6, atol=1e-8)


def test_every_piece_counts_the_same_steps_after_a_load_gives_each_its_own():
    """The masters' pieces share one step count, which a step adds to once; a checkpoint's
    load sets a count per piece (`set_optimizer_steps`), and the next step counts on from
    it for every piece."""
    from paraxis.model.checkpoint.entries import optimizer_steps, set_optimizer_steps

    layout = Layout()
    engine = build_engine(TINY, layout, build_groups(layout), "cpu", seed=0,
                          options=RuntimeOptions(precision="bf16"))
    x = torch.randint(0, TINY.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))

    def step() -> None:
        engine.forward_backward_on_device(x, x)
        engine.optimizer_step(1e-2)

    step()
    step()
    states = [engine.optimizer.state[view] for _, view in engine.pieces]
    assert len({id(state["step"]) for state in states}) == 1
    assert optimizer_steps(engine.optimizer) == 2
    set_optimizer_steps(engine.optimizer, 5)  # as a load does: a tensor a piece
    step()
    assert [float(state["step"]) for state in states] == [6.0] * len(states)
    assert len({id(state["step"]) for state in states}) == 1


def test_the_engines_compiled_step_trains_as_its_step_in_passes(monkeypatch):
    """The step a GPU runs (compiled, eight units a call, the last padded) through the
    engine, here by inductor's CPU backend, against the CPU's torch-fused step: after one
    step every master to fp32 rounding (from the same bf16 gradients; a unit's decay or
    moments mixed up with another's would differ by 1e-3), and the losses of the steps
    after it close (there a bf16 weight can round the other way)."""
    import paraxis.engine.data_parallel.masters as masters

    x = torch.randint(0, TINY.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    runs = []
    for compiled in (False, True):
        monkeypatch.setattr(masters, "master_adamw_",
                            functools.partial(master_adamw_, compiled=compiled))
        layout = Layout()
        engine = build_engine(TINY, layout, build_groups(layout), "cpu", seed=0,
                              options=RuntimeOptions(precision="bf16",
                                                     bucket_bytes=int(0.02 * MIB)))
        assert len(engine.masters.units) > 8  # more than one call, the last padded
        losses, first = [], None
        for _ in range(3):
            losses.append(float(engine.forward_backward_on_device(x, x)))
            engine.clip_grad_norm_on_device(1.0)
            engine.optimizer_step(1e-2)
            first = first or [view.clone() for _, view in engine.pieces]
        runs.append((losses, first))
    (losses, views), (compiled_losses, compiled_views) = runs
    for a, b in zip(views, compiled_views, strict=True):
        torch.testing.assert_close(a, b, rtol=2e-6, atol=1e-7)
    assert losses == pytest.approx(compiled_losses, rel=1e-3)


@pytest.mark.parametrize("name", ["gpt2-124m", "llama3-8b", "mixtral-8x7b",
                                  "deepseek-v3-style", "tiny-moe-shared"])
def test_the_planners_gathered_share_is_the_units_the_runtime_makes(name):
    """`plan.compute.gathered_share` (the gradients the one-rank step gathers into a flat
    copy, priced in its bytes) against the runtime's own units of those parameters, built
    on the meta device: a unit of several parameters is gathered, a parameter alone in its
    unit (at least a bucket) is read where it is. Four blocks (a DeepSeek-style model's
    first ones dense) stand for the model."""
    from paraxis.engine.data_parallel.buckets import make_buckets
    from paraxis.model.transformer import Transformer
    from paraxis.plan.compute import gathered_share
    from paraxis.spec.units import DEFAULT_BUCKET_BYTES

    cfg = PRESETS[name].replace(n_layers=min(4, PRESETS[name].n_layers))
    with torch.device("meta"):
        model = Transformer(cfg).to(torch.bfloat16)
    units = make_buckets(list(model.parameters()), DEFAULT_BUCKET_BYTES, lambda _: None,
                         torch.device("meta"))
    gathered = sum(u.numel for u in units if len(u.params) > 1) / sum(u.numel for u in units)
    assert gathered_share(cfg, 1, DEFAULT_BUCKET_BYTES, 2) == pytest.approx(gathered,
                                                                          abs=1e-3)
