"""A step's gradient sync: what its collectives take (`sync_parts`) and how much of them the
pipeline's compute leaves exposed (`exposed_sync`), for `cost.evaluate`.

Gradients are reduced, and ZeRO shards, over the dp x cp replicas of each parameter; under
hybrid sharding within one shard group of them, then across its copies. An MoE model's
routed experts over their dp*cp/ep replicas (plan/experts.py).
"""

from __future__ import annotations

from typing import NamedTuple

from paraxis.plan.comm import (
    copies_sync_time,
    dp_sync_time,
    gradient_bucket_bytes,
    last_bucket_time,
    param_gather_time,
    zero3_layer_times,
)
from paraxis.plan.context import copies_link, zero_link
from paraxis.plan.experts import expert_dp_link, shard_grad_sum_seconds
from paraxis.plan.fp8 import block_fp8_params, gather_bytes_per_param, regather_bytes_per_param
from paraxis.plan.hardware import Cluster
from paraxis.plan.memory import stage_local_params
from paraxis.plan.rates import Overlap
from paraxis.plan.stages import chunk_facts, recomputed_share
from paraxis.plan.zero3 import Zero3Kept, Zero3Layer, zero3_windows
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import ModelConfig
from paraxis.spec.precision import Precision
from paraxis.spec.schedules import SPLIT_BACKWARD, w_reads_weights


class SyncParts(NamedTuple):
    dp: float  # every sync collective of the step, hidden or not
    across: float  # hybrid sharding: the all-reduce across a shard's copies
    gather: float  # ZeRO-1/2's parameter all-gather after the step
    tail: float  # the last gradient bucket's reduction, after the last backward
    zero3: Zero3Layer | None  # ZeRO-3 prefetched: a mean block's collectives
    blocks: int  # the busiest stage's blocks
    shards: float  # the experts' gradient sum over tp, after the sync: exposed
    experts: bool  # whether the stage holds routed experts


def sync_parts(cfg: ModelConfig, layout: Layout, cluster: Cluster, seq_len: int,
               precision: Precision, overlap: Overlap, blocks: int, moe_blocks: int
               ) -> SyncParts:
    """The step's sync collectives of `layout` whose busiest stage holds `blocks` blocks, the
    most MoE blocks of any stage `moe_blocks`."""
    gpu = cluster.gpu
    replicas = layout.zero_ranks
    dp_link = zero_link(layout, cluster)
    copies, across = layout.replicas, copies_link(layout, cluster)
    shares = stage_local_params(cfg, layout, seq_len)
    stage_param_count = max(local for local, _ in shares)
    kept = zero3_kept(cfg, layout, precision, [local for local, _ in shares].index(
        stage_param_count), stage_param_count, seq_len)
    experts = max(expert for _, expert in shares)
    expert_replicas = replicas // layout.ep
    reshard = layout.zero3_reshard if layout.pp > 1 else None  # pipeline_parallel/zero3.py
    gathered = gather_bytes_per_param(cfg, precision)  # FP8 weights: 1 byte (plan/fp8.py)
    regathered = regather_bytes_per_param(cfg, precision, layout.recompute,
                                          recomputed_share(cfg, layout, seq_len))
    sync = (layout.microbatches, precision.grad_bytes, gathered)
    expert_sync = (layout.microbatches, precision.grad_bytes, precision.param_bytes)
    # ZeRO-2 under a pipeline reduces once a step (GPU.pipeline_zero2_reduce "step")
    pipelined = layout.pp > 1 and gpu.pipeline_zero2_reduce == "step"
    bucket = gradient_bucket_bytes(gpu, replicas, precision.grad_bytes)
    t_dp = dp_sync_time(stage_param_count, replicas, layout.zero, dp_link, *sync, blocks,
                        bucket, reshard, pipelined, copies, across, regathered, kept)
    t_across = copies_sync_time(stage_param_count, replicas, layout.zero, copies, across,
                                precision.grad_bytes, blocks, bucket)
    # ZeRO-1/2's parameter all-gather after the step, and the last gradient bucket's
    # reduction (comm.param_gather_time, comm.last_bucket_time): never behind the backward
    t_gather = param_gather_time(stage_param_count, replicas, layout.zero, dp_link, gathered)
    t_tail = last_bucket_time(stage_param_count, replicas, layout.zero, dp_link,
                              precision.grad_bytes, blocks, bucket)
    if experts:
        expert_link = expert_dp_link(layout, cluster)
        expert_args = (moe_blocks,
                       gradient_bucket_bytes(gpu, expert_replicas, precision.grad_bytes))
        t_dp += dp_sync_time(experts, expert_replicas, layout.zero, expert_link, *expert_sync,
                             *expert_args, reshard, pipelined, copies, across)
        t_across += copies_sync_time(experts, expert_replicas, layout.zero, copies, across,
                                     precision.grad_bytes, *expert_args)
        t_gather += param_gather_time(experts, expert_replicas, layout.zero, expert_link,
                                      precision.param_bytes)
    zero3 = None
    if layout.zero == 3 and replicas > 1 and overlap.zero3_prefetch:
        # One layer ahead (PyTorch FSDP's forward/backward prefetch; Zhao et al. 2023 Sec.
        # 3.3): each layer's traffic hides behind one layer's compute, per microbatch.
        zero3 = zero3_layer_times(stage_param_count / blocks, replicas, dp_link,
                                  precision.grad_bytes, gathered, regathered, kept, blocks)
        if experts:  # the mean block's gathers, experts over their own replicas
            zero3 = zero3.plus(zero3_layer_times(experts / blocks, expert_replicas,
                                                 expert_link, precision.grad_bytes,
                                                 precision.param_bytes))
    shards = shard_grad_sum_seconds(cfg, layout, cluster, moe_blocks, experts,
                                    precision.grad_bytes)
    return SyncParts(t_dp, t_across, t_gather, t_tail, zero3, blocks, shards, experts > 0)


def zero3_kept(cfg: ModelConfig, layout: Layout, precision: Precision, stage: int,
               stage_params: float = 0.0, seq_len: int | None = None) -> Zero3Kept:
    """What ZeRO-3 gathers for a microbatch's forward only on one rank of `stage` (of
    `stage_params`, its dense share), as paraxis's runtime does (`Zero3Kept`): the embedding
    (first stage); without a pipeline also the last unit (an untied LM head; a tied model's
    last block, less its FP8 unit, which autograd keeps anyway) and a tied embedding, head
    and final norm. An MoE model's last unit is its last block's experts, priced with
    theirs: none is counted here. Under a split backward whose W reads the weights
    (`spec.schedules.w_reads_weights`), what W gathers again: every chunk of the stage but
    the model's first (the runtime's first virtual stage), the experts' aside."""
    if layout.zero != 3:
        return Zero3Kept()
    tp, pb = layout.tp, precision.param_bytes
    # the token table split over tp, learned positions whole on every rank
    tokens = cfg.vocab_size * cfg.d_model
    embedding = tokens / tp + cfg.embedding_params() - tokens
    if layout.pp > 1:
        again = 0.0
        if layout.schedule in SPLIT_BACKWARD and layout.zero3_reshard == "forward" \
                and w_reads_weights(cfg.style, layout.recompute):
            first = chunk_facts(cfg, layout.pp, layout.virtual_stages, seq_len,
                                layout.placement)[0][0] if stage == 0 else None
            # in `stage_params`' own count (every parameter split over tp)
            again = stage_params - (0.0 if first is None else (
                cfg.embedding_params() + first.dense * cfg.layer_params(0)) / tp)
        return Zero3Kept(embedding if stage == 0 else 0.0, pb, max(0.0, again))
    if not cfg.tied_embeddings:
        return Zero3Kept(embedding + tokens / tp, pb)  # and the untied head's table
    last = 0.0 if cfg.is_moe else (
        cfg.layer_params(cfg.n_layers - 1) - block_fp8_params(cfg, precision)) / tp
    return Zero3Kept(last + (cfg.embedding_params() + cfg.head_params()) / tp, pb)


def exposed_sync(parts: SyncParts, layout: Layout, cluster: Cluster, overlap: Overlap,
                 t_forward: float, t_backward: float, block: dict[str, float]) -> float:
    """Seconds of `parts`' dp sync on the step's critical path, behind a microbatch's
    forward and backward of `t_forward` and `t_backward` seconds on the busiest stage and
    the "forward" and "backward" of the `block` ZeRO-3 prefetches behind: each exposed part
    only shrinks as they grow."""
    if parts.zero3 is not None:
        pairs, passes = zero3_windows(parts.zero3, block, layout)
        per_layer = sum(max(0.0, comm - window) + overlap.contention * min(comm, window)
                        for comm, window in pairs)
        dp_exposed = passes * parts.blocks * per_layer
        # Hybrid: each shard's all-reduce across copies starts as the last microbatch's
        # backward reduces it (pp = 1), beside what that backward's own traffic leaves
        # free; under a pipeline it runs after the flush.
        spare = 0.0 if layout.pp > 1 else max(
            0.0, t_backward - parts.blocks * (parts.zero3.again + parts.zero3.scatter))
        return dp_exposed + max(0.0, parts.across - spare) + overlap.contention * min(
            parts.across, spare)
    if overlap.dp and layout.zero < 3:
        # ZeRO-2's per-microbatch reduce-scatter behind every backward; ZeRO-0/1's single
        # all-reduce (and a pipeline's ZeRO-2 single reduce-scatter) behind the last only,
        # but for the last bucket's. The parameters' all-gather comes after the step: exposed,
        # or behind the next step's first forward where the runtime starts it there.
        pipelined = layout.pp > 1 and cluster.gpu.pipeline_zero2_reduce == "step"
        window = (layout.microbatches * t_backward if layout.zero == 2 and not pipelined
                  else t_backward)
        grads = parts.dp - parts.gather
        tail = min(parts.tail, grads)
        hideable = grads - tail
        exposed = tail + max(0.0, hideable - window) + overlap.contention * min(hideable,
                                                                                window)
        if cluster.gpu.param_gather_overlap:
            return exposed + max(0.0, parts.gather - t_forward) + overlap.contention * min(
                parts.gather, t_forward)
        return exposed + parts.gather
    return parts.dp
