"""The planner's activation count of one layer against what paraxis's block keeps for its
backward, tensor by tensor, eager and compiled."""

from __future__ import annotations

import pytest
import torch

from paraxis.model.transformer import Block
from paraxis.plan.activations import layer_activation_bytes
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import PRESETS

BATCH, SEQ = 2, 64
# What the count leaves out: the norms' per-row statistics and rotary's cos and sin tables
# (s x head_dim each): 1.8% of the eager 64-wide Llama block's bytes here, about 0.3% of a
# Llama 3 8B layer's at 8K tokens
TOLERANCE = 0.025


def kept_bytes(block: torch.nn.Module, run, x: torch.Tensor) -> int:
    """Bytes of the storages one forward of `run` saves for its backward, the block's
    parameters aside (views of one storage counted once)."""
    params = {p.untyped_storage().data_ptr() for p in block.parameters()}
    kept: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            kept[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        run(x)
    return sum(kept.values())


def block_of(name: str) -> Block:
    """The preset's block in bf16. On CPU, torch's eager RMSNorm is a composite of fp32 ops
    that keeps fp32 intermediates; CUDA runs one fused kernel that keeps the input and the
    per-row statistics, as the compiled block does everywhere: an eager Llama block gets
    LayerNorms, which keep the same."""
    block = Block(PRESETS[name]).to(torch.bfloat16)
    if isinstance(block.norm1, torch.nn.RMSNorm):
        width = PRESETS[name].d_model
        block.norm1, block.norm2 = (torch.nn.LayerNorm(width, bias=False).to(torch.bfloat16)
                                    for _ in range(2))
    return block


@pytest.mark.parametrize("name, compiled", [("tiny", False), ("tiny", True),
                                            ("tiny-llama", False), ("tiny-llama", True)])
def test_a_block_keeps_what_the_planner_counts(name, compiled):
    """bf16, the flash kernel, no recompute: the attention kernel's output is the output
    projection's input (a view, no copy) and, with rotary positions, the rotated q and k
    are kept beside the q/k/v projection that v keeps alive; within the norms' statistics."""
    torch.manual_seed(0)
    cfg = PRESETS[name]
    block = Block(cfg).to(torch.bfloat16) if compiled else block_of(name)
    # inductor's partitioner and decompositions, without its code generation
    run = torch.compile(block, backend="aot_eager_decomp_partition") if compiled else block
    x = torch.randn(BATCH, SEQ, cfg.d_model, dtype=torch.bfloat16, requires_grad=True)
    for _ in range(2):  # compiled: the graphs made before the count
        run(x).float().square().mean().backward()
    want = layer_activation_bytes(cfg, SEQ, BATCH, dropout=False)
    assert kept_bytes(block, run, x) == pytest.approx(want, rel=TOLERANCE)


def _cp_block_bytes(ctx, name: str, variant: str) -> tuple[int, float]:
    """A block on this rank's share of the sequence, its K/V brought by `variant`: what it
    keeps for its backward, and the planner's count for it."""
    from paraxis.model.transformer import SequenceSplit
    from paraxis.plan.context import repeated_kv_bytes

    torch.manual_seed(0)
    cfg, cp = PRESETS[name], ctx.world_size
    block = block_of(name)
    block.attn.split = SequenceSplit(None, ctx.rank, cp, variant)
    x = torch.randn(BATCH, SEQ // cp, cfg.d_model, dtype=torch.bfloat16, requires_grad=True)
    block(x).float().square().mean().backward()
    want = layer_activation_bytes(cfg, SEQ // cp, BATCH, dropout=False,
                                  head_split=variant == "all_to_all") \
        + repeated_kv_bytes(cfg, variant, cp, 1, SEQ, BATCH)
    return kept_bytes(block, block, x), want


def test_a_context_parallel_block_keeps_what_the_planner_counts():
    """Each variant on 2 ranks: the ring's and all-gather's output is the projection's input
    as a flash kernel's is; the all-to-all copies q, k, v into its own and hands the
    projection an output of its own."""
    from paraxis.dist.testing import run_on_ranks

    cases = [(name, variant) for name in ("tiny", "tiny-llama")
             for variant in ("ring", "all_gather", "all_to_all")]
    for rank, counts in enumerate(run_on_ranks(2, _cp_block_cases, cases)):
        for (name, variant), (kept, want) in zip(cases, counts, strict=True):
            assert kept == pytest.approx(want, rel=TOLERANCE), (name, variant, rank)


def _cp_block_cases(ctx, cases: list[tuple[str, str]]) -> list[tuple[int, float]]:
    return [_cp_block_bytes(ctx, name, variant) for name, variant in cases]


def _tp_block_cases(ctx, names: tuple[str, ...]) -> list[tuple[int, float]]:
    """Each preset's block split over this launch's tp ranks (sequence-parallel or not):
    what it keeps for its backward, and the planner's count for paraxis's runtime."""
    from paraxis.model.transformer import Transformer
    from paraxis.parallel.tensor import apply_tensor_parallel

    layout, counts = ctx.layout, []
    for name in names:
        torch.manual_seed(0)
        cfg = PRESETS[name]
        part = Transformer(cfg, blocks=range(1), embed=False, head=False)
        part.blocks[0] = block_of(name)  # the tensor-parallel plan names blocks by position
        block = apply_tensor_parallel(part, ctx.groups, layout.sequence_parallel)
        local = SEQ // layout.tp if layout.sequence_parallel else SEQ
        x = torch.randn(BATCH, local, cfg.d_model, dtype=torch.bfloat16, requires_grad=True)
        block(x).float().square().mean().backward()
        want = layer_activation_bytes(cfg, SEQ, BATCH, layout.tp, layout.sequence_parallel,
                                      dropout=False, sp_regather=False)
        counts.append((kept_bytes(block, block, x), want))
    return counts


def test_a_tensor_parallel_block_keeps_what_the_planner_counts():
    """tp = 2, with and without sequence parallelism: under SP the block keeps the norms'
    inputs as sequence shards and the attention's and MLP's gathered inputs whole, where
    Megatron-LM keeps shards and gathers them again in the backward (the planner's default,
    `sp_regather`, for the published runs)."""
    from paraxis.dist.testing import run_on_ranks

    names = ("small", "small-llama")
    layouts = [Layout(tp=2), Layout(tp=2, sequence_parallel=True)]
    for layout, ranks in zip(layouts, run_on_ranks(layouts, _tp_block_cases, names),
                             strict=True):
        for rank, counts in enumerate(ranks):
            for name, (kept, want) in zip(names, counts, strict=True):
                assert kept == pytest.approx(want, rel=TOLERANCE), (name, str(layout), rank)


@pytest.mark.parametrize("name", ["tiny-moe", "tiny-moe-shared"])
def test_a_mixture_of_experts_block_keeps_what_the_planner_counts(name):
    """bf16, dropless, one rank: the attention half as a dense block's, the experts' rows
    (dispatched input, SwiGLU's tensors), the router's, and the combine's one copy of the
    experts' outputs with their weights and indices (`experts.moe_activation_bytes`)."""
    from paraxis.plan.experts import moe_activation_bytes

    torch.manual_seed(0)
    cfg = PRESETS[name]
    block = Block(cfg, cfg.first_dense_layers).to(torch.bfloat16)  # the first MoE block
    block.norm1, block.norm2 = (torch.nn.LayerNorm(cfg.d_model, bias=False).to(torch.bfloat16)
                                for _ in range(2))  # as `block_of` says
    x = torch.randn(BATCH, SEQ, cfg.d_model, dtype=torch.bfloat16, requires_grad=True)
    want = layer_activation_bytes(cfg, SEQ, BATCH, dropout=False, mlp=False) \
        + moe_activation_bytes(cfg, SEQ, BATCH)
    assert kept_bytes(block, block, x) == pytest.approx(want, rel=TOLERANCE)
