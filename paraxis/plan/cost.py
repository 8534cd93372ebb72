"""Price one layout: memory that must fit, step time by part, tokens/s, MFU and HFU.

Step time (one data-parallel replica runs the same pipeline as every other):

    slot     = t_forward + t_backward (+ recompute) + exposed TP + exposed PP, per microbatch
    pipeline = M * slot / (1 - bubble_fraction)      bubble from the schedule objects
    step     = pipeline + exposed DP sync + optimizer step (HBM-bound)

Overlap assumptions are explicit (`Overlap`): by default the DP gradient sync hides behind the
last microbatch's backward (PyTorch DDP buckets; Li et al. 2020 Sec. 3.2.3) and ZeRO-3's
gathers behind the step's compute (prefetch); the backward's TP collectives of the
column-parallel linears hide behind their gradient GEMMs (Megatron: Korthikanti et al. 2022
Sec. 6.2), while forward TP collectives and PP sends sit on the critical path (Narayanan et
al. 2021 Sec. 4).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from paraxis.layout import Layout
from paraxis.model_config import ModelConfig
from paraxis.plan.bubble import pipeline_figures
from paraxis.plan.comm import (
    axis_link,
    dp_sync_time,
    p2p_time,
    tp_layer_exposed_time,
    tp_layer_time,
)
from paraxis.plan.compute import (
    iteration_flops,
    layer_forward_flops_per_token,
    layer_forward_traffic_per_token,
)
from paraxis.plan.hardware import Cluster
from paraxis.plan.memory import layout_memory, stage_layers, stage_params
from paraxis.plan.precision import MIXED_ADAM, Precision


@dataclass(frozen=True)
class Overlap:
    """Which communication hides behind compute (True) or adds to the step (False)."""

    dp: bool = True
    tp: bool = True  # backward only: forward TP collectives always block the next GEMM
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


def layer_times(cfg: ModelConfig, layout: Layout, cluster: Cluster, seq_len: int,
                micro_batch: int, overlap: Overlap = DEFAULT_OVERLAP) -> dict[str, float]:
    """Seconds one transformer layer takes on one GPU per microbatch.

    Keys: forward / backward (compute; backward includes recomputation), tp_forward /
    tp_backward (TP communication on the critical path; a full recomputation reruns the
    forward's), tp_total (all TP traffic, hidden or not).
    """
    gpu = cluster.gpu
    tokens = micro_batch * seq_len
    # GEMMs at matmul_efficiency of peak, plus memory-bound elementwise kernels at
    # hbm_efficiency of HBM bandwidth (roofline).
    weights, scores = layer_forward_flops_per_token(cfg, seq_len)
    hidden_bytes, score_bytes = layer_forward_traffic_per_token(
        cfg, seq_len, layout.tp, layout.sequence_parallel)
    rate = gpu.peak_flops * gpu.matmul_efficiency * layout.tp
    hbm = gpu.hbm_bandwidth_Bps * gpu.hbm_efficiency
    forward = ((weights + scores) / rate + (hidden_bytes + score_bytes) / hbm) * tokens
    recompute = {"none": 0.0, "full": forward,
                 "selective": (scores / rate + score_bytes / hbm) * tokens}[layout.recompute]
    # Backward = 2x forward (Narayanan et al. 2021 App.), plus the recomputed forward.
    backward = 2 * forward + recompute

    link = axis_link(layout, "tp", cluster)
    boundary_bytes = 2 * tokens * cfg.d_model  # bf16 activations s*b*h
    # Weight-gradient GEMM of each column-parallel linear (QKV; MLP-in, gate + up for SwiGLU):
    # the window its backward collective hides in.
    mlp_in = cfg.d_ff * (1 if cfg.style == "gpt2" else 2)
    windows = tuple(2 * tokens * cfg.d_model * width / rate
                    for width in (cfg.d_model + 2 * cfg.kv_dim, mlp_in))
    tp_forward, tp_backward = tp_layer_exposed_time(
        boundary_bytes, layout.tp, layout.sequence_parallel, link, windows, overlap.tp,
        overlap.contention)
    passes = 3 if layout.recompute == "full" else 2
    if layout.recompute == "full":
        tp_backward += tp_forward  # the rerun forward's collectives block it again
    tp_total = tp_layer_time(boundary_bytes, layout.tp, layout.sequence_parallel, link,
                             passes) if layout.tp > 1 else 0.0
    return {"forward": forward, "backward": backward, "tp_forward": tp_forward,
            "tp_backward": tp_backward, "tp_total": tp_total}


def evaluate(cfg: ModelConfig, layout: Layout, cluster: Cluster, seq_len: int,
             global_batch: int, precision: Precision = MIXED_ADAM,
             overlap: Overlap = DEFAULT_OVERLAP) -> Estimate:
    """Predict memory and step time of `layout` (already validated) for one global batch."""
    gpu = cluster.gpu
    micro_batch = global_batch // (layout.dp * layout.microbatches)
    memory = layout_memory(cfg, layout, seq_len, micro_batch, precision)
    tokens_per_microbatch = micro_batch * seq_len

    # The busiest stage per microbatch: its layers, plus the LM head on the last stage.
    layers = max(stage_layers(cfg.n_layers, layout.pp))
    layer = layer_times(cfg, layout, cluster, seq_len, micro_batch, overlap)
    rate = gpu.peak_flops * gpu.matmul_efficiency * layout.tp
    hbm = gpu.hbm_bandwidth_Bps * gpu.hbm_efficiency
    head = 2 * cfg.d_model * cfg.vocab_size * tokens_per_microbatch / rate
    t_forward = layers * layer["forward"] + head
    t_backward = layers * layer["backward"] + 2 * head
    t_tp = layers * (layer["tp_forward"] + layer["tp_backward"])
    t_tp_total = layers * layer["tp_total"]
    boundary_bytes = 2 * tokens_per_microbatch * cfg.d_model  # bf16 activations s*b*h

    t_pp = 0.0
    if layout.pp > 1:
        pp_link = axis_link(layout, "pp", cluster)
        # Megatron scatter-gather (Narayanan et al. 2021 Sec. 4.1): each of tp ranks sends 1/tp
        # of the boundary activation; an activation forward and a gradient back per chunk.
        send = p2p_time(boundary_bytes / layout.tp, pp_link.bandwidth_Bps, pp_link.latency_s)
        t_pp = 2 * layout.virtual_stages * send

    # Balanced stages: the idle share does not depend on the backward/forward cost ratio
    # (tests/test_plan_bubble.py), so one cached simulation serves every recompute setting.
    figures = pipeline_figures(layout.schedule, layout.pp, layout.microbatches,
                               layout.virtual_stages)
    slot_compute = t_forward + t_backward
    slot = slot_compute + t_tp + (0.0 if overlap.pp else t_pp)
    busy = layout.microbatches * slot
    pipeline = busy / (1 - figures.bubble_fraction)

    dp_link = axis_link(layout, "dp", cluster)
    stage_param_count = max(stage_params(cfg, layout.pp)) / layout.tp
    t_dp = dp_sync_time(stage_param_count, layout.dp, layout.zero, dp_link, layout.microbatches,
                        precision.grad_bytes, precision.param_bytes, layers)
    if overlap.dp:
        # ZeRO-3 prefetches behind all compute; ZeRO-2's per-microbatch reduce-scatter behind
        # every backward; ZeRO-0/1's single all-reduce behind the last backward only.
        window = {3: layout.microbatches * slot_compute,
                  2: layout.microbatches * t_backward}.get(layout.zero, t_backward)
        dp_exposed = max(0.0, t_dp - window) + overlap.contention * min(t_dp, window)
    else:
        dp_exposed = t_dp
    # The optimizer steps after the flush and the gradient sync; ZeRO-1+ splits it over dp.
    shard = stage_param_count / (layout.dp if layout.zero >= 1 else 1)
    t_optimizer = shard * precision.optimizer_step_bytes / hbm
    step = pipeline + dp_exposed + t_optimizer

    flops = iteration_flops(cfg, seq_len, global_batch, layout.recompute)
    peak_total = cluster.world_size * gpu.peak_flops
    time = {"compute": layout.microbatches * slot_compute,
            "tp": layout.microbatches * t_tp,
            "pp": 0.0 if overlap.pp else layout.microbatches * t_pp,
            "dp": dp_exposed, "bubble": pipeline - busy, "optimizer": t_optimizer, "step": step,
            "tp_total": layout.microbatches * t_tp_total, "pp_total": layout.microbatches * t_pp,
            "dp_total": t_dp}
    notes = []
    if layout.tp > 1 and axis_link(layout, "tp", cluster).crosses_nodes:
        notes.append("TP group crosses nodes: its all-reduces run over the network")
    return Estimate(layout, micro_batch, memory, gpu.memory_bytes, time,
                    global_batch * seq_len / step, flops["model"] / (step * peak_total),
                    flops["hardware"] / (step * peak_total), notes)
