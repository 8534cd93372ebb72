"""Rates a layer's work runs at, and which communication hides behind it.

`Overlap` states the overlap assumptions (cost.py prices a step with them); `layer_rates` and
`gemm_efficiency` turn a GPU preset into the FLOP/s and bytes/s a TP group splits a layer at,
`attention_kernel_rate` the attention core's rate by kernel and shape.
Kept apart from cost.py so the parts of a layer priced elsewhere (plan/experts.py: the
experts of a mixture-of-experts block) use the same rates.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from paraxis.plan.attention_rates import kernel_flops
from paraxis.plan.compute import layer_forward_flops_per_token, layer_gemm_shapes
from paraxis.plan.fp8 import check_fp8
from paraxis.plan.hardware import GPU, Cluster
from paraxis.spec.errors import ParaxisError
from paraxis.spec.kernels import AttentionKernel
from paraxis.spec.model_config import ModelConfig
from paraxis.spec.precision import Precision


@dataclass(frozen=True)
class Overlap:
    """Which communication hides behind compute (True) or adds to the step (False).

    dp: DDP-style gradient buckets (ZeRO-0/1: behind the last microbatch's backward; ZeRO-2:
    behind every backward), all but the last bucket; ZeRO-1/2's parameter all-gather after
    the step hides only where the runtime starts it in the next forward
    (`GPU.param_gather_overlap`). zero3_prefetch: FSDP-style prefetch one layer ahead, so each
    layer's gathers (and its gradient reduce-scatter) hide behind one layer's compute, never
    behind the whole step. tp: the backward's TP collectives behind the weight-gradient
    GEMMs; the forward's block the next GEMM unless the runtime pipelines every TP collective
    with its GEMM (`GPU.tp_comm_overlap` "all", under SP). pp: the pipeline's sends.
    cp: each ring hop of K/V (and dK/dV) behind one ring step's attention (plan/context.py).
    """

    dp: bool = True
    tp: bool = True
    pp: bool = False
    zero3_prefetch: bool = True
    cp: bool = True
    # Hidden communication is not free: NCCL kernels take SMs and HBM bandwidth from the GEMMs
    # they overlap. This fraction of every hidden second still lands on the step.
    contention: float = 0.2

DEFAULT_OVERLAP = Overlap()
NO_OVERLAP = Overlap(dp=False, tp=False, pp=False, zero3_prefetch=False, cp=False)


def overlap_on(cluster: Cluster, overlap: Overlap) -> Overlap:
    # CPU ranks: gloo's threads run on the cores the compute runs on, so nothing hides.
    return NO_OVERLAP if cluster.cores_per_node else overlap


def check_precision(gpu: GPU, precision: Precision) -> None:
    """Refuse a precision the GPU has no units for: FP8 (`fp8.check_fp8`), or bf16 where it
    has no bf16 tensor cores."""
    check_fp8(gpu, precision)
    if precision.compute_dtype == "bf16" and not gpu.bf16:
        raise ParaxisError(f"{gpu.name} has no bf16 tensor cores (compute capability 8.0 and "
                           "up: A100, H100, H200, L40S); use --precision fp16 or fp32")


def for_precision(cluster: Cluster, precision: Precision) -> Cluster:
    """`cluster` with its GPU's rates for what `precision` computes in. fp32 matmuls run on the
    CUDA cores at `GPU.fp32_peak_flops`, at the same share of it, their half width scaled
    by the peaks as the machine balance is; the attention core is priced like them (the
    flash kernels run 16-bit inputs only: SDPA computes fp32 attention in its
    memory-efficient kernel, on the same cores), and no FP8. 16-bit precisions, GPUs whose
    fp32 rate is not known (a CPU profile's peak_flops is its fp32 rate already) and a
    cluster already at its fp32 rate are returned as they are."""
    gpu = cluster.gpu
    if precision.compute_dtype != "fp32" or not gpu.fp32_peak_flops \
            or gpu.peak_flops == gpu.fp32_peak_flops:
        return cluster
    fp32 = dataclasses.replace(
        gpu, peak_flops=gpu.fp32_peak_flops, fp8_peak_flops=0.0, attention_impl="",
        attention_flops=0.0,
        gemm_half_width=gpu.gemm_half_width * gpu.fp32_peak_flops / gpu.peak_flops)
    return dataclasses.replace(cluster, gpu=fp32)


def layer_rates(cluster: Cluster, tp: int) -> tuple[float, float, float]:
    """(GEMM FLOP/s, attention-core FLOP/s, memory bytes/s) a TP group of `tp` ranks splits
    a layer's work at: GEMMs at matmul_efficiency of peak, the attention core at its own
    rate, elementwise kernels at hbm_efficiency of memory bandwidth (roofline); CPU ranks
    beyond the cores get a share of one."""
    gpu, share = cluster.gpu, cluster.compute_share
    rate = gpu.peak_flops * gpu.matmul_efficiency * tp * share
    attention = (gpu.attention_flops or gpu.peak_flops * gpu.matmul_efficiency) * tp * share
    return rate, attention, gpu.hbm_bandwidth_Bps * gpu.hbm_efficiency * share


def gemm_efficiency(cluster: Cluster, width: float) -> float:
    """Fraction of peak a GEMM whose narrower side is `width` reaches (GPU.gemm_half_width)."""
    gpu = cluster.gpu
    if not gpu.gemm_half_width:
        return gpu.matmul_efficiency
    return gpu.matmul_efficiency * width / (width + gpu.gemm_half_width)


def attention_kernel_rate(cluster: Cluster, kernel: AttentionKernel, seq_len: int,
                          head_dim: int, cp: int, tp: int) -> float:
    """FLOP/s a TP group of `tp` ranks runs the attention core's fwd + bwd at, in the flash
    kernel's own count, by the kernel the GPU names (`GPU.attention_impl`) and the shape
    (plan/attention_rates.py); 0 where the core is priced otherwise: a measured
    `attention_flops`, no kernel named, or the math kernel (the charts measure flash kernels).

    With context parallelism every ring step but the diagonal one is a full block of s/cp
    queries by s/cp keys: priced at the non-causal rate of sequences of s/cp (the all-gather
    variant alike; `cp` is the number of pieces, 1 for the all-to-all variant, which runs
    the whole sequence). Heads split over TP do not change the rate (the charts hold tokens
    fixed and vary the sequence)."""
    gpu = cluster.gpu
    if gpu.attention_flops or not gpu.attention_impl or kernel.keeps_scores:
        return 0.0
    rate = kernel_flops(gpu.name, gpu.peak_flops, gpu.attention_impl, seq_len / cp, head_dim,
                        causal=cp == 1)
    return rate * tp * cluster.compute_share


def weight_gemm_seconds(cfg: ModelConfig, cluster: Cluster, tp: int, rate: float,
                         mlp: bool = True) -> float:
    """Seconds per token of one layer's weight GEMMs on one TP rank, by shape (without
    `mlp`: the attention half of an MoE block)."""
    if not cluster.gpu.gemm_half_width:
        if not mlp:
            return sum(2 * k * n for k, n in layer_gemm_shapes(cfg, 1, mlp)) / rate
        return layer_forward_flops_per_token(cfg, 1, 0)[0] / rate
    return sum(_shaped_gemm_seconds(cluster, k, n) for k, n in layer_gemm_shapes(cfg, tp, mlp))


def _shaped_gemm_seconds(cluster: Cluster, k: float, n: float) -> float:
    """Seconds per token of one (k, n) GEMM on one GPU at its shape's efficiency."""
    return 2 * k * n / (cluster.gpu.peak_flops * cluster.compute_share
                        * gemm_efficiency(cluster, min(k, n)))


def down_projection_seconds(cfg: ModelConfig, cluster: Cluster, tp: int, rate: float) -> float:
    """Seconds per token of one dense layer's MLP down projection on one TP rank (the last
    of `layer_gemm_shapes`), as `weight_gemm_seconds` prices each GEMM."""
    k, n = layer_gemm_shapes(cfg, tp)[-1]
    if not cluster.gpu.gemm_half_width:
        return 2 * k * tp * n / rate  # the layer's whole GEMM at the TP group's rate
    return _shaped_gemm_seconds(cluster, k, n)
