"""The LM head and the loss: what the last pipeline stage adds to its blocks per microbatch.

Apart from cost.py (one idea per file): the vocabulary projection's GEMM, the final norm and
the loss's elementwise traffic, and with tp > 1 the vocab-parallel ends' collectives (the
head's, and the embedding's on the first stage).
"""

from __future__ import annotations

from paraxis.plan.comm import axis_link, collective_time
from paraxis.plan.compute import BACKWARD_FLOPS_RATIO, head_forward_traffic_per_token_eager
from paraxis.plan.hardware import Cluster
from paraxis.plan.rates import DEFAULT_OVERLAP, Overlap, gemm_efficiency, layer_rates, overlap_on
from paraxis.plan.tp_layer import tp_collective_time
from paraxis.spec.kernels import fused_loss_traffic, loss_kernel_run
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import ModelConfig
from paraxis.spec.precision import MIXED_ADAM, Precision


def head_times(cfg: ModelConfig, layout: Layout, cluster: Cluster, micro_batch: int,
               seq_len: int, overlap: Overlap = DEFAULT_OVERLAP,
               precision: Precision = MIXED_ADAM) -> dict[str, float]:
    """Seconds the LM head and the loss take per microbatch on the last stage: forward,
    backward (2x; the fused loss's work is all in its forward), tp (on the critical path)
    and tp_total (all their TP traffic)."""
    overlap = overlap_on(cluster, overlap)
    tokens = micro_batch * seq_len // layout.cp  # a cp rank's share of each sequence
    rate, _, hbm = layer_rates(cluster, layout.tp)
    gemm = 2 * cfg.d_model * cfg.vocab_size * tokens / rate
    if cluster.gpu.gemm_half_width:  # shape-aware: the head's narrower side
        width = min(cfg.d_model, cfg.vocab_size / layout.tp)
        gemm *= cluster.gpu.matmul_efficiency / gemm_efficiency(cluster, width)
    eager = cluster.gpu.kernels == "eager"
    norm_loss_bytes = precision.activation_bytes * tokens * (
        head_forward_traffic_per_token_eager(cfg, layout.tp) if eager else 0.0)
    forward = gemm + norm_loss_bytes / hbm
    if loss_kernel_run(cluster.gpu.loss_kernel, layout.tp, layout.zero) == "fused-linear":
        # The fused head and loss run their three GEMMs and the loss's passes in the
        # forward, and sum dL/dW in fp32 over the chunks (`spec.kernels.fused_loss_traffic`);
        # the backward scales the two gradients it kept.
        fused, scale = fused_loss_traffic(tokens, cfg.vocab_size, cfg.d_model,
                                          precision.activation_bytes)
        return {"forward": (1 + BACKWARD_FLOPS_RATIO) * forward + fused / hbm,
                "backward": scale / hbm, "tp": 0.0, "tp_total": 0.0}
    if layout.tp == 1:
        return {"forward": forward, "backward": BACKWARD_FLOPS_RATIO * forward, "tp": 0.0,
                "tp_total": 0.0}
    # The vocab-parallel ends (Shoeybi et al. 2019 Sec. 3): the parallel cross-entropy
    # all-reduces the row max, then the row sums (two small all-reduces that block); of the
    # head's own collectives (`ends_collectives`) the forward's block, the backward's can
    # hide behind the head's weight-gradient GEMM, like a layer's column-parallel linears'.
    link = axis_link(layout, "tp", cluster)
    loss = (collective_time("all_reduce", 4 * tokens, layout.tp, link)
            + collective_time("all_reduce", 8 * tokens, layout.tp, link))
    stream = precision.activation_bytes * tokens * cfg.d_model
    collectives = ends_collectives(layout)["head"]
    gather = sum(tp_collective_time(kind, stream, layout.tp, link)
                 for kind, phase in collectives if phase == "forward")
    grad = sum(tp_collective_time(kind, stream, layout.tp, link)
               for kind, phase in collectives if phase == "backward")
    exposed = grad
    if overlap.tp:
        exposed = max(0.0, grad - gemm) + overlap.contention * min(grad, gemm)
    return {"forward": forward, "backward": BACKWARD_FLOPS_RATIO * forward,
            "tp": loss + gather + exposed, "tp_total": loss + gather + grad}


def ends_collectives(layout: Layout) -> dict[str, list[tuple[str, str]]]:
    """The TP collectives (kind, phase) of the residual stream at the model's two ends per
    microbatch, as the runtime issues them (the loss's per-token scalars aside): the
    vocab-parallel embedding sums its partial rows, all-reduced, or reduce-scattered to the
    sequence shards under SP, whose backward all-gathers the gradient; the head's input is
    all-gathered from the shards under SP, and its gradient all-reduced, or
    reduce-scattered under SP."""
    if layout.tp == 1:
        return {"embedding": [], "head": []}
    if layout.sequence_parallel:
        return {"embedding": [("reduce_scatter", "forward"), ("all_gather", "backward")],
                "head": [("all_gather", "forward"), ("reduce_scatter", "backward")]}
    return {"embedding": [("all_reduce", "forward")], "head": [("all_reduce", "backward")]}


def embedding_tp_times(cfg: ModelConfig, layout: Layout, cluster: Cluster, micro_batch: int,
                       seq_len: int, precision: Precision = MIXED_ADAM) -> dict[str, float]:
    """Seconds of the vocab-parallel embedding's TP collectives (`ends_collectives`) per
    microbatch on the first stage, all on the critical path; "tp" and "tp_total" as
    `head_times`."""
    if layout.tp == 1:
        return {"tp": 0.0, "tp_total": 0.0}
    link = axis_link(layout, "tp", cluster)
    stream = precision.activation_bytes * micro_batch * seq_len // layout.cp * cfg.d_model
    seconds = sum(tp_collective_time(kind, stream, layout.tp, link)
                  for kind, _ in ends_collectives(layout)["embedding"])
    return {"tp": seconds, "tp_total": seconds}
