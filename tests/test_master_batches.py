"""fp32 masters stepped a batch of units at a time (engine/data_parallel/masters.py): the same
numbers whatever the batch size, clipping and fp16's unscaling applied inside the fused
kernel, the fp32 gradient copies bounded by the batch."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from paraxis.dist.groups import build_groups
from paraxis.engine.contract import (
    adamw,
    fused_adamw_group,
    init_adam_state,
    takes_gradients_given,
)
from paraxis.engine.data_parallel import masters
from paraxis.engine.data_parallel.buckets import GradReducer
from paraxis.parallelize import build_engine
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import PRESETS
from paraxis.spec.optimizer import AdamW

TINY = PRESETS["tiny"]


def _train(precision: str, max_norm: float, steps: int = 3) -> tuple[list[torch.Tensor],
                                                                     list[float]]:
    layout = Layout()
    engine = build_engine(TINY, layout, build_groups(layout), "cpu", seed=0,
                          precision=precision)
    g = torch.Generator().manual_seed(0)
    norms = []
    for _ in range(steps):
        x = torch.randint(0, TINY.vocab_size, (4, 16), generator=g)
        y = torch.randint(0, TINY.vocab_size, (4, 16), generator=g)
        loss, norm = engine.train_step(x, y, 1e-2, max_norm)
        engine.zero_grad()
        norms.append(float(norm))
    return [m.clone() for m in engine.masters.masters], norms


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_batches_of_units_step_the_same_numbers_as_one(monkeypatch, precision):
    whole, norms = _train(precision, 0.05)
    assert max(norms) > 0.05  # clipping scaled every step's gradients
    monkeypatch.setattr(masters, "MASTER_STEP_ELEMENTS", 5_000)
    batched, _ = _train(precision, 0.05)
    for ours, theirs in zip(batched, whole, strict=True):
        assert torch.equal(ours, theirs)


def test_clipping_inside_the_kernel_matches_clipping_the_copies(monkeypatch):
    """grad_scale = 1 / factor in the fused kernel against the copies multiplied by the
    factor before an unfused step: the same update to fp32 rounding. One step: after it, a
    master one rounding apart can round to another bf16 weight, and Adam, which divides by
    the gradients' own scale, turns the tiniest gradients' differences into whole steps."""
    fused, _ = _train("bf16", 0.05, steps=1)
    monkeypatch.setattr(torch.optim.AdamW, "__init__", _unfused(torch.optim.AdamW.__init__))
    unfused, _ = _train("bf16", 0.05, steps=1)
    for ours, theirs in zip(fused, unfused, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    unclipped, _ = _train("bf16", 0.0, steps=1)
    assert not torch.allclose(unclipped[0], fused[0], rtol=1e-5, atol=1e-6)


def _unfused(init):
    def wrapped(self, *args, **kwargs):
        kwargs["fused"] = False
        init(self, *args, **kwargs)
    return wrapped


def test_a_batch_holds_at_most_the_cap_or_one_larger_unit(monkeypatch):
    layout = Layout()
    engine = build_engine(TINY, layout, build_groups(layout), "cpu", seed=0, precision="bf16",
                          bucket_mb=0.02)
    sizes = [o.numel() for o in engine.masters.owned]
    assert len(sizes) > 3
    cap = sum(sizes) // 4
    monkeypatch.setattr(masters, "MASTER_STEP_ELEMENTS", cap)
    batches = engine.masters.batches()
    assert 4 <= len(batches) < len(sizes)
    assert [i for b in batches for i in b] == list(range(len(sizes)))
    for batch in batches:
        assert len(batch) == 1 or sum(sizes[i] for i in batch) <= cap


def _train_microbatched(precision: str) -> tuple[list[torch.Tensor], list[float], object]:
    layout = Layout(microbatches=2)
    engine = build_engine(TINY, layout, build_groups(layout), "cpu", seed=0,
                          precision=precision)
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


@pytest.mark.parametrize("nonfinite", [False, True])
def test_gradients_handed_to_the_fused_kernel_step_as_torch_does(nonfinite):
    # `fused_adamw_group` (the masters' step) against torch's own AdamW.step on the same
    # tensors, gradient scale and non-finite flag: weights, moments and step counts equal
    g = torch.Generator().manual_seed(0)
    tensors = [torch.randn(shape, generator=g) for shape in ((8, 4), (4,), (3, 5))]
    drawn = [torch.randn(t.shape, generator=g) for t in tensors]
    sides = []
    for given in (False, True):
        params = [t.clone() for t in tensors]
        grads = [grad.clone() for grad in drawn]  # the kernel unscales them in place
        optimizer = adamw(params[::2], params[1:2], AdamW(weight_decay=0.1))
        init_adam_state(optimizer)
        for group in optimizer.param_groups:
            group["lr"] = 1e-2
        scale = torch.tensor(2.5)
        found_inf = torch.tensor(float(nonfinite))
        for _ in range(2):
            if given:
                assert takes_gradients_given(optimizer)
                for group in optimizer.param_groups:
                    fused_adamw_group(optimizer, group, group["params"],
                                      [grads[next(i for i, p in enumerate(params) if p is q)]
                                       for q in group["params"]], scale, found_inf)
            else:
                for p, grad in zip(params, grads, strict=True):
                    p.grad = grad
                optimizer.grad_scale, optimizer.found_inf = scale, found_inf
                optimizer.step()
        sides.append([params, [dict(optimizer.state[p]) for p in params]])
    (torch_params, torch_states), (ours, our_states) = sides
    for p, q in zip(torch_params, ours, strict=True):
        assert torch.equal(p, q)
    assert nonfinite == torch.equal(ours[0], tensors[0])  # a non-finite step changes nothing
    for a, b in zip(torch_states, our_states, strict=True):
        assert all(torch.equal(a[key], b[key]) for key in ("step", "exp_avg", "exp_avg_sq"))


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


def _step_launches(layers: int) -> _Launches:
    cfg = TINY.replace(n_layers=layers)
    layout = Layout()
    engine = build_engine(cfg, layout, build_groups(layout), "cpu", seed=0, precision="bf16")
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
