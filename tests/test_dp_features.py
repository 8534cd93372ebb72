"""Data parallelism beyond equivalence: overlap, memory against the planner, degenerate and bad
input, mixed precision."""

import math

import pytest
import torch
import torch.distributed as dist

from paraxis.dist.testing import RankContext, on_ranks, run_on_ranks
from paraxis.engine.contract import LocalEngine
from paraxis.engine.data_parallel import DataParallelEngine
from paraxis.model.transformer import build_model
from paraxis.plan.memory import FP32_ADAM, model_state_bytes
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import PRESETS
from paraxis.spec.precision import autocast_policy
from paraxis.spec.runtime_options import RuntimeOptions

TINY = PRESETS["tiny"]


def _batch(rows: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, 256, (rows, 16), generator=g),
            torch.randint(0, 256, (rows, 16), generator=g))


def _engine(ctx: RankContext, zero: int, micro: int = 1, bucket_bytes: int = 25 * 2**20,
            compute: str = "fp32"):
    layout = Layout(dp=dist.get_world_size(), zero=zero, microbatches=micro)
    return DataParallelEngine(build_model(TINY, seed=1), layout, ctx.with_layout(layout).groups,
                              options=RuntimeOptions(precision=autocast_policy(compute),
                                                     bucket_bytes=bucket_bytes))


@on_ranks(2)
def test_first_bucket_is_reduced_while_backward_still_runs(ctx):
    for zero, micro in ((0, 1), (2, 1), (3, 1), (0, 2)):
        engine = _engine(ctx, zero, micro, bucket_bytes=64_000)
        engine.reducer.record = True
        engine.forward_backward(*_batch(4, seed=dist.get_rank()))
        events = engine.reducer.events
        launches = [e for e in events if e[0] == "launch"]
        grads = [e for e in events if e[0] == "grad"]
        params = sum(1 for _ in engine.model.parameters())
        assert len(engine.reducer.units) >= 3
        # Only the last microstep communicates: one launch per unit, not one per microstep.
        assert [e[1] for e in launches] == list(range(len(engine.reducer.units)))
        first = launches[0]
        # When the first bucket's collective started, most gradients did not exist yet...
        assert first[2] < params // 2, (zero, first, params)
        # ...and backward went on producing them after it (time order, not just counts).
        assert first[3] < grads[-1][3]


@on_ranks(2)
def test_zero2_and_3_reduce_every_microbatch_and_never_hold_whole_gradients(ctx):
    """ZeRO-2/3 over several microbatches (no pipeline): each microbatch's backward
    reduce-scatters its gradients into the shards, as the planner prices it
    (plan/comm.dp_sync_time) and as DeepSpeed and FSDP do; between microbatches no
    parameter keeps a gradient, so no rank ever holds the whole model's."""
    micro = 4
    for zero in (2, 3):
        engine = _engine(ctx, zero, micro, bucket_bytes=64_000)
        engine.reducer.record = True
        x, y = _batch(8, seed=dist.get_rank())
        params = list(engine.model.parameters())
        for index, (xs, ys) in enumerate(zip(x.chunk(micro), y.chunk(micro), strict=True)):
            with engine.no_sync(last=index == micro - 1):
                engine.backward(engine.loss(xs, ys) / micro)
            if index < micro - 1:
                assert all(p.grad is None for p in params), zero
                assert all(u.grad_accum is None for u in engine.reducer.units), zero
        engine.finish_grad_sync()
        launches = [e[1] for e in engine.reducer.events if e[0] == "launch"]
        units = len(engine.reducer.units)
        assert units >= 3 and launches == list(range(units)) * micro, zero
        # The shards hold the mean over both ranks and all microbatches: one device's.
        reference = LocalEngine(build_model(TINY, seed=1), Layout(microbatches=micro))
        both = [torch.empty_like(t) for t in (x, y) for _ in range(2)]
        dist.all_gather(both[:2], x)
        dist.all_gather(both[2:], y)
        reference.forward_backward(torch.cat(both[:2]), torch.cat(both[2:]))
        norm = engine.clip_grad_norm(1e9)
        expected = torch.sqrt(sum(p.grad.pow(2).sum() for p in reference.model.parameters()))
        assert norm == pytest.approx(float(expected), rel=1e-5), zero


def _model_state_by_zero(ctx: RankContext, dp: int) -> dict:
    measured = {}
    for zero in range(4):
        engine = _engine(ctx, zero)
        start = engine.memory_report()
        engine.forward_backward(*_batch(dp))
        engine.clip_grad_norm(1.0)
        engine.optimizer_step(1e-3)
        measured[zero] = (start, engine.memory_report())
    return measured


@pytest.mark.parametrize("dp", [2, 4])
def test_model_state_memory_matches_the_planner(dp):
    num_params = TINY.num_params()
    for measured in run_on_ranks(dp, _model_state_by_zero, dp):
        for zero, (start, after_step) in measured.items():
            predicted = model_state_bytes(num_params, dp, zero, FP32_ADAM)
            for report in (start, after_step):
                for state in ("params", "grads", "optimizer"):
                    assert report[state] == pytest.approx(predicted[state], rel=0.01), \
                        (dp, zero, state, report, predicted)


@on_ranks("dp=2")
def test_mismatched_world_size_is_a_clear_error(ctx):
    with pytest.raises(ParaxisError, match=r"dp\*tp\*pp = 4\*1\*1 = 4 but the world has 2"):
        ctx.with_layout(Layout(dp=4))
    groups = ctx.groups
    with pytest.raises(ParaxisError, match="layout dp=4 but this rank's dp group has 2"):
        DataParallelEngine(build_model(TINY), Layout(dp=4), groups)


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_zero_with_one_rank_degenerates_to_plain_training(zero):
    reference = LocalEngine(build_model(TINY, seed=2), Layout())
    engine = DataParallelEngine(build_model(TINY, seed=2), Layout(zero=zero), None)
    for step in range(3):
        losses = []
        for e in (reference, engine):
            losses.append(e.forward_backward(*_batch(4, seed=step)))
            e.clip_grad_norm(0.5)
            e.optimizer_step(1e-3)
            e.zero_grad()
        assert losses[1] == pytest.approx(losses[0], rel=1e-6)
    ours = engine.full_parameters()
    for name, p in reference.model.named_parameters():
        torch.testing.assert_close(ours[name], p.detach(), rtol=0, atol=1e-6)


@on_ranks(2)
def test_bf16_compute_trains_close_to_fp32(ctx):
    x, y = _batch(4, seed=dist.get_rank())
    for zero in (0, 3):
        fp32, bf16 = _engine(ctx, zero), _engine(ctx, zero, compute="bf16")
        losses: list[list[float]] = [[], []]
        for _ in range(3):  # the steps after the first show the optimizer's updates
            for engine, mine in ((fp32, losses[0]), (bf16, losses[1])):
                mine.append(engine.forward_backward(x, y))
                engine.clip_grad_norm(1.0)
                engine.optimizer_step(1e-2)
                engine.zero_grad()
        assert all(math.isfinite(loss) for loss in losses[1])
        assert losses[1] == pytest.approx(losses[0], rel=2e-2)
        assert losses[0][2] < losses[0][0] - 1e-3  # the steps moved the weights
        # Master weights and gradients stay fp32 whatever the compute dtype.
        assert all(p.dtype == torch.float32 for p in bf16.model.parameters())
        assert all(b.dtype == torch.float32 for b in bf16.reducer.grad_buffers())


def test_fp16_overflow_skips_the_step_and_halves_the_scale():
    engine = DataParallelEngine(build_model(TINY, seed=2), Layout(zero=2), None,
                                options=RuntimeOptions(precision=autocast_policy("fp16")))
    engine.loss_scaler.scale = 2.0**120  # the scaled fp32 loss overflows: inf gradients
    before = {n: p.detach().clone() for n, p in engine.model.named_parameters()}
    engine.forward_backward(*_batch(2))
    assert not math.isfinite(engine.clip_grad_norm(1.0))
    engine.optimizer_step(1e-3)
    engine.zero_grad()
    assert engine.loss_scaler.scale == 2.0**119
    for n, p in engine.model.named_parameters():
        assert torch.equal(p, before[n])
    engine.loss_scaler.scale = 2.0**8
    engine.forward_backward(*_batch(2))
    assert math.isfinite(engine.clip_grad_norm(1.0))
    engine.optimizer_step(1e-3)
    assert any(not torch.equal(p, before[n]) for n, p in engine.model.named_parameters())
