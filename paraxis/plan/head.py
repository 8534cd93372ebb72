"""The LM head and the loss: what the last pipeline stage adds to its blocks per microbatch.

Apart from cost.py (one idea per file): the vocabulary projection's GEMM, the final norm and
the loss's elementwise traffic, and with tp > 1 the vocab-parallel ends' collectives.
"""

from __future__ import annotations

from paraxis.plan.comm import axis_link, collective_time
from paraxis.plan.compute import BACKWARD_FLOPS_RATIO, head_forward_traffic_per_token_eager
from paraxis.plan.hardware import Cluster
from paraxis.plan.rates import DEFAULT_OVERLAP, Overlap, gemm_efficiency, layer_rates, overlap_on
from paraxis.spec.kernels import fused_loss_problem, fused_loss_traffic
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
    if cluster.gpu.loss_kernel == "fused-linear" and \
            fused_loss_problem(layout.tp, layout.zero) is None:
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
    # all-reduces the row max, then the row sums (two small all-reduces that block), and the
    # head's input gradient is all-reduced in the backward, where, like a layer's
    # column-parallel linears, it can hide behind the head's weight-gradient GEMM.
    link = axis_link(layout, "tp", cluster)
    loss = (collective_time("all_reduce", 4 * tokens, layout.tp, link)
            + collective_time("all_reduce", 8 * tokens, layout.tp, link))
    grad = collective_time("all_reduce", precision.activation_bytes * tokens * cfg.d_model,
                           layout.tp, link)
    exposed = grad
    if overlap.tp:
        exposed = max(0.0, grad - gemm) + overlap.contention * min(grad, gemm)
    return {"forward": forward, "backward": BACKWARD_FLOPS_RATIO * forward, "tp": loss + exposed,
            "tp_total": loss + grad}
