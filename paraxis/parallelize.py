"""From a model config and a Layout to the engine that trains it: the one assembly line.

    engine = build_engine(model_cfg, layout, groups, device, seed=0)
           = parallelize(model_cfg, layout, groups, device)   # no values read or drawn
             + materialize(engine, model_cfg, seed)           # each rank fills what it owns

`parallelize` applies the axes in the order a reader expects (torchtitan's parallelize
functions have the same shape): split the pipeline (each stage builds only its own part, on
the meta device), split each part for tensor parallelism, point it at this rank's chunks of
the sequence (context parallelism), give the projections their FP8 GEMMs under an FP8
policy, choose what to recompute, then hand the parameters to
gradient sync / ZeRO over the dp (x cp) group, which gives them storage on the device. It
never reads a parameter's value, so it runs on a model that does not exist yet: with
`device="meta"` nothing at all is allocated (tests/test_parallelize.py).

`materialize` then writes each parameter's single-device initial value (`model.init_parameter`,
a function of the seed and the name alone) into whatever piece of it this rank holds, through
the by-name path checkpoint loading uses (`checkpoint.pieces.fill_entries`): a TP slice, a
ZeRO shard, a stage's blocks all start bit for bit from the single-device weights. Each value
is drawn whole (that is what makes it layout-independent), one tensor at a time, and only for
the parameters the rank holds a piece of: a rank's memory is its share plus one full tensor.

A new axis plugs in at one place in `parallelize` (its step, at its place in the order, as
context parallelism's step 3, experts' step 4), one field in the Layout
(`paraxis/spec/layout.py`), and one folder holding its modules (`parallel/context/`,
`parallel/experts/`).
"""

from __future__ import annotations

import os
import shutil

import torch
from torch import nn

from paraxis.dist.groups import ParallelGroups
from paraxis.engine.contract import Engine
from paraxis.engine.data_parallel.engine import DataParallelEngine
from paraxis.engine.pipeline_parallel.engine import PipelineEngine
from paraxis.kernels.fp8_modules import check_fp8, convert_to_fp8
from paraxis.model.checkpoint.pieces import FullSource, fill_entries
from paraxis.model.init_weights import initial_value
from paraxis.model.stage import stage_parts
from paraxis.model.transformer import SequenceSplit, Transformer, state_shapes
from paraxis.parallel.context.hierarchical import CpLevels
from paraxis.parallel.experts.expert_parallel import shard_experts
from paraxis.parallel.tensor.apply import apply_tensor_parallel
from paraxis.parallel.tensor.comm import keep_collectives_eager
from paraxis.spec.errors import ParaxisError
from paraxis.spec.kernels import check_fused_loss
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import ModelConfig
from paraxis.spec.partition import Partition, partition_layers
from paraxis.spec.precision import get_policy
from paraxis.spec.runtime_options import DEFAULT_OPTIONS, RuntimeOptions
from paraxis.spec.schedules import check_compile


def parallelize(cfg: ModelConfig, layout: Layout, groups: ParallelGroups,
                device: str | torch.device, *, partition: Partition | None = None,
                options: RuntimeOptions = DEFAULT_OPTIONS) -> Engine:
    """This rank's engine for `layout`, its parameters allocated on `device` but not filled
    (see `materialize`). `partition`: the pipeline split (default: `partition_layers`);
    `options`: precision, optimizer, compile, packing and the rest (`spec.runtime_options`;
    `spec.kernels.check_fused_loss` and `spec.precision.fp8_gather_problem` say where the
    fused loss and the FP8 gather run)."""
    end_of_document = options.end_of_document
    device = torch.device(device)
    partition = partition or partition_layers(cfg, layout.pp, layout.virtual_stages,
                                                placement=layout.placement)
    # 1. pipeline: this stage's parts (a block range, with or without embedding and head)
    parts = stage_parts(cfg, partition, groups.pp_rank)
    # 2. tensor parallelism: the plan (parallel/tensor/apply.py) splits each part in place
    for part in parts:
        apply_tensor_parallel(part, groups, layout.sequence_parallel, layout.etp > 1)
    # 3. context parallelism: every part runs on this rank's two chunks of each sequence,
    #    its attention over the cp group
    if layout.cp > 1:
        levels = CpLevels(groups.cp_a2a_group, groups.cp_across_group) if (
            layout.cp_a2a > 1) else None
        split = SequenceSplit(groups.cp_group, groups.cp_rank, layout.cp, layout.cp_attention,
                              levels)
        for part in parts:
            part.set_context_parallel(split)
    # 4. experts: the routing statistics over the ranks sharing a microbatch step (dp x cp;
    #    and tp, where step 2 left each tp rank its own sequence shard), and with ep > 1
    #    only this rank's experts, the others reached by all-to-all over the ep group
    if cfg.n_experts:
        layout.validate(model=cfg)
        for part in parts:
            shard_experts(part, cfg.n_experts, layout.ep, groups.ep_rank, groups.ep_group,
                          groups.replica_group)
    # 5. document packing: attention and positions within each document
    if end_of_document is not None:
        for part in parts:
            part.set_packing(end_of_document)
    # 6. FP8: every block projection the policy names runs its matmul in FP8, its scales
    #    reduced over the groups that split what one device's GEMM sees (kernels/fp8.py)
    policy = get_policy(options.precision)
    if policy.fp8_recipe is not None:
        check_fp8(policy, cfg, layout.tp, layout.etp, device)
        tokens = (groups.cp_group,) if layout.cp > 1 else ()
        for part in parts:
            convert_to_fp8(part, policy, tokens, tokens if layout.ep == 1 else ())
    # 7. the LM head and the loss fused (never the whole logits), on the part holding them
    if options.fused_loss:
        check_fused_loss(layout.tp, layout.zero)
        for part in parts:
            part.fused_loss = part.has_head
    # 8. activation recompute
    for part in parts:
        part.set_recompute(layout.recompute, layout.recompute_layers, layout.recompute_method)
    # 9. compile: after recompute, which wraps what is compiled
    if options.compile:
        check_compile(layout.schedule, options.compile)
        check_compiler(device)
        for part in parts:
            if compiles_whole(cfg, layout, end_of_document):
                part.compile()
            else:
                compile_blocks(part, head=layout.zero < 3)
    # 10. gradient sync / ZeRO over the dp group (dp x cp under context parallelism; a group
    #     of one when both are 1; experts split over ep: over the ranks holding them)
    model: nn.Module = parts[0] if layout.pp == 1 else nn.ModuleList(parts)
    data_parallel = DataParallelEngine(model, layout, groups, device, options)
    if layout.pp == 1:
        return data_parallel
    # 11. the pipeline schedule drives the stage's parts (and scales fp16's loss)
    return PipelineEngine(parts, data_parallel, groups)


def compiles_whole(cfg: ModelConfig, layout: Layout, end_of_document: int | None) -> bool:
    """Whether `--compile` compiles the whole model as one graph rather than block by block:
    where nothing inside its forward communicates, gathers or branches on the data (no
    tensor, context, pipeline or expert split, no ZeRO-3 hooks, no routing, no packing's
    documents, no recompute), so that one graph holds embedding, blocks, head and loss. On a
    GPU that is one guard check and one compiled call for the forward and one for the
    backward, where blocks compiled one by one cost a Python round trip each (12 for GPT-2
    124M, forward and backward); the kernels inside are the same."""
    return (layout.tp == layout.cp == layout.pp == layout.ep == 1 and layout.zero < 3
            and not cfg.n_experts and end_of_document is None and layout.recompute == "none")


def compile_blocks(part: Transformer, head: bool = True) -> None:
    """`torch.compile` each block's computation, the block's own hooks outside it (ZeRO-3
    gathers parameters in them) and the TP collectives inside it eager
    (`parallel/tensor/comm.py` marks them): the graphs hold the matmuls, norms and
    elementwise work between communications. Blocks share one graph (parameters are its
    inputs), so the compile costs about one graph per rank, forward and backward.

    With `head`, the final norm, LM head and loss too (`Transformer.head`): compiled, the
    loss's chunked passes over the logits become one fused kernel per chunk. ZeRO-3 hooks
    the norm and the head themselves (each a unit), so there only the loss is compiled.

    A routed (MoE) block's routing counts tokens per expert, which depends on the data, so
    there the attention half (`Block._attend`) and each expert MLP are compiled, the
    routing and dispatch between them eager; an expert's token count changes every step,
    so its graph is compiled for any count (`dynamic=True`)."""
    keep_collectives_eager()
    for block in part.blocks:
        moe = getattr(block, "moe", None)
        if moe is None:
            block._forward = torch.compile(block._forward)
            continue
        block._attend = torch.compile(block._attend)
        for expert in [*moe.experts, *([moe.shared] if hasattr(moe, "shared") else [])]:
            expert.forward = torch.compile(expert.forward, dynamic=True)
    if part.has_head:
        if head:
            part.head = torch.compile(part.head)
        else:
            part.loss_fn.forward = torch.compile(part.loss_fn.forward)


def check_compiler(device: torch.device) -> None:
    """torch.compile's CPU kernels are C++ built on the spot: without a compiler the first
    step would fail deep inside inductor, so say it here."""
    if device.type == "cpu" and not any(shutil.which(c) for c in (
            os.environ.get("CXX", ""), "g++", "clang++", "c++") if c):
        raise ParaxisError("--compile on CPU needs a C++ compiler (g++ or clang++, or set "
                           "CXX); install one or drop --compile")


@torch.no_grad()
def materialize(engine: Engine, cfg: ModelConfig, seed: int) -> None:
    """Fill every parameter piece (and buffer) this rank holds with its single-device
    initial value."""
    shapes = state_shapes(cfg)
    source = FullSource(lambda kind, name: initial_value(name, shapes[name], cfg, seed), shapes)
    fill_entries(engine, source, ("param",), f"initial weights (seed {seed})")


def interleaving_note(layout: Layout) -> str:
    """What a run asking for the interleaved schedule with one chunk per stage should know
    (it runs as 1F1B: the Layout keeps virtual_stages at 1 unless told); "" otherwise."""
    if layout.pp > 1 and layout.schedule == "interleaved" and layout.virtual_stages == 1:
        return ("note: schedule=interleaved with one chunk per stage runs as 1F1B; give "
                "virtual_stages=2 or more (--virtual-stages) to interleave")
    return ""


def build_engine(model_cfg: ModelConfig, layout: Layout, groups: ParallelGroups,
                 device: str | torch.device, *, seed: int,
                 options: RuntimeOptions = DEFAULT_OPTIONS, seq_len: int | None = None,
                 announce: bool = False) -> Engine:
    """The engine for `layout` with the seed's single-device initial weights, run as
    `options` say (`spec.runtime_options`). seq_len: weighs attention in the pipeline split;
    announce: print the split (rank 0, when not quiet)."""
    partition = partition_layers(model_cfg, layout.pp, layout.virtual_stages, seq_len=seq_len,
                                 placement=layout.placement)
    if announce and layout.pp > 1:
        print(f"pipeline split ({layout.pp} stages):\n{partition.describe()}", flush=True)
        if note := interleaving_note(layout):
            print(note, flush=True)
    engine = parallelize(model_cfg, layout, groups, device, partition=partition,
                         options=options)
    materialize(engine, model_cfg, seed)
    return engine
