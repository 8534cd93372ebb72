"""Pipeline parallelism on real gloo ranks: equal to one device, the executor runs exactly the
generated schedule, 1F1B holds fewer activations than GPipe, bad layouts fail in one line."""

import numpy as np
import pytest
import torch

from paraxis.dist.testing import RankContext, run_on_ranks
from paraxis.engine.contract import LocalEngine
from paraxis.engine.pipeline_parallel.memory import SavedActivations
from paraxis.model.transformer import build_model
from paraxis.parallelize import build_engine
from paraxis.plan.memory import layout_memory
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import PRESETS
from paraxis.spec.partition import partition_layers

STEPS, BATCH, SEQ, SEED = 5, 8, 16, 3


def _batches():
    generator = torch.Generator().manual_seed(0)
    return [(torch.randint(0, 256, (BATCH, SEQ), generator=generator),
             torch.randint(0, 256, (BATCH, SEQ), generator=generator)) for _ in range(STEPS)]


def _train(engine) -> list[float]:
    losses = []
    for step, (x, y) in enumerate(_batches()):
        losses.append(engine.forward_backward(x, y))
        engine.clip_grad_norm(1.0)
        engine.optimizer_step(1e-3 * (step + 1))
        engine.zero_grad()
    return losses


def _pipeline_rank(ctx: RankContext, cfg):
    layout = ctx.layout
    engine = build_engine(cfg, layout, ctx.groups, "cpu", seed=SEED)
    losses = _train(engine)
    params = {name: p.detach().numpy().copy() for name, p in engine.named_parameters()}
    trace = [(t["kind"], t["microbatch"], t["chunk"]) for t in engine.executor.trace]
    expected = [(a.kind, a.microbatch, a.chunk) for a in engine.schedule.stages[
        engine.groups.pp_rank]]
    assert {t["rank"] for t in engine.executor.trace} == {engine.groups.rank}
    assert all(t["end_s"] >= t["start_s"] for t in engine.executor.trace)
    return losses, params, trace, expected


@pytest.mark.parametrize("pp,schedule,virtual,model", [
    (2, "gpipe", 1, "tiny"),
    (2, "1f1b", 1, "tiny-llama"),
    (2, "interleaved", 2, "tiny"),
    (4, "gpipe", 1, "tiny-llama"),
    (4, "1f1b", 1, "tiny"),
    (4, "interleaved", 2, "tiny-llama-8"),
])
def test_pipeline_equals_single_device(pp, schedule, virtual, model):
    cfg = (PRESETS["tiny-llama"].replace(n_layers=8) if model == "tiny-llama-8"
           else PRESETS[model])
    layout = Layout(pp=pp, microbatches=4, schedule=schedule, virtual_stages=virtual)
    results = run_on_ranks(layout, _pipeline_rank, cfg, timeout_s=60)
    reference = LocalEngine(build_model(cfg, seed=SEED), Layout(microbatches=4))
    expected_losses = _train(reference)
    weights = dict(reference.model.named_parameters())
    seen = set()
    for losses, params, trace, expected in results:
        assert losses == pytest.approx(expected_losses, rel=1e-5)
        # the executor ran this stage's action list, nothing more or less: its computes in
        # order (a recv is recorded where its compute waits for it, after it was posted)
        assert sorted(trace) == sorted(expected)
        computes = ("F", "B", "W")
        assert [t for t in trace if t[0] in computes] == \
            [a for a in expected if a[0] in computes]
        for name, value in params.items():
            # GPT-2's last stage holds a copy of the tied embedding: it must equal tok_emb
            reference_name = "tok_emb.weight" if name not in weights else name
            np.testing.assert_allclose(value, weights[reference_name].detach().numpy(),
                                       rtol=0, atol=1e-5, err_msg=name)
            seen.add(reference_name)
    assert seen == set(weights)  # every parameter lives on some stage


def _pipeline_rank_recv_ahead(ctx: RankContext, cfg, recv_ahead):
    layout = ctx.layout
    engine = build_engine(cfg, layout, ctx.groups, "cpu", seed=SEED)
    default = engine.executor.recv_ahead
    engine.executor.recv_ahead = recv_ahead
    losses = _train(engine)
    # Each recv's irecv went out before the compute that precedes it in the schedule
    # (ahead), or after it, at the recv's own place (inline).
    started = {(e["kind"], e["microbatch"], e["chunk"]): e["start_s"]
               for e in engine.executor.trace}
    posted = {(e["tensor"], e["microbatch"], e["chunk"]): e["posted_s"]
              for e in engine.executor.trace if e["kind"] == "recv"}
    early, previous = [], None
    for action in engine.schedule.stages[ctx.groups.pp_rank]:
        if action.kind in ("F", "B", "W"):
            previous = (action.kind, action.microbatch, action.chunk)
        elif action.kind == "recv" and previous is not None:
            posted_s = posted[(action.tensor, action.microbatch, action.chunk)]
            early.append(posted_s < started[previous])
    return default, early, losses, {n: p.detach().numpy().copy()
                                    for n, p in engine.named_parameters()}


@pytest.mark.parametrize("schedule,virtual", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2)])
def test_receives_posted_ahead_change_timing_only(schedule, virtual):
    # Posting each irecv before the compute that precedes its wait (gloo's default) must
    # give the same bits as posting it where the schedule waits for it.
    cfg = PRESETS["tiny-llama"].replace(n_layers=4)
    layout = Layout(pp=2, microbatches=4, schedule=schedule, virtual_stages=virtual)
    ahead = run_on_ranks(layout, _pipeline_rank_recv_ahead, cfg, 1, timeout_s=60)
    inline = run_on_ranks(layout, _pipeline_rank_recv_ahead, cfg, 0, timeout_s=60)
    for (default, early_a, losses_a, params_a), (_, early_b, losses_b, params_b) in zip(
            ahead, inline, strict=True):
        assert default == 1  # gloo
        assert early_a and all(early_a)
        assert early_b and not any(early_b)
        assert losses_a == losses_b
        for name, value in params_a.items():
            np.testing.assert_array_equal(value, params_b[name], err_msg=name)


def _stage0_saved_bytes(ctx: RankContext, cfg):
    layout, groups = ctx.layout, ctx.groups
    engine = build_engine(cfg, layout, groups, "cpu", seed=SEED)
    x, y = _batches()[0]
    engine.forward_backward(x, y)  # warm-up, so lazily created state is not counted
    engine.zero_grad()
    with SavedActivations(engine.model.parameters()) as meter:
        engine.forward_backward(x, y)
    # one microbatch's forward alone: the unit the peak is measured in
    with SavedActivations(engine.model.parameters()) as single:
        if groups.is_first_stage:
            engine.parts[0](x[: BATCH // layout.microbatches])
    return meter.peak_bytes, single.peak_bytes


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_one_f_one_b_holds_p_microbatches_gpipe_holds_m(recompute):
    cfg = PRESETS["tiny"]
    pp, microbatches = 2, 8
    schedules = ("gpipe", "1f1b")
    layouts = [Layout(pp=pp, microbatches=microbatches, schedule=schedule, recompute=recompute)
               for schedule in schedules]
    per_layout = run_on_ranks(layouts, _stage0_saved_bytes, cfg, timeout_s=60)  # one launch
    held = {schedule: peak / unit  # stage 0: rank 0
            for schedule, ((peak, unit), *_) in zip(schedules, per_layout, strict=True)}
    # activations of stage 0 counted on real tensors, in microbatches' worth
    assert held["gpipe"] == pytest.approx(microbatches)
    assert held["1f1b"] == pytest.approx(pp)


def test_recompute_saves_activation_memory():
    cfg = PRESETS["tiny"]
    saved = {}
    x = torch.randint(0, 256, (2, 64))
    grads = {}
    settings = (("none", 1), ("selective", 1), ("full", 1), ("full", 2), ("full", 4),
                ("block", 1), ("block", 3))
    for mode, layers in settings:
        model = build_model(cfg)
        if mode == "block":  # only the first `layers` blocks a checkpoint (Megatron's method)
            model.set_recompute("full", layers, "block")
            assert [b.recompute for b in model.blocks] == [i < layers for i in range(4)]
        else:
            model.set_recompute(mode, layers)
        with SavedActivations(model.parameters()) as meter:
            loss = model(x, x)
        saved[mode, layers] = meter.live_bytes
        loss.backward()
        assert meter.live_bytes == 0  # backward released everything
        grads[mode, layers] = [p.grad for p in model.parameters()]
    assert saved["full", 1] < saved["selective", 1] < saved["none", 1]
    assert saved["full", 1] < saved["none", 1] / 4
    # a checkpoint per run of blocks keeps one block input per run, not one per block (the
    # course's sqrt(L) rule); the rest (embedding, head, loss) is the same
    block_input = 2 * 64 * cfg.d_model * 4  # fp32
    assert saved["full", 1] - saved["full", 2] == (cfg.n_layers - cfg.n_layers // 2) * block_input
    assert saved["full", 1] - saved["full", 4] == (cfg.n_layers - 1) * block_input
    # the block method: each block it checkpoints keeps its input instead of all it holds,
    # the others everything, as the planner counts it (`stages.recomputed_kinds`; priced
    # at a size where the backward's peak is the step's, not the optimizer's)
    per_block = (saved["none", 1] - saved["full", 1]) // cfg.n_layers
    for n in (1, 3):
        assert saved["none", 1] - saved["block", n] == n * per_block
        planned = [layout_memory(cfg, Layout(recompute=r, recompute_method=m,
                                             recompute_layers=k), 2048, 64)["activations"]
                   for r, m, k in (("none", "uniform", 1), ("full", "block", n),
                                   ("full", "uniform", 1))]
        assert (planned[0] - planned[1]) / (planned[0] - planned[2]) == pytest.approx(
            n / cfg.n_layers)
    # and recomputing changes no number
    for key in grads:
        assert all(torch.equal(a, b) for a, b in zip(grads[key], grads["none", 1], strict=True))


def test_partition_is_balanced_and_printed():
    cfg = PRESETS["gpt2-124m"]
    split = partition_layers(cfg, 4)
    assert [len(r) for r in split.parts] == [3, 4, 4, 1]  # the 50k-vocab head weighs ~3 blocks
    assert sum(len(r) for r in split.parts) == cfg.n_layers
    assert max(split.costs) == pytest.approx(split.costs[-1])
    text = split.describe()
    assert text.splitlines()[0].startswith("stage 0: embedding + blocks 0-2")
    assert "head/loss" in text.splitlines()[-1]
    uneven = partition_layers(PRESETS["tiny"], 3)
    assert sorted(len(r) for r in uneven.parts) == [1, 1, 2]
    measured = partition_layers(PRESETS["tiny"], 2, measured_s=[1.0, 1.0, 1.0, 5.0])
    assert [len(r) for r in measured.parts] == [3, 1]


@pytest.mark.parametrize("layout,message", [
    ("pp=4,microbatches=6,schedule=interleaved,virtual_stages=2", "multiple of pp"),
])
def test_interleaved_needs_m_multiple_of_p(layout, message):
    with pytest.raises(ParaxisError, match=message) as error:
        Layout.parse(layout)
    assert "\n" not in str(error.value)


def test_more_stages_than_layers_is_one_line():
    with pytest.raises(ParaxisError, match="cannot fill") as error:
        partition_layers(PRESETS["tiny"], 8)
    assert "\n" not in str(error.value)


class _Work:
    """Stands in for a torch Work in a pure test of `op_handles`: records its wait."""

    def __init__(self) -> None:
        self.waited = False

    def wait(self) -> bool:
        self.waited = True
        return True


def test_a_coalesced_batch_is_waited_whole_by_each_of_its_ops():
    """NCCL's batch_isend_irecv returns one Work for the whole group (gloo one per op): every
    op of the batch must then wait for that group, never index into it."""
    from paraxis.engine.pipeline_parallel.executor import op_handles
    ops = ["send", "recv", "recv"]
    per_op = [_Work(), _Work(), _Work()]
    assert op_handles(ops, per_op) == per_op
    group = [_Work()]
    handles = op_handles(ops, group)
    assert len(handles) == 3
    handles[2].wait()
    assert group[0].waited


def _boundary_messages(ctx: RankContext) -> tuple[set[int], float]:
    """The sizes of the activations and gradients this rank sent across the pipeline
    boundary in one step, and the planner's bytes per message for them."""
    import dataclasses

    from paraxis.engine.pipeline_parallel import executor as executor_module
    from paraxis.parallelize import build_engine
    from paraxis.plan.cost import boundary_message_bytes
    from paraxis.plan.hardware import GPUS

    cfg, layout = PRESETS["tiny"], ctx.layout
    sent: set[int] = set()
    post = executor_module.batch_isend_irecv

    def recorded(ops):
        sent.update(op.tensor.numel() * op.tensor.element_size() for op in ops
                    if op.op is torch.distributed.isend)
        return post(ops)

    executor_module.batch_isend_irecv = recorded
    try:
        engine = build_engine(cfg, layout, ctx.groups, "cpu", seed=SEED)
        x, y = _batches()[0]
        engine.forward_backward(x, y)
    finally:
        executor_module.batch_isend_irecv = post
    microbatch = 4 * BATCH // layout.microbatches * SEQ * cfg.d_model  # fp32 residual stream
    paraxis_runtime = dataclasses.replace(GPUS["a100-80gb"], kernels="eager")
    return sent, boundary_message_bytes(layout, paraxis_runtime, microbatch)


def test_the_planner_prices_the_boundary_messages_the_runtime_sends():
    """tp = 2 over pp = 2: every tp rank sends the whole boundary (no scatter-gather), its
    sequence shard under sequence parallelism."""
    layouts = [Layout(tp=2, pp=2, microbatches=2),
               Layout(tp=2, pp=2, microbatches=2, sequence_parallel=True)]
    for layout, ranks in zip(layouts, run_on_ranks(layouts, _boundary_messages, timeout_s=60),
                             strict=True):
        for sent, priced in ranks:
            assert sent == {priced}, str(layout)
