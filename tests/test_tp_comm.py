"""What tensor parallelism sends: exactly the collectives Megatron's analysis counts.

Seeds, chapter 3: "an AllReduce after every attention block and every MLP block ... 2L
AllReduces per forward pass (and another 2L in the backward pass)". With sequence
parallelism each all-reduce becomes an all-gather + reduce-scatter pair (Korthikanti et al.
2022, sec. 4.2.2), moving the same bytes.
"""

from collections import Counter

import pytest
import torch
import torch.distributed as dist

from paraxis.dist.params import is_partial_over_tp
from paraxis.dist.testing import RankContext, on_ranks, run_on_ranks
from paraxis.model.transformer import build_model
from paraxis.parallel.tensor import CommCounter, apply_tensor_parallel
from paraxis.parallel.tensor.comm import (
    copy_to_tp,
    gather_from_sequence,
    reduce_from_tp,
    reduce_scatter_to_sequence,
    scatter_to_sequence,
)
from paraxis.parallel.tensor.partial import mark_partial_grad, sum_partial_grads
from paraxis.plan.comm import tp_collectives_per_layer
from paraxis.plan.head import ends_collectives
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import PRESETS

BATCH, SEQ = 2, 16


def seeds_per_layer(sequence_parallel: bool, mlp: str = "split"
                    ) -> dict[tuple[str, str], int]:
    """(kind, phase) -> collectives per transformer layer as the planner prices them
    (seeds ch. 3; Korthikanti fig. 5)."""
    planned = tp_collectives_per_layer(sequence_parallel, mlp)  # zeros included
    return {(kind, phase): n for phase, kinds in planned.items()
            for kind, n in kinds.items() if n}


def count_block(ctx: RankContext, model_name: str, sequence_parallel: bool,
                split_experts: bool = False) -> dict:
    cfg = PRESETS[model_name]
    model = apply_tensor_parallel(build_model(cfg, seed=0), dist.group.WORLD, sequence_parallel,
                                  split_experts)
    tp = dist.get_world_size()
    seq = SEQ // tp if sequence_parallel else SEQ
    x = torch.randn(BATCH, seq, cfg.d_model, requires_grad=True)
    with CommCounter() as counter:
        model.blocks[1](x).square().sum().backward()
    activation_bytes = BATCH * SEQ * cfg.d_model * 4  # one full (batch, seq, d_model) fp32
    per_kind = {(e.kind, e.phase) for e in counter.events if e.purpose == "activation"}
    counts = {key: counter.count(key[0], key[1], "activation") for key in per_kind}
    nbytes = {key: counter.nbytes(key[0], key[1], "activation") for key in per_kind}
    return {"counts": counts, "bytes": nbytes, "activation_bytes": activation_bytes, "tp": tp,
            "param_grad": counter.count("all_reduce", "backward", "param_grad"),
            "partial": sum(map(is_partial_over_tp, model.blocks[1].parameters())),
            "moe_params": len(list(model.blocks[1].moe.parameters())) if cfg.n_experts else 0,
            "other": counter.count(purpose="loss")}


@pytest.mark.parametrize("model_name", ["tiny", "tiny-llama"])
@pytest.mark.parametrize("sequence_parallel", [False, True], ids=["plain", "sp"])
def test_one_layer_sends_what_the_seeds_count(model_name, sequence_parallel):
    result = run_on_ranks("tp=2", count_block, model_name, sequence_parallel)[0]
    assert result["counts"] == seeds_per_layer(sequence_parallel)
    full, tp = result["activation_bytes"], result["tp"]
    if not sequence_parallel:
        assert result["bytes"] == {key: 2 * full for key in result["counts"]}
        assert result["partial"] == 0
    else:
        # An all-gather sends this rank's shard; a reduce-scatter takes the full tensor.
        for (kind, _), nbytes in result["bytes"].items():
            assert nbytes == 2 * (full // tp if kind == "all_gather" else full)
        # Replicated params applied to sequence shards: LayerNorm weight+bias x2 and the
        # o/down biases (GPT-2); RMSNorm weight x2 (Llama). Their gradients are partial
        # until the engine sums them, once a step (test below), not in the layer's backward.
        assert result["partial"] == (6 if model_name == "tiny" else 2)
    assert result["param_grad"] == 0


@pytest.mark.parametrize("split_experts", [False, True], ids=["etp1", "etp2"])
@pytest.mark.parametrize("sequence_parallel", [False, True], ids=["plain", "sp"])
def test_a_mixture_of_experts_block_sends_what_the_planner_counts(sequence_parallel,
                                                                  split_experts):
    """Experts split over tp (etp = tp) enter and leave the TP region as the dense MLP does.
    Whole on every rank (etp = 1) they need no collective without SP, and none with it
    either: each rank routes its own sequence shard (tiny-moe is dropless). The router's
    gradient, partial with split experts, and with SP the router's and every expert's,
    wait for the engine's once-a-step sum."""
    result = run_on_ranks("tp=2", count_block, "tiny-moe", sequence_parallel, split_experts)[0]
    mlp = "split" if split_experts else "shards" if sequence_parallel else "whole"
    assert result["counts"] == seeds_per_layer(sequence_parallel, mlp)
    # the router, or all of the block's
    moe = 1 if split_experts else result["moe_params"] if sequence_parallel else 0
    assert result["partial"] == 2 * sequence_parallel + moe  # RMSNorms, and the MoE's
    assert result["param_grad"] == 0


def count_model(ctx: RankContext, sequence_parallel: bool) -> dict:
    cfg = PRESETS["tiny"]
    model = apply_tensor_parallel(build_model(cfg, seed=0), dist.group.WORLD, sequence_parallel)
    idx = torch.randint(0, cfg.vocab_size, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    with CommCounter() as counter:
        model(idx, idx).backward()
    kinds = {(e.kind, e.phase) for e in counter.events if e.purpose == "activation"}
    return {"summary": counter.summary(), "layers": cfg.n_layers,
            "counts": {key: counter.count(*key, "activation") for key in kinds},
            "loss": counter.count(purpose="loss"),
            "forward": counter.count(phase="forward", purpose="activation"),
            "backward": counter.count(phase="backward", purpose="activation")}


@pytest.mark.parametrize("sequence_parallel", [False, True], ids=["plain", "sp"])
def test_whole_model_adds_one_collective_each_for_embedding_and_head(sequence_parallel):
    result = run_on_ranks("tp=2", count_model, sequence_parallel)[0]
    per_pass = 2 * result["layers"] * (2 if sequence_parallel else 1)
    # + the embedding's reduction forward, the LM head's region entry backward; with SP the
    # head's all-gather forward and the embedding's all-gather backward too.
    extra = 2 if sequence_parallel else 1
    assert result["forward"] == per_pass + extra
    assert result["backward"] == per_pass + extra
    # kind by kind, what the planner prices: its layers' and its two ends'
    planned = Counter({key: result["layers"] * n
                       for key, n in seeds_per_layer(sequence_parallel).items()})
    ends = ends_collectives(Layout(tp=2, sequence_parallel=sequence_parallel))
    planned.update(ends["embedding"] + ends["head"])
    assert result["counts"] == dict(planned)
    assert result["loss"] == 2  # max, then (target logit, sum exp) together
    assert set(result["summary"]) <= {"all_reduce", "all_gather", "reduce_scatter"}


@on_ranks("tp=2")
def test_operators_are_conjugate(ctx):
    rank = dist.get_rank()
    group = dist.group.WORLD
    x = torch.full((1, 4, 3), float(rank + 1), requires_grad=True)
    copy_to_tp(x, group).backward(torch.ones(1, 4, 3))
    assert torch.equal(x.grad, torch.full((1, 4, 3), 2.0))  # all-reduced backward
    x.grad = None
    reduced = reduce_from_tp(x, group)
    assert torch.equal(reduced, torch.full((1, 4, 3), 3.0))
    reduced.backward(torch.ones(1, 4, 3))
    assert torch.equal(x.grad, torch.ones(1, 4, 3))  # identity backward
    x.grad = None
    gathered = gather_from_sequence(x, group)
    assert gathered.shape == (1, 8, 3) and torch.equal(gathered[0, :4], torch.ones(4, 3))
    gathered.backward(torch.ones(1, 8, 3))
    assert torch.equal(x.grad, torch.full((1, 4, 3), 2.0))  # reduce-scattered backward
    x.grad = None
    scattered = reduce_scatter_to_sequence(x, group)
    assert scattered.shape == (1, 2, 3) and torch.equal(scattered, torch.full((1, 2, 3), 3.0))
    scattered.backward(torch.ones(1, 2, 3))
    assert torch.equal(x.grad, torch.ones(1, 4, 3))  # all-gathered backward
    x.grad = None
    chunk = scatter_to_sequence(x, group)
    assert chunk.shape == (1, 2, 3)
    chunk.backward(torch.ones(1, 2, 3))
    assert torch.equal(x.grad, torch.ones(1, 4, 3))


def _engine_step_calls(ctx: RankContext) -> tuple[int, int]:
    """(parameter-gradient calls, partial parameters) of one engine step with SP."""
    from paraxis.parallelize import materialize, parallelize

    cfg = PRESETS["tiny"]
    engine = parallelize(cfg, ctx.layout, ctx.groups, "cpu")
    materialize(engine, cfg, 0)
    x = torch.randint(0, cfg.vocab_size, (8 // ctx.layout.dp, SEQ),
                      generator=torch.Generator().manual_seed(0))
    with CommCounter() as counter:
        engine.forward_backward(x, x.roll(1, 1))
    partial = sum(map(is_partial_over_tp, (p for _, p in engine.named_parameters())))
    return counter.count("all_reduce", "backward", "param_grad"), partial


@pytest.mark.parametrize("layout", ["tp=2,sequence_parallel=true,microbatches=4",
                                    "dp=2,tp=2,zero=2,sequence_parallel=true,microbatches=2"])
def test_partial_gradients_are_summed_once_a_step(layout):
    """SP's partial gradients (every norm, the row-parallel biases, the positions) are
    summed over TP in one call a step, whatever the microbatches (Megatron-LM's
    finalize_model_grads): not one call per parameter per microbatch. Under ZeRO each rank
    sums the partial pieces of its own shard: none, where the shard holds none of them
    (they follow the matrices in each unit: FlatUnit)."""
    results = run_on_ranks(layout, _engine_step_calls)
    for calls, partial in results:
        assert partial == 4 * 6 + 2 + 1  # 4 layers x 6, the final norm, the positions
        assert calls <= 1
    assert max(calls for calls, _ in results) == 1


def sum_in_buckets(ctx: RankContext) -> dict:
    """`sum_partial_grads` with 40-byte buckets on real ranks: fp32 gradients of 12, 20,
    160, 8 bytes and a non-contiguous 64-byte one go in runs [12, 20], [160] (alone, in
    place), [8], [64] (alone, through a copy)."""
    rank = dist.get_rank()
    shapes = [(3,), (5,), (40,), (2,), (4, 4)]
    params = [torch.nn.Parameter(torch.zeros(shape)) for shape in shapes]
    for param in params:
        mark_partial_grad(param, dist.group.WORLD)
    grads = [torch.full(shape, rank + 1.0) for shape in shapes]
    grads[-1] = grads[-1].t()
    big = grads[2].data_ptr()
    with CommCounter() as counter:
        sum_partial_grads(list(zip(params, grads, strict=True)), dist.group.WORLD, 40)
    return {"sums": [sorted(set(g.flatten().tolist())) for g in grads],
            "calls": counter.count("all_reduce", "backward", "param_grad"),
            "in_place": grads[2].data_ptr() == big}


def test_partial_gradients_are_summed_a_bucket_at_a_time():
    for result in run_on_ranks("tp=2", sum_in_buckets):
        assert result["sums"] == [[3.0]] * 5  # 1 + 2 everywhere
        assert result["calls"] == 4 and result["in_place"]


def test_nested_counters_each_see_their_own_events():
    from paraxis.parallel.tensor.counter import record

    with CommCounter() as outer:
        record("all_reduce", 8, "forward")
        with CommCounter() as inner:  # the same events as the outer's so far: equal lists
            inner.events.extend(outer.events)
            record("all_gather", 4, "forward")
        record("reduce_scatter", 2, "backward")
    assert [e.kind for e in outer.events] == ["all_reduce", "all_gather", "reduce_scatter"]
    assert [e.kind for e in inner.events] == ["all_reduce", "all_gather"]
