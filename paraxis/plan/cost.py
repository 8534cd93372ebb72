"""Price one layout: memory that must fit, step time by part, tokens/s, MFU and HFU.

Step time (one data-parallel replica runs the same pipeline as every other):

    slot     = t_forward + t_backward (+ recompute) + exposed TP + exposed CP + exposed PP,
               per microbatch (a cp rank's forward and backward are on its s/cp tokens)
    pipeline = M * slot / (1 - bubble_fraction)      bubble from the schedule objects
    step     = pipeline + exposed DP sync + optimizer step (memory-bound)
               + the step's own small calls (loss, gradient norm, stop flag: step_calls.py)

Overlap assumptions are explicit (`Overlap`): by default the DP gradient sync hides behind the
last microbatch's backward but for its last bucket (DDP buckets; Li et al. 2020 Sec. 3.2.3),
ZeRO-1/2's parameter all-gather after the step is exposed (or behind the next forward,
`GPU.param_gather_overlap`), and ZeRO-3's gathers hide behind the step's compute (prefetch);
the backward's TP collectives of the column-parallel linears hide behind their gradient GEMMs
(Korthikanti et al. 2022 Sec. 6.2), while forward TP collectives (unless the runtime pipelines
them with the GEMMs, `GPU.tp_comm_overlap`) and PP sends sit on the critical path (Narayanan
et al. 2021 Sec. 4). A layer takes at least the time its host needs to launch its kernels
(`GPU.kernel_launch_s`), which prices small microbatches.

CPU ranks (a cluster with `cores_per_node`) time-share the cores: each computes at
min(1, cores / ranks) of the calibrated one-core rate (cores: `available_cores`), nothing
hides communication (gloo's threads share the cores), each layer pays the eager ops'
dispatch per microbatch (`GPU.layer_overhead_s`, calibrated), and ranks idle in a pipeline
bubble lend their core to the busy ones: a pipeline takes the longer of its work spread
over the cores and its critical path at the share one stage's ranks get when they compute
alone (Graham 1969's two bounds of list scheduling).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

from paraxis.plan.bubble import (
    bubble_costs,
    bubble_floor,
    bubble_holds,
    pipeline_figures,
    stage_share,
)
from paraxis.plan.comm import (
    axis_link,
    collective_time,
)
from paraxis.plan.compute import (
    gathered_share,
    iteration_flops,
    optimizer_time,
)
from paraxis.plan.experts import (
    DEFAULT_IMBALANCE,
    check_ep,
)
from paraxis.plan.grad_sync import exposed_sync, sync_parts
from paraxis.plan.hardware import GPU, Cluster
from paraxis.plan.layer_cost import (
    block_key,
    block_times,
    core_share_of_fastest,
    half_layer_s,
    runtime_dropout,
)
from paraxis.plan.memory import layout_memory, stage_local_params
from paraxis.plan.rates import (
    DEFAULT_OVERLAP,
    Overlap,
    check_precision,
    for_precision,
    layer_rates,
    overlap_on,
)
from paraxis.plan.stages import recomputed_kinds, recomputed_share, stage_kinds
from paraxis.plan.step_calls import step_calls_time
from paraxis.plan.sync_wait import after_backward, at_segment
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import ModelConfig
from paraxis.spec.precision import MIXED_ADAM, Precision
from paraxis.spec.schedules import SPLIT_BACKWARD, head_stage
from paraxis.spec.units import gigabytes

# How close a predicted step time should come to a measured one: within 25% for at least
# 80% of layouts (the benchmark's predicted-vs-measured section, `paraxis report`).
PREDICTION_TOLERANCE = 0.25
PREDICTION_SHARE = 0.8

STEP_PARTS = ("compute", "tp", "cp", "ep", "pp", "bubble", "dp", "tp_grads", "optimizer",
              "step_calls")  # a step's parts, exposed time only: they add up to its time


@dataclass(frozen=True)
class Estimate:
    layout: Layout
    micro_batch: int  # sequences per microbatch per replica
    memory: dict[str, float]  # per GPU, on the stage that needs the most
    memory_limit_bytes: float
    # seconds per step: STEP_PARTS (exposed) and their sum "step", each collective's whole
    # time ("tp_total", ...), and "forward", the forward passes' share of "compute" (the
    # backward's, a recompute's rerun forward included, is the rest)
    time: dict[str, float]
    tokens_per_s: float
    mfu: float
    hfu: float
    notes: list[str] = field(default_factory=list)
    seq_len: int = 0  # tokens per sequence it was priced for

    @property
    def fits(self) -> bool:
        return self.memory["total"] <= self.memory_limit_bytes

    @property
    def step_time_s(self) -> float:
        return self.time["step"]

    def to_dict(self) -> dict[str, object]:
        return {"layout": self.layout.to_dict(), "layout_text": str(self.layout),
                "micro_batch": self.micro_batch, "fits": self.fits,
                "memory_bytes": dict(self.memory),
                "memory_limit_bytes": self.memory_limit_bytes,
                "time_s": dict(self.time), "tokens_per_s": self.tokens_per_s,
                "mfu": self.mfu, "hfu": self.hfu}


class Pipeline(NamedTuple):
    """One replica's pipeline for a step (`pipeline_time`): seconds per microbatch on the
    busiest stage (forward, backward, and the exposed and total TP, CP, EP and PP
    communication), the microbatches' busy time and the whole pipeline with its bubble."""

    kinds: list[tuple[int, int]]  # (dense blocks, MoE blocks) per stage
    counts: list[int]  # blocks per stage
    layer: dict[str, float]  # a dense block's `layer_times`
    forward: float
    backward: float
    tp: float
    tp_total: float
    cp: float
    cp_total: float
    ep: float
    ep_total: float
    pp: float
    busy: float
    pipeline: float
    # a floor's added seconds were it recomputed (selective, full): 0 where the schedule's
    # bubble or the shared cores do not grow with the work alike (`pipeline_time`)
    reruns: tuple[float, float] = (0.0, 0.0)


# A block's communication on its critical path per microbatch (`layer_times`' keys)
EXPOSED_COMM = ("tp_forward", "tp_backward", "ep_forward", "ep_backward")


def rerun_floors(layer: dict[str, float], faster: float) -> tuple[float, float]:
    """What recomputing adds to a block's backward at the least, for any cp variant (its
    core `faster` by that share of its own): the attention core again (selective) or the
    rerun forward (full) on the GPU, less what the host's launches hide of it where they
    outlast the GPU's backward (`layer_times`' host pricing)."""
    core = (1 - faster) * layer["core_forward"]
    gpu_rerun = layer["gpu_rerun"] - faster * layer["core_forward"]
    gpu_backward = layer["gpu_backward"] - faster * layer["core_backward"]
    host_forward, host_backward = layer["host_forward"], layer["host_backward"]
    selective = max(0.0, core - max(0.0, host_backward - gpu_backward))
    full = min(gpu_rerun, max(host_forward, gpu_backward + gpu_rerun - host_backward))
    return selective, full


def pipeline_time(cfg: ModelConfig, layout: Layout, cluster: Cluster, seq_len: int,
                  micro_batch: int, precision: Precision, overlap: Overlap,
                  expert_imbalance: float, memo: dict, floor: bool = False) -> Pipeline:
    """The pipeline part of `evaluate`'s step: every microbatch's compute and exposed
    communication on the busiest stage, over one minus the schedule's bubble; `overlap` as
    `overlap_on` gives it, `memo` as `evaluate`'s. With `floor`, a floor under it for any
    cp variant: no K/V exchange exposed, the attention core at the fastest variant's rate."""
    key = block_key(layout, micro_batch, precision, cluster)
    whole = ("pipeline", key, layout.schedule, layout.virtual_stages, layout.microbatches,
             layout.recompute_method, layout.recompute_layers, floor)
    if whole in memo:  # alike across ZeRO stages, shard groups and ZeRO-3 regathering
        return memo[whole]
    tokens_per_microbatch = micro_batch * seq_len // layout.cp  # on one cp rank

    # The busiest stage per microbatch: its blocks in the runtime's own FLOP-balanced split,
    # plus the LM head and loss if it is the last stage.
    # (dense blocks, MoE blocks) per stage; each kind priced once
    kinds = stage_kinds(cfg, layout.pp, layout.virtual_stages, seq_len, layout.placement)
    counts = [dense + moe for dense, moe in kinds]
    last = head_stage(layout.pp, layout.placement)
    half_layer = half_layer_s(cfg, layout, cluster, seq_len, micro_batch)
    layer, moe_layer, head = block_times(cfg, layout, cluster, seq_len, micro_batch, precision,
                                         overlap, expert_imbalance, memo, key)
    # Under the block method only the first blocks of each chunk are recomputed
    # (`stages.recomputed_kinds`): the others run as without recompute.
    recomputed = recomputed_kinds(cfg, layout, seq_len)
    whole_layer, whole_moe = layer, moe_layer
    if layout.recompute_method == "block":
        whole_layer, whole_moe, _ = block_times(
            cfg, layout.replace(recompute="none", recompute_method="uniform",
                                recompute_layers=1),
            cluster, seq_len, micro_batch, precision, overlap, expert_imbalance, memo)

    def blocks_sum(stage: int, *keys: str) -> float:
        (dense, moe), (dense_rerun, moe_rerun, _) = kinds[stage], recomputed[stage]
        return sum(dense_rerun * layer[k] + (dense - dense_rerun) * whole_layer[k]
                   + moe_rerun * moe_layer[k] + (moe - moe_rerun) * whole_moe[k]
                   for k in keys)

    def stage_compute(stage: int) -> float:
        has_head = stage == last
        return blocks_sum(stage, "forward", "backward") + has_head * (
            head["forward"] + head["backward"])

    def ends_tp(stage: int, key: str) -> float:
        """The head's TP time `key` on the last stage, the embedding's on the first."""
        return (stage == last) * head[key] + (stage == 0) * head[f"embed_{key}"]

    # stages alike (their blocks, the head or the embedding or not) compute alike: the first
    # of each kind
    firsts: dict[tuple, int] = {}
    for stage in range(layout.pp):
        firsts.setdefault((kinds[stage], stage == last, stage == 0), stage)
    busiest = max(firsts.values(), key=stage_compute)
    has_head = busiest == last
    t_forward = blocks_sum(busiest, "forward") + has_head * head["forward"]
    t_backward = blocks_sum(busiest, "backward") + has_head * head["backward"]
    t_tp = blocks_sum(busiest, "tp_forward", "tp_backward") + ends_tp(busiest, "tp")
    t_tp_total = blocks_sum(busiest, "tp_total") + ends_tp(busiest, "tp_total")
    t_cp = blocks_sum(busiest, "cp_forward", "cp_backward")
    t_cp_total = blocks_sum(busiest, "cp_total")
    t_ep = blocks_sum(busiest, "ep_forward", "ep_backward")  # MoE all-to-alls: they block
    t_ep_total = blocks_sum(busiest, "ep_total")
    reruns = (0.0, 0.0)  # the blocks' forward again: their attention cores, or all of it
    if floor:
        faster = 1 - core_share_of_fastest(cfg, layout, cluster, seq_len, memo)
        t_forward -= faster * blocks_sum(busiest, "core_forward")
        t_backward -= faster * blocks_sum(busiest, "core_backward")
        t_cp = 0.0
        dense, moe, _ = recomputed[busiest]
        reruns = tuple(dense * d + moe * m for d, m in zip(
            rerun_floors(layer, faster), rerun_floors(moe_layer, faster), strict=True))
        # recomputing may make another stage the busiest: the least any stage communicates
        least_comm = min(blocks_sum(s, *EXPOSED_COMM) + ends_tp(s, "tp")
                         for s in firsts.values())
    boundary_bytes = precision.activation_bytes * tokens_per_microbatch * cfg.d_model

    t_pp = 0.0
    if layout.pp > 1:
        # an activation's send waits after a chunk's forward (its layers' two halves each),
        # a gradient's after the chunk's backward
        chunk = at_segment(cluster, 2 * half_layer * max(counts) / layout.virtual_stages)
        # an activation forward and a gradient back per chunk
        sent = boundary_message_bytes(layout, cluster.gpu, boundary_bytes)
        sends = (collective_time("send_recv", sent, 2,
                                 axis_link(layout, "pp", after)) for after in (
                                     chunk, after_backward(chunk)))
        t_pp = layout.virtual_stages * sum(sends)

    # Balanced stages: GPipe's and the 1F1B family's idle share does not depend on the
    # backward/forward ratio (tests/test_plan_bubble.py): one cached simulation serves all.
    # A zero-bubble schedule's does (W's fill the bubble): simulated at this run's rounded
    # ratio, W at the simulator's share of the backward (`schedules.stage_costs`).
    bubble = bubble_floor(layout.schedule, layout.pp, layout.microbatches,
                          layout.virtual_stages) if floor else pipeline_figures(
        layout.schedule, layout.pp, layout.microbatches, layout.virtual_stages,
        *bubble_costs(layout.schedule, t_forward, t_backward)).bubble_fraction
    slot_compute = t_forward + t_backward
    exposed_comm = t_tp + t_cp + t_ep + (0.0 if overlap.pp else t_pp)
    busy = layout.microbatches * (slot_compute + exposed_comm)
    pipeline = busy / (1 - bubble)
    # While other stages idle, one stage's ranks of a node compute together (`stage_share`)
    if not bubble_holds(cluster, layout.pp):  # more ranks than cores
        # Idle ranks lend their cores: the work bound (busy, at the shared rate) or the
        # critical path at the stage's share, whichever is longer.
        critical = layout.microbatches * (slot_compute * cluster.compute_share
                                          / stage_share(cluster, layout.pp) + exposed_comm)
        pipeline = max(busy, critical / (1 - bubble))
    if floor:
        # A floor for every recomputation: the busy time, over the bubble's share only where
        # that share holds whatever the work (a 1F1B-family schedule on its own cores; a
        # zero-bubble schedule's W's fill its bubble); recomputing, the busiest stage's
        # compute and rerun, and the least any stage communicates (`pipeline_floors`)
        alike = layout.schedule not in SPLIT_BACKWARD and bubble_holds(cluster, layout.pp)
        scale = layout.microbatches / (1 - bubble if alike else 1.0)
        pipeline = pipeline if alike else busy
        least = least_comm + (0.0 if overlap.pp else t_pp)
        reruns = tuple(scale * (slot_compute + rerun + least) - pipeline for rerun in reruns)
    if layout.recompute_method == "block":  # a mean dense block of the busiest stage
        dense, dense_rerun = kinds[busiest][0], recomputed[busiest][0]
        share = dense_rerun / dense if dense else 0.0
        layer = {k: share * v + (1 - share) * whole_layer[k] for k, v in layer.items()}
    memo[whole] = Pipeline(kinds, counts, layer, t_forward, t_backward, t_tp, t_tp_total,
                           t_cp, t_cp_total, t_ep, t_ep_total, t_pp, busy, pipeline, reruns)
    return memo[whole]


def optimizer_seconds(cfg: ModelConfig, layout: Layout, cluster: Cluster, seq_len: int,
                       precision: Precision) -> float:
    """The optimizer step on the stage holding the most parameters (`optimizer_time`)."""
    gpu = cluster.gpu
    shares = stage_local_params(cfg, layout, seq_len)
    pipelined = layout.pp > 1 and gpu.pipeline_zero2_reduce == "step"
    return optimizer_time(layout, precision, gpu.kernels, max(local for local, _ in shares),
                          max(expert for _, expert in shares),
                          layer_rates(cluster, layout.tp)[2], pipelined, gpu.optimizer_kernel,
                          gathered_share(cfg, layout.tp, gpu.gradient_bucket_bytes,
                                         precision.param_bytes, layout.etp),
                          one_pass=not cluster.cores_per_node)


def boundary_message_bytes(layout: Layout, gpu: GPU, boundary_bytes: float) -> float:
    """Bytes one tp rank sends across a pipeline boundary per message, of a microbatch's
    `boundary_bytes` (its residual stream on one cp rank): 1/tp under sequence parallelism
    (its shard) and with Megatron's scatter-gather (Narayanan et al. 2021 Sec. 4.1); the
    whole from every tp rank in paraxis's runtime without SP."""
    split = layout.sequence_parallel or gpu.megatron_runtime
    return boundary_bytes / layout.tp if split else boundary_bytes


def memory_on(cfg: ModelConfig, layout: Layout, cluster: Cluster, seq_len: int,
              micro_batch: int, precision: Precision = MIXED_ADAM,
              expert_imbalance: float = DEFAULT_IMBALANCE) -> dict[str, float]:
    """`layout_memory` with what `cluster`'s GPU and runtime keep: its attention kernel (flash
    under cp), reserve, gradient buckets, dropout masks, pipeline ZeRO-2, loss kernel and
    sequence parallelism's kept inputs."""
    gpu = cluster.gpu
    return layout_memory(cfg, layout, seq_len, micro_batch, precision,
                         "flash" if layout.cp > 1 else gpu.attention_kernel,
                         reserved=gpu.reserved_bytes, bucket_bytes=gpu.gradient_bucket_bytes,
                         dropout=runtime_dropout(cfg, gpu), expert_imbalance=expert_imbalance,
                         zero2_reduce=gpu.pipeline_zero2_reduce, loss_kernel=gpu.loss_kernel,
                         one_pass=not cluster.cores_per_node,
                         sp_regather=gpu.megatron_runtime)


def calls_time(cfg: ModelConfig, layout: Layout, cluster: Cluster, memo: dict) -> float:
    """The step's own small calls (the loss, the gradient norm, the stop flag): latency each,
    priced once per what `step_calls` reads of the layout."""
    key = ("step calls", layout.grid, layout.ep, layout.etp,
           layout.sequence_parallel, layout.zero >= 1, layout.placement)
    if key not in memo:
        memo[key] = step_calls_time(cfg, layout, cluster)
    return memo[key]


def evaluate(cfg: ModelConfig, layout: Layout, cluster: Cluster, seq_len: int,
             global_batch: int, precision: Precision = MIXED_ADAM,
             overlap: Overlap = DEFAULT_OVERLAP,
             expert_imbalance: float = DEFAULT_IMBALANCE,
             memo: dict | None = None, memory: dict[str, float] | None = None) -> Estimate:
    """Price `layout`: memory per GPU and step time for `global_batch` sequences per step
    (a mixture of experts with its busiest EP rank at `expert_imbalance` x the mean load).
    `memo`: a dict kept across calls with the same model, cluster, sequence, precision, overlap
    and imbalance (a search's): per-layer times reused across ZeRO, schedules, microbatches.
    `memory`: the layout's `memory_on`, where the caller priced it already."""
    check_ep(cfg, layout)
    check_precision(cluster.gpu, precision)
    cluster = for_precision(cluster, precision)
    gpu, overlap = cluster.gpu, overlap_on(cluster, overlap)
    micro_batch = global_batch // (layout.dp * layout.microbatches)
    # Dropout masks where the runtime has dropout (`runtime_dropout`).
    if memory is None:
        memory = memory_on(cfg, layout, cluster, seq_len, micro_batch, precision,
                           expert_imbalance)
    memo = {} if memo is None else memo
    pipe = pipeline_time(cfg, layout, cluster, seq_len, micro_batch, precision, overlap,
                         expert_imbalance, memo)
    kinds, counts, layer = pipe.kinds, pipe.counts, pipe.layer
    t_forward, t_backward, pipeline = pipe.forward, pipe.backward, pipe.pipeline

    sync = sync_parts(cfg, layout, cluster, seq_len, precision, overlap, max(counts),
                      max(k[1] for k in kinds))
    # ZeRO-3's gathers hide behind a block's compute: a dense block's, or with experts the
    # mean block's of the busiest stage (whose blocks the gathers are split over)
    block = {"forward": t_forward / sync.blocks, "backward": t_backward / sync.blocks} \
        if sync.experts else layer
    dp_exposed = exposed_sync(sync, layout, cluster, overlap, t_forward, t_backward, block)
    t_dp, t_shards = sync.dp, sync.shards  # the experts' sum over tp: after the sync, exposed
    t_optimizer = optimizer_seconds(cfg, layout, cluster, seq_len, precision)
    t_calls = calls_time(cfg, layout, cluster, memo)
    step = pipeline + dp_exposed + t_shards + t_optimizer + t_calls
    if not math.isfinite(step) or step <= 0:  # a figure too small (or large) to price with
        raise ParaxisError(f"the hardware figures price {layout} at a step of {step} s; check "
                           "its bandwidths and FLOP/s for values too small to use")

    flops = iteration_flops(cfg, seq_len, global_batch, layout.recompute,
                            recomputed_share(cfg, layout, seq_len))
    peak_total = cluster.world_size * gpu.peak_flops
    m = layout.microbatches
    time = {"compute": m * (t_forward + t_backward), "forward": m * t_forward,
            "tp": m * pipe.tp, "pp": 0.0 if overlap.pp else m * pipe.pp, "cp": m * pipe.cp,
            "cp_total": m * pipe.cp_total, "dp": dp_exposed, "bubble": pipeline - pipe.busy,
            "optimizer": t_optimizer, "step_calls": t_calls, "step": step,
            "tp_grads": t_shards, "tp_total": m * pipe.tp_total, "pp_total": m * pipe.pp,
            "dp_total": t_dp, "ep": m * pipe.ep, "ep_total": m * pipe.ep_total}
    notes = (["TP group crosses nodes: its all-reduces run over the network"]
             if layout.tp > 1 and axis_link(layout, "tp", cluster).crosses_nodes else [])
    return Estimate(layout, micro_batch, memory, gpu.memory_bytes, time,
                    global_batch * seq_len / step, flops["model"] / (step * peak_total),
                    flops["hardware"] / (step * peak_total), notes, seq_len)


def too_big_reason(estimate: Estimate) -> str:
    """Why a layout does not fit, naming what takes the memory: the model states, or the
    activations of how many sequences per microbatch."""
    memory, layout = estimate.memory, estimate.layout
    states = memory["params"] + memory["grads"] + memory["optimizer"]
    if memory["activations"] >= states:
        what = (f"{memory['activations'] / 1e9:.1f} GB of it activations of "
                f"{estimate.micro_batch}-sequence microbatches of {estimate.seq_len} tokens "
                f"(recompute={layout.recompute})")
    else:
        what = f"{states / 1e9:.1f} GB of it model states (ZeRO-{layout.zero})"
    return (f"needs {memory['total'] / 1e9:.1f} GB per GPU > "
            f"{gigabytes(estimate.memory_limit_bytes)} GB, {what}")


def devices_to_hold(estimate: Estimate, devices: int) -> int | None:
    """About how many devices would hold `estimate`'s layout: its model states shard over
    them (ZeRO-3, TP x PP), its activations, buffers and reserve do not (None: they overflow)."""
    memory, limit = estimate.memory, estimate.memory_limit_bytes
    states = memory["params"] + memory["grads"] + memory["optimizer"]
    rest = memory["total"] - states
    return math.ceil(devices * states / (limit - rest)) if limit > rest else None
