"""Price one layout: memory that must fit, step time by part, tokens/s, MFU and HFU.

Step time (one data-parallel replica runs the same pipeline as every other):

    slot     = t_forward + t_backward (+ recompute) + exposed TP + exposed PP, per microbatch
    pipeline = M * slot / (1 - bubble_fraction)      bubble from the schedule objects
    step     = pipeline + exposed DP sync + optimizer update

Overlap assumptions are explicit (`Overlap`): by default the DP gradient sync hides behind the
last microbatch's backward (PyTorch DDP buckets; Li et al. 2020 Sec. 3.2.3) and ZeRO-3's
gathers behind the step's compute (prefetch), while TP collectives and PP sends sit on the
critical path (Megatron-LM: Narayanan et al. 2021 Sec. 4).

CPU ranks (a cluster with `cores_per_node`) time-share the cores: each computes at
min(1, cores / ranks) of the calibrated one-core rate (cores: `available_cores`, what other
sessions leave us, else all of them), nothing hides communication (gloo's
threads run on the same cores as the compute), and ranks idle in a pipeline bubble hand their
core to the busy ones, so a pipeline takes the longer of its work spread over the cores and
its critical path at a whole core (Graham 1969's two bounds of list scheduling).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from paraxis.layout import Layout
from paraxis.model_config import ModelConfig
from paraxis.plan.bubble import pipeline_figures
from paraxis.plan.comm import axis_link, collective_time, dp_sync_time, tp_layer_time
from paraxis.plan.compute import (
    head_forward_traffic_per_token_eager,
    iteration_flops,
    layer_forward_flops_per_token,
    layer_forward_traffic_per_token,
    layer_forward_traffic_per_token_eager,
    optimizer_traffic_per_param,
)
from paraxis.plan.hardware import Cluster
from paraxis.plan.memory import layout_memory, stage_layers, stage_params
from paraxis.plan.precision import MIXED_ADAM, Precision


@dataclass(frozen=True)
class Overlap:
    """Which communication hides behind compute (True) or adds to the step (False)."""

    dp: bool = True
    tp: bool = False
    pp: bool = False
    # Hidden communication is not free: NCCL kernels take SMs and HBM bandwidth from the GEMMs
    # they overlap. This fraction of every hidden second still lands on the step.
    contention: float = 0.2


DEFAULT_OVERLAP = Overlap()


@dataclass(frozen=True)
class Estimate:
    layout: Layout
    micro_batch: int  # sequences per microbatch per replica
    memory: dict[str, float]  # per GPU, on the stage that needs the most
    memory_limit_bytes: float
    time: dict[str, float]  # compute, tp, pp, dp (exposed), bubble, step, seconds
    tokens_per_s: float
    mfu: float
    hfu: float
    notes: list[str] = field(default_factory=list)

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


def evaluate(cfg: ModelConfig, layout: Layout, cluster: Cluster, seq_len: int,
             global_batch: int, precision: Precision = MIXED_ADAM,
             overlap: Overlap = DEFAULT_OVERLAP) -> Estimate:
    """Predict memory and step time of `layout` (already validated) for one global batch."""
    gpu = cluster.gpu
    micro_batch = global_batch // (layout.dp * layout.microbatches)
    memory = layout_memory(cfg, layout, seq_len, micro_batch, precision)
    tokens_per_microbatch = micro_batch * seq_len

    # Compute of the busiest stage per microbatch: GEMMs at matmul_efficiency of peak, the
    # attention core at its own rate, plus memory-bound elementwise kernels at hbm_efficiency
    # of HBM bandwidth (roofline). CPU ranks beyond the cores get a share of one.
    share = cluster.compute_share
    weights, scores = layer_forward_flops_per_token(cfg, seq_len)
    layers = max(stage_layers(cfg.n_layers, layout.pp))
    rate = gpu.peak_flops * gpu.matmul_efficiency * layout.tp * share
    attention_rate = (gpu.attention_flops or gpu.peak_flops * gpu.matmul_efficiency) \
        * layout.tp * share
    hbm = gpu.hbm_bandwidth_Bps * gpu.hbm_efficiency * share
    act = precision.activation_bytes
    if gpu.kernels == "eager":
        hidden_bytes = act * layer_forward_traffic_per_token_eager(cfg, layout.tp)
        score_bytes = 0.0  # the attention kernel's own traffic is in its measured rate
        head_bytes = act * head_forward_traffic_per_token_eager(cfg, layout.tp)
    else:
        hidden_bytes, score_bytes = (b * act / 2 for b in layer_forward_traffic_per_token(
            cfg, seq_len, layout.tp, layout.sequence_parallel))  # counted in 16-bit bytes
        head_bytes = 0.0
    forward_layer = (weights / rate + scores / attention_rate
                     + (hidden_bytes + score_bytes) / hbm) * tokens_per_microbatch
    # LM head and loss, last stage
    head = (2 * cfg.d_model * cfg.vocab_size / rate + head_bytes / hbm) * tokens_per_microbatch
    recompute = {"none": 0.0, "full": forward_layer,
                 "selective": (scores / attention_rate + score_bytes / hbm)
                 * tokens_per_microbatch}[layout.recompute]
    t_forward = layers * forward_layer + head
    # Backward = 2x forward (Narayanan et al. 2021 App.), plus the recomputed forward.
    t_backward = 2 * t_forward + layers * recompute

    tp_link = axis_link(layout, "tp", cluster)
    boundary_bytes = act * tokens_per_microbatch * cfg.d_model  # activations s*b*h
    passes = 3 if layout.recompute == "full" else 2
    t_tp = 0.0
    if layout.tp > 1:
        t_tp = layers * tp_layer_time(boundary_bytes, layout.tp, layout.sequence_parallel,
                                      tp_link, passes)
        # The vocab-parallel ends (Shoeybi et al. 2019 Sec. 3): the head's input gradient is
        # all-reduced in backward, and the parallel cross-entropy all-reduces the row max,
        # then the row sums (two small all-reduces); on the last stage, the busiest.
        t_tp += (collective_time("all_reduce", boundary_bytes, layout.tp, tp_link)
                 + collective_time("all_reduce", 4 * tokens_per_microbatch, layout.tp, tp_link)
                 + collective_time("all_reduce", 8 * tokens_per_microbatch, layout.tp, tp_link))

    t_pp = 0.0
    if layout.pp > 1:
        pp_link = axis_link(layout, "pp", cluster)
        # Megatron scatter-gather (Narayanan et al. 2021 Sec. 4.1): each of tp ranks sends 1/tp
        # of the boundary activation; an activation forward and a gradient back per chunk.
        send = collective_time("send_recv", boundary_bytes / layout.tp, 2, pp_link)
        t_pp = 2 * layout.virtual_stages * send

    # Balanced stages: the idle share does not depend on the backward/forward cost ratio
    # (tests/test_plan_bubble.py), so one cached simulation serves every recompute setting.
    figures = pipeline_figures(layout.schedule, layout.pp, layout.microbatches,
                               layout.virtual_stages)
    slot_compute = t_forward + t_backward
    exposed_comm = (0.0 if overlap.tp else t_tp) + (0.0 if overlap.pp else t_pp)
    busy = layout.microbatches * (slot_compute + exposed_comm)
    pipeline = busy / (1 - figures.bubble_fraction)
    core = cluster.share_with(1)  # one rank alone: a whole core, or what is left of one
    if share < core:  # more ranks than cores
        # Idle ranks lend their cores: the work bound (busy, at the shared rate) or the
        # critical path at a whole core, whichever is longer.
        whole_core = layout.microbatches * (slot_compute * share / core + exposed_comm)
        pipeline = max(busy, whole_core / (1 - figures.bubble_fraction))

    dp_link = axis_link(layout, "dp", cluster)
    stage_param_count = max(stage_params(cfg, layout.pp)) / layout.tp
    t_dp = dp_sync_time(stage_param_count, layout.dp, layout.zero, dp_link, layout.microbatches,
                        precision.grad_bytes, precision.param_bytes, layers)
    if overlap.dp and not cluster.cores_per_node:
        # ZeRO-3 prefetches behind all compute; ZeRO-2's per-microbatch reduce-scatter behind
        # every backward; ZeRO-0/1's single all-reduce behind the last backward only.
        window = {3: layout.microbatches * slot_compute,
                  2: layout.microbatches * t_backward}.get(layout.zero, t_backward)
        dp_exposed = max(0.0, t_dp - window) + overlap.contention * min(t_dp, window)
    else:
        dp_exposed = t_dp

    # The optimizer update is memory-bound: its bytes at memory bandwidth, on this rank's
    # share of the parameters (ZeRO-1+ shards the update over dp; Rajbhandari et al. 2020).
    update_params = stage_param_count / (layout.dp if layout.zero >= 1 else 1)
    t_update = update_params * optimizer_traffic_per_param(
        precision.param_bytes, precision.grad_bytes, gpu.kernels) / hbm
    if gpu.kernels == "eager" and layout.zero < 2:
        # eager autograd adds each later microbatch's gradients into .grad (read 2, write 1)
        t_update += (layout.microbatches - 1) * 3 * precision.grad_bytes \
            * stage_param_count / hbm
    step = pipeline + dp_exposed + t_update

    flops = iteration_flops(cfg, seq_len, global_batch, layout.recompute)
    peak_total = cluster.world_size * gpu.peak_flops
    time = {"compute": layout.microbatches * slot_compute,
            "tp": 0.0 if overlap.tp else layout.microbatches * t_tp,
            "pp": 0.0 if overlap.pp else layout.microbatches * t_pp,
            "dp": dp_exposed, "bubble": pipeline - busy, "optimizer": t_update,
            "step": step,
            "tp_total": layout.microbatches * t_tp, "pp_total": layout.microbatches * t_pp,
            "dp_total": t_dp}
    notes = []
    if tp_link.crosses_nodes and layout.tp > 1:
        notes.append("TP group crosses nodes: its all-reduces run over the network")
    return Estimate(layout, micro_batch, memory, gpu.memory_bytes, time,
                    global_batch * seq_len / step, flops["model"] / (step * peak_total),
                    flops["hardware"] / (step * peak_total), notes)
