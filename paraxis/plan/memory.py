"""Per-GPU memory: model states under ZeRO 0-3, then the whole footprint of a layout."""

from __future__ import annotations

import functools
import math

from paraxis.plan.activations import (
    full_layer_activation_bytes,
    keeps_projection_input,
    layer_activation_bytes,
    logits_bytes,
)
from paraxis.plan.bubble import pipeline_figures
from paraxis.plan.comm import zero_traffic_bytes
from paraxis.plan.compute import own_gradients
from paraxis.plan.context import repeated_kv_bytes
from paraxis.plan.experts import (
    DEFAULT_IMBALANCE,
    feed_forward,
    moe_activation_bytes,
    rank_imbalance,
    routing_share,
)
from paraxis.plan.experts import local_params as local_params_of
from paraxis.plan.fp8 import (
    gather_bytes_per_param,
    keeps_fp8_inputs,
    kept_fp8_weight_bytes,
    saved_fp8_bytes_per_token,
)
from paraxis.plan.stages import (
    chunk_blocks,
    chunk_facts,
    head_sets,
    held_stages,
    kept_for_w_values,
    pending_stages,
    recomputed_kinds,
    stage_blocks,
    stage_kinds,
)
from paraxis.spec.errors import ParaxisError
from paraxis.spec.kernels import RUNTIME_KERNEL, loss_kernel_run, workspace_bytes
from paraxis.spec.layout import ZERO_STAGES, Layout
from paraxis.spec.model_config import ModelConfig
from paraxis.spec.precision import FP32_ADAM, MASTER_UNITS_A_CALL, MIXED_ADAM, Precision
from paraxis.spec.schedules import SPLIT_BACKWARD, head_stage
from paraxis.spec.units import DEFAULT_BUCKET_BYTES, DEFAULT_RESERVED_BYTES

__all__ = ["FP32_ADAM", "MIXED_ADAM", "Precision", "layout_memory", "model_state_bytes",
           "zero_table"]


def model_state_bytes(num_params: int, dp: int, zero: int,
                      precision: Precision = MIXED_ADAM) -> dict[str, float]:
    """Bytes per GPU of `num_params` parameters replicated over `dp` ranks, sharded by ZeRO.

    Returns {"params", "grads", "optimizer"}. ZeRO-1 shards the optimizer states, ZeRO-2 also
    the gradients, ZeRO-3 also the parameters.
    """
    if num_params < 0:
        raise ParaxisError(f"parameter count {num_params} is negative; give a count >= 0")
    if dp < 1:
        raise ParaxisError(f"dp={dp} must be at least 1")
    if zero not in ZERO_STAGES:
        raise ParaxisError(f"zero={zero!r} must be one of {', '.join(map(str, ZERO_STAGES))}")
    # ZeRO (Rajbhandari et al. 2020) Sec. 5.1-5.3, Fig. 1: P_os, P_os+g, P_os+g+p divide by N_d.
    optimizer_share = 1 / dp if zero >= 1 else 1.0
    grad_share = 1 / dp if zero >= 2 else 1.0
    param_share = 1 / dp if zero >= 3 else 1.0
    return {
        "params": num_params * precision.param_bytes * param_share,
        "grads": num_params * precision.grad_bytes * grad_share,
        "optimizer": num_params * precision.optimizer_bytes * optimizer_share,
    }


def zero_table(num_params: int, gpus: int,
               precision: Precision = MIXED_ADAM) -> list[dict[str, float]]:
    """The course's ZeRO calculator: one row per stage with the per-GPU bytes of each state
    ("total" their sum) and "traffic", the bytes each GPU sends per step (`comm`)."""
    rows = []
    for zero in range(4):
        states = model_state_bytes(num_params, gpus, zero, precision)
        rows.append({"zero": zero, **states, "total": sum(states.values()),
                     "traffic": zero_traffic_bytes(num_params, gpus, zero,
                                                   precision.grad_bytes,
                                                   precision.param_bytes)})
    return rows


def zero3_buffer_bytes(cfg: ModelConfig, layout: Layout, local_params: float,
                       precision: Precision) -> float:
    """What ZeRO-3 holds beyond its shards at its fullest moment, as paraxis's runtime does it
    (data_parallel/zero.py, buckets.py): units are the embedding, each block, the final norm
    and the LM head (one root unit for a tied embedding and head).

    - During a block's backward: that block and the prefetched one gathered (2 L params;
      under grouped full recompute, g blocks per checkpoint, the group's g blocks, gathered
      by its rerun forward and each freed at its own backward's end), the block's flat
      gradient filling up and the previous unit's still being reduced (one reduction in
      flight: 2 L grads), and one parameter's fresh gradient (its largest matrix M) before
      it moves into the flat buffer.
    - At the start of backward: the LM head gathered and its whole gradient (2 H).
    - A tied embedding and head: their root unit (R: embedding, head, final norm) gathered
      from the forward's start to the backward's end, and its flat gradient from the final
      norm's backward, at the start, to the embedding's, at the end (R grads).

    Under a pipeline (pipeline_parallel/zero3.py) the stage's gradients accumulate whole over
    the microbatches until each chunk's last backward reduces them (S grads), and either
    the whole stage stays gathered for the step (zero3_reshard=step: S params) or one unit,
    its prefetch and the next action's first unit are (forward: 3 L, or 2 L + H).
    """
    pb, gb = gather_bytes_per_param(cfg, precision), precision.grad_bytes  # gathered
    layer = _largest_block(cfg, layout.tp, layout.ep, layout.etp)
    head = _vocab_matrix(cfg, layout.tp)
    group = layout.checkpoint_group
    if layout.pp > 1:
        gathered = (local_params if layout.zero3_reshard == "step"
                    else max(3 * layer, 2 * layer + head, group * layer))
        return gathered * pb + local_params * gb
    block = max(2, group) * layer * pb + 2 * layer * gb + _largest_matrix(cfg, layout.tp) * gb
    if cfg.tied_embeddings:
        root = (cfg.embedding_params() + cfg.head_params()) / layout.tp
        return root * (pb + gb) + max(block, head * gb)
    return max(block, head * (pb + gb))


def _vocab_matrix(cfg: ModelConfig, tp: int) -> float:
    """Parameters of the embedding's (or LM head's) vocabulary x width matrix on one rank."""
    return cfg.vocab_size * cfg.d_model / tp


def _largest_matrix(cfg: ModelConfig, tp: int) -> float:
    """Parameters of a dense block's largest weight matrix on one rank."""
    return max(cfg.d_model * cfg.d_model, cfg.d_model * cfg.d_ff) / tp


@functools.lru_cache(maxsize=4096)  # a layout search asks for every stage of every layout
def _largest_block(cfg: ModelConfig, tp: int, ep: int, etp: int) -> float:
    """The largest block a rank gathers (an MoE block: its experts over ep and etp)."""
    return max(sum(local_params_of(cfg, [i], tp, ep, etp)) for i in {0, cfg.n_layers - 1})


def stage_local_params(cfg: ModelConfig, layout: Layout,
                       seq_len: int | None = None) -> list[tuple[float, float]]:
    """Per stage, (parameters one rank holds replicated over dp*cp, expert parameters it
    holds replicated over the dp*cp/ep ranks of their expert-data-parallel group): TP splits
    every matrix of a dense model (Shoeybi 2019); an MoE block's router is whole on every
    tp rank, its shared and routed experts too with etp = 1 or split over tp with etp = tp,
    the routed ones split over ep (plan/experts.py)."""
    return list(_stage_local_params(cfg, layout.pp, layout.virtual_stages, seq_len,
                                    layout.placement, layout.tp, layout.ep, layout.etp))


@functools.lru_cache(maxsize=4096)  # a layout search asks often
def _stage_local_params(cfg: ModelConfig, pp: int, virtual: int, seq_len: int | None,
                        placement: str, tp: int, ep: int,
                        etp: int) -> tuple[tuple[float, float], ...]:
    stages = stage_blocks(cfg, pp, virtual, seq_len, placement)
    totals = stage_params(cfg, pp, virtual, seq_len, placement)
    shares = []
    for blocks, total in zip(stages, totals, strict=True):
        if not cfg.is_moe:
            shares.append((total / tp, 0.0))
            continue
        replicated, experts = local_params_of(cfg, blocks, tp, ep, etp)
        blocks_total = sum(cfg.layer_params(i) for i in blocks)
        shares.append(((total - blocks_total) / tp + replicated, experts))
    return tuple(shares)


@functools.lru_cache(maxsize=65536)
def _block_params(cfg: ModelConfig, index: int) -> int:
    return cfg.layer_params(index)


def stage_params(cfg: ModelConfig, pp: int, virtual: int = 1,
                 seq_len: int | None = None, placement: str = "loop") -> list[int]:
    """Parameters each stage holds before TP: blocks, plus the embedding on the first stage
    and final norm + LM head on the last (Narayanan et al. 2021 Sec. 3.2). A tied head is a
    second copy of the embedding on the head's stage when pp > 1 (Megatron's word
    embeddings; in zb-v's V both sit on stage 0, which then holds both copies)."""
    counts = [sum(map(_block_params, [cfg] * len(blocks), blocks))
              for blocks in stage_blocks(cfg, pp, virtual, seq_len, placement)]
    counts[0] += cfg.embedding_params()
    counts[head_stage(pp, placement)] += cfg.head_params()
    if cfg.tied_embeddings and pp > 1:
        counts[head_stage(pp, placement)] += cfg.vocab_size * cfg.d_model
    return counts


def peak_moment(memory: dict[str, float]) -> str:
    """The moment a `layout_memory` row holds its bytes: the optimizer step's frees every
    activation, the backward's start holds some."""
    return "the optimizer step" if memory["activations"] == 0 else "the backward's start"


def pipeline_zero2_whole_grads(cfg: ModelConfig, zero: int, pp: int, zero2_reduce: str,
                               microbatches: int) -> bool:
    """Whether a pipeline's ZeRO-2 holds the stage's whole gradients beside its shards: it
    accumulates them whole over its microbatches and reduces them once (as ZeRO-1 does; a
    tied embedding's sum waits for the step's end too), where it reduces once a step
    (`GPU.pipeline_zero2_reduce`); a shard group of one rank too, whose shard is then the
    whole (the runtime keeps it apart all the same)."""
    return (zero == 2 and pp > 1 and zero2_reduce == "step"
            and (microbatches > 1 or cfg.tied_embeddings))


def check_interleaving(layout: Layout, cfg: ModelConfig) -> None:
    """Interleaving prices equal model chunks: the layers must split evenly into pp x v
    chunks (Megatron-LM refuses other depths; Narayanan et al. 2021 Sec. 2.2 assumes it)."""
    chunks = layout.pp * layout.virtual_stages
    if layout.virtual_stages > 1 and cfg.n_layers % chunks:
        fits = [v for v in range(2, cfg.n_layers // layout.pp + 1)
                if cfg.n_layers % (layout.pp * v) == 0]
        raise ParaxisError(
            f"{cfg.n_layers} layers do not split into pp*virtual_stages = {chunks} equal "
            f"chunks ({cfg.n_layers / chunks:g} layers each); use virtual_stages among "
            f"{fits[:6] or 'none: no interleaving at this pp'}")


@functools.lru_cache(maxsize=4096)  # a layout search asks for the same few hundred
def stage_states(local: int, experts: int, replicas: int, ep: int, zero: int,
                  precision: Precision) -> tuple[tuple[str, float], ...]:
    """A stage's model states: its `local` parameters over `replicas`, its routed `experts`'
    over their replicas / ep (`model_state_bytes`), as (name, bytes) pairs."""
    states = model_state_bytes(local, replicas, zero, precision)
    if experts:
        expert_states = model_state_bytes(experts, replicas // ep, zero, precision)
        states = {k: states[k] + expert_states[k] for k in states}
    return tuple(states.items())


def master_step_buffers(cfg: ModelConfig, layout: Layout, local_params: float,
                        expert_params: float, precision: Precision,
                        bucket_bytes: float = DEFAULT_BUCKET_BYTES,
                        one_pass: bool = True) -> float:
    """Bytes the optimizer step of fp32 masters of 16-bit parameters adds
    (engine/data_parallel/masters.py), MASTER_UNITS_A_CALL units a call: where the gradients
    are the parameters' own (`compute.own_gradients`) the flat copies of a call's units'
    several, a gradient bucket's at most each (a parameter alone in its unit gives its
    own). Without `one_pass` (CPU ranks: `kernels.master_adamw` compiles its pass on CUDA
    only) also an fp32 copy of a unit's gradient for torch's fused kernel, the largest
    unit's: a bucket or one parameter larger than a bucket, a block under ZeRO-3, of this
    rank's shard."""
    if precision.optimizer_bytes <= 8:
        return 0.0
    sharded = layout.zero >= 1
    shards = layout.zero_ranks if sharded else 1
    expert_shards = max(1, layout.zero_ranks // layout.ep) if sharded else 1
    owned = local_params / shards + expert_params / expert_shards  # this rank's part
    step = precision.grad_bytes * min(
        owned, MASTER_UNITS_A_CALL * bucket_bytes / precision.param_bytes) \
        if own_gradients(layout, precision) else 0.0
    if one_pass or precision.grad_bytes == 4:
        return step
    largest_parameter = max(_vocab_matrix(cfg, layout.tp), _largest_matrix(cfg, layout.tp))
    bucket = bucket_bytes / precision.param_bytes
    unit = _largest_block(cfg, layout.tp, layout.ep, layout.etp) if layout.zero == 3 else bucket
    largest = max(unit, largest_parameter) / shards
    if cfg.is_moe:  # the experts' units are sharded over the expert replicas: a block's
        # local experts under ZeRO-3, else a bucket or an expert's matrix alone in its unit
        matrix = cfg.d_ff_expert * cfg.d_model / layout.etp
        experts = (cfg.n_experts / layout.ep * cfg.expert_params() / layout.etp
                   if layout.zero == 3 else max(matrix, bucket))
        largest = max(largest, experts / expert_shards)
    return step + 4 * min(owned, largest)


def layout_memory(cfg: ModelConfig, layout: Layout, seq_len: int, micro_batch: int,
                  precision: Precision = MIXED_ADAM,
                  attention: str = RUNTIME_KERNEL.name,
                  reserved: float = DEFAULT_RESERVED_BYTES,
                  bucket_bytes: float = DEFAULT_BUCKET_BYTES,
                  dropout: bool | None = None,
                  expert_imbalance: float = DEFAULT_IMBALANCE,
                  zero2_reduce: str = "step", loss_kernel: str = "chunked",
                  one_pass: bool = True, sp_regather: bool = True) -> dict[str, float]:
    """Per-GPU bytes by component on the stage that needs the most; what must fit, with the
    attention core run by the kernel named `attention` (paraxis/spec/kernels.py).
    `zero2_reduce`: how ZeRO-2 reduces under a pipeline (GPU.pipeline_zero2_reduce): "step"
    keeps the stage's whole gradients until the step's end. `loss_kernel`: what the head and
    loss keep (GPU.loss_kernel). `one_pass`: the masters' step as on CUDA, not as on CPU
    ranks (`master_step_buffers`). `sp_regather`: sequence parallelism keeps the
    column-parallel GEMMs' input shards and gathers them again in the backward (Megatron-LM),
    not the gathered inputs (paraxis's runtime: `activations.layer_activation_bytes`).

    Keys: params, grads, optimizer, activations, buffers, reserved, total, stage: the bytes
    alive at the stage's peak, the larger of two moments. At the backward's start: the
    states, the activations and buffers, and the gradients made so far (every one where
    an earlier microbatch's backward or the reducer's persistent flat buffers hold them,
    else the first module's alone). At the optimizer step: the states with every gradient,
    and as buffers the flat copy of a unit's that fp32 masters are stepped from where the
    gradients are the parameters' own (`master_step_buffers`), activations freed.

    Context parallelism: a rank holds s/cp tokens of each sequence, so its activations are
    those of s/cp tokens (the flash kernel keeps nothing quadratic in s; `plan/context.py`),
    and the model states are replicated over dp x cp, where ZeRO shards them.

    Mixture of experts: a rank holds 1/ep of the routed experts of its MoE blocks, whose
    states ZeRO shards over their dp*cp/ep replicas; an MoE block keeps its attention half's
    activations and its experts' (`experts.moe_activation_bytes`, the busiest rank's
    `expert_imbalance` x the mean rows with ep > 1, of its sequence shard where it routes
    only that).
    """
    local_seq = seq_len // layout.cp
    expert_imbalance = rank_imbalance(layout, expert_imbalance)
    replicas = layout.zero_ranks  # dp x cp, or one shard group of them (hybrid)
    figures = pipeline_figures(layout.schedule, layout.pp, layout.microbatches,
                               layout.virtual_stages)
    kinds = stage_kinds(cfg, layout.pp, layout.virtual_stages, seq_len, layout.placement)
    worst: dict[str, float] = {}
    local_by_stage = stage_local_params(cfg, layout, seq_len)
    kernel_args = (local_seq, micro_batch, layout.tp, layout.sequence_parallel)
    head_split = layout.cp > 1 and (layout.cp_attention == "all_to_all" or layout.cp_a2a > 1)
    routed_seq = local_seq // routing_share(cfg, layout) if cfg.is_moe else local_seq
    # Under SP the experts' region gathers the sequence where they do not run on its shards
    # (split over tp, or whole under a capacity factor): paraxis's router and experts keep
    # the gathered input whole, 1 - 1/tp of it beyond the shard the count holds.
    moe_gathered = 2 * local_seq * micro_batch * cfg.d_model * (1 - 1 / layout.tp) if (
        cfg.is_moe and layout.sequence_parallel and not sp_regather
        and feed_forward(cfg, layout) != "shards") else 0.0

    def kept_bytes(recompute: str) -> tuple[float, float]:
        """(a dense block's, an MoE block's) bytes kept for the backward under `recompute`."""
        dense_layer = layer_activation_bytes(cfg, *kernel_args, recompute, attention, dropout,
                                             head_split=head_split, sp_regather=sp_regather)
        if recompute == "full":
            return dense_layer, dense_layer  # only the block's input is kept
        moe_layer = layer_activation_bytes(cfg, *kernel_args, recompute, attention, dropout,
                                           mlp=False, head_split=head_split,
                                           sp_regather=sp_regather) \
            + moe_activation_bytes(cfg, routed_seq, micro_batch, expert_imbalance,
                                   layout.etp) + moe_gathered if cfg.is_moe else 0.0
        if keeps_fp8_inputs(precision):
            # the linears' inputs kept in FP8, 1 byte where the count has 2 (plan/fp8.py)
            fp8_args = (layout.tp, layout.sequence_parallel)
            projected = keeps_projection_input(recompute, attention, head_split)
            dense_layer -= saved_fp8_bytes_per_token(
                cfg, *fp8_args, projection_input=projected, sp_regather=sp_regather) \
                * local_seq * micro_batch
            moe_layer -= saved_fp8_bytes_per_token(
                cfg, *fp8_args, mlp=False, projection_input=projected,
                sp_regather=sp_regather) * local_seq * micro_batch if cfg.is_moe else 0.0
        if recompute == "none":  # the core's own tensors are kept
            copies = repeated_kv_bytes(cfg, layout.cp_attention, layout.cp, layout.tp, seq_len,
                                       micro_batch, layout.cp_a2a)
            dense_layer += copies
            moe_layer += copies if cfg.is_moe else 0.0
        return dense_layer, moe_layer

    dense_layer, moe_layer = kept_bytes(layout.recompute)
    # the block method's blocks that are not checkpoints keep everything
    whole_dense, whole_moe = kept_bytes("none") if layout.recompute_method == "block" \
        else (dense_layer, moe_layer)
    recomputed_by_stage = recomputed_kinds(cfg, layout, seq_len)
    if layout.recompute == "full":  # a block rebuilt in its backward: all it holds
        rebuilt = rebuilt_moe = full_layer_activation_bytes(
            cfg, local_seq, micro_batch, layout.tp, layout.sequence_parallel, attention,
            dropout, head_split, sp_regather)
        if cfg.is_moe:
            rebuilt_moe = max(rebuilt, layer_activation_bytes(
                cfg, *kernel_args, "none", attention, dropout, mlp=False,
                head_split=head_split, sp_regather=sp_regather)
                + moe_activation_bytes(cfg, routed_seq, micro_batch, expert_imbalance,
                                       layout.etp) + moe_gathered)
    # Stage 0 holds the most in-flight microbatches and the embedding, the last the head and
    # logits, but the FLOP-balanced split may give a middle stage more layers: price them all.
    priced: dict[tuple, float] = {}  # stage facts -> most in-flight microbatches priced
    last = head_stage(layout.pp, layout.placement)
    # One microbatch and autograd's own gradients: the gradients exist only from the
    # backward on, and the step's peak is the larger of two moments, priced apart. The
    # reducer (engine/data_parallel/buckets.py) keeps them in persistent flat buffers
    # instead wherever it has anything to do: dp or cp ranks to sum over, a ZeRO stage (a
    # shard even of one rank), or gradients in another dtype than the parameters.
    one_backward = layout.microbatches == 1 and own_gradients(layout, precision)
    chunk_sizes = chunk_blocks(cfg, layout, seq_len)
    held = held_stages(layout.schedule, layout.pp, layout.microbatches, layout.virtual_stages,
                       chunk_sizes)
    head = loss_kernel_run(loss_kernel, layout.tp, layout.zero)
    pending = pending_stages(layout.schedule, layout.pp, layout.microbatches) \
        if layout.schedule in SPLIT_BACKWARD else None
    chunks_by_stage = chunk_facts(cfg, layout.pp, layout.virtual_stages, seq_len,
                                  layout.placement)
    sp_args = (local_seq, micro_batch, layout.tp, layout.sequence_parallel)
    head_held = head_sets(layout.schedule, layout.pp, layout.microbatches,
                          layout.virtual_stages, layout.placement)

    for stage in range(layout.pp):
        local, experts = local_by_stage[stage]  # Megatron TP splits every matrix over tp
        in_flight = held[stage]  # whole stages' blocks held: uneven chunks weighed as they are
        # A stage like one priced before, holding no more microbatches, needs no more: a
        # deep pipeline's middle stages are one row (a search prices thousands of layouts)
        facts = (local, experts, kinds[stage], recomputed_by_stage[stage], stage == last,
                 pending and (pending[stage], chunks_by_stage[stage]))
        if priced.get(facts, -1.0) >= in_flight:
            continue
        priced[facts] = in_flight
        states = dict(stage_states(round(local), round(experts), replicas, layout.ep,
                                   layout.zero, precision))
        dense, moe = kinds[stage]
        # Korthikanti et al. 2022 Sec. 4.2.3: in-flight microbatches times the stage's layers;
        # an interleaved (microbatch, chunk) holds its chunk's (`held_stages`).
        per_chunk = math.ceil((dense + moe) / layout.virtual_stages)  # blocks of a chunk
        # the blocks its recompute applies to (all but under the block method), the rest
        # keeping all they hold
        dense_recomputed, moe_recomputed, whole_chunk = recomputed_by_stage[stage]
        whole_stage = dense_recomputed * dense_layer + (dense - dense_recomputed) * whole_dense \
            + moe_recomputed * moe_layer + (moe - moe_recomputed) * whole_moe
        activations = in_flight * whole_stage
        group = layout.checkpoint_group
        # a (microbatch, chunk) set's share of them
        chunk_sets = [whole_stage * n / max(1, dense + moe) for n in chunk_sizes[stage]]
        if group > 1:
            # grouped checkpoints (model.run_blocks) keep one input per run of `group`
            # blocks of each chunk in flight
            activations = figures.peak_in_flight[stage] * math.ceil(
                per_chunk / group) * dense_layer
            chunk_sets = [math.ceil(n / group) * dense_layer for n in chunk_sizes[stage]]
        if pending:
            # B keeps each weighted op's output gradient until W: the peak of both together,
            # at one of the schedule's moments of most memory
            kept = [2 * kept_for_w_values(cfg, facts, *sp_args, head, routed_seq,
                                          expert_imbalance, layout.etp)
                    for facts in chunks_by_stage[stage]]
            activations = max(sum(n * size for n, size in zip(moment, chunk_sets + kept,
                                                             strict=True))
                              for moment in pending[stage])
        # The formulas count 16-bit activations (Korthikanti et al.); fp32 compute keeps
        # every one of them at 4 bytes.
        activations *= precision.activation_bytes / 2
        if stage == last:
            loss = logits_bytes(cfg, local_seq, micro_batch, layout.tp,
                                precision.activation_bytes, head, precision.compute_dtype)
            if head == "chunked":  # each microbatch's logits, from the head's forward to
                # its backward; one chunk's workspace at a time
                workspace = workspace_bytes(local_seq * micro_batch,
                                            math.ceil(cfg.vocab_size / layout.tp))
                loss = head_held * (loss - workspace) + workspace
            activations += loss
            if pending and head == "chunked":
                # the logits' gradient, written over them, is kept for W (counted above)
                activations -= logits_bytes(cfg, local_seq, micro_batch, layout.tp,
                                            precision.activation_bytes) - workspace_bytes(
                    local_seq * micro_batch, math.ceil(cfg.vocab_size / layout.tp))
        buffers = 0.0
        if layout.recompute == "full" and (whole_chunk or layout.schedule in SPLIT_BACKWARD):
            # a run of `group` blocks is rebuilt at once in its backward. Under the block
            # method a chunk's first blocks are rebuilt last, after its others' backward
            # freed more than they hold: no higher peak, unless a chunk is recomputed whole,
            # or a split backward keeps the chunk's graph for its weight gradients.
            buffers += min(group, per_chunk) * (rebuilt_moe if moe_recomputed else rebuilt) \
                * precision.activation_bytes / 2
        if precision.fp8_recipe is not None:
            # the block computing holds its weights cast to FP8, row- and column-major
            buffers += 2 * _largest_block(cfg, layout.tp, layout.ep, layout.etp)
        if layout.zero == 3 and (layout.pp == 1 or layout.zero3_reshard != "step"):
            # each microbatch's gathered FP8 weights, kept to the backward (but where full
            # recompute runs the forward again there; under "step" they are the gathered stage)
            kept = (dense - dense_recomputed, moe - moe_recomputed) \
                if layout.recompute == "full" else (dense, moe)
            buffers += in_flight * kept_fp8_weight_bytes(cfg, precision, layout.tp, *kept)
        if layout.zero == 3:
            buffers += zero3_buffer_bytes(cfg, layout, local + experts, precision)
        elif layout.dp * layout.cp > 1:
            # Gradient buckets, double-buffered while a reduction is in flight; bucket 0 is
            # one call per layer (FSDP's units): a layer's gradients are the bucket. No
            # bucket holds more than the stage's gradients (a small model's fit in one).
            grads = (local + experts) * precision.grad_bytes
            layer = grads / max(1, dense + moe)
            buffers += 2 * min(bucket_bytes or layer, grads)
        if pipeline_zero2_whole_grads(cfg, layout.zero, layout.pp, zero2_reduce,
                                      layout.microbatches):
            buffers += (local + experts) * precision.grad_bytes
        row = {**states, "activations": activations, "buffers": buffers,
               "reserved": reserved}
        if one_backward:
            # The stage's one backward makes every gradient after the activations' peak: at
            # its start only the first module's exist (the LM head's on its stage, else its
            # last block's); all of them at the optimizer step instead, activations freed.
            first = _vocab_matrix(cfg, layout.tp) if stage == last \
                else _largest_block(cfg, layout.tp, layout.ep, layout.etp)
            row["grads"] = min(row["grads"], first * precision.grad_bytes)
        step = master_step_buffers(cfg, layout, local, experts, precision, bucket_bytes,
                                   one_pass)
        rows = [row, {**states, "activations": 0.0, "buffers": step, "reserved": reserved}]
        for phase in rows:
            phase["total"] = sum(phase.values())
        row = max(rows, key=lambda phase: phase["total"])
        row["stage"] = stage
        if not worst or row["total"] > worst["total"]:
            worst = row
    return worst
