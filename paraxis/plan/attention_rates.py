"""What a FlashAttention kernel achieves, by kernel, GPU and shape: published measurements
and the small physical model the planner prices the attention core with.

Why: the attention core is not a GEMM. A flash kernel streams K/V tiles past each query
tile, rescales its running softmax once per tile and, under a causal mask, half-wastes the
tiles on the diagonal, so its rate grows with the sequence and differs by implementation:
FlashAttention-2 (Dao 2023, what PyTorch's SDPA runs on A100 since torch 2.2, and on H100
from 2.2 to 2.10) reaches 60-65% of the A100's peak at long sequences, FlashAttention-1 and
the Triton kernel MosaicML ran in 2023 about half of that; cuDNN's fused attention (SDPA's
choice on Hopper from torch 2.11) runs 1.3-1.6x FA2 on the H100.

The measurements (`CHARTS`) are the fwd + bwd bars of the FlashAttention-2 paper (Dao 2023,
arXiv:2307.08691, Fig. 4: A100 80GB SXM4, Fig. 7: H100 80GB SXM5; the same images are
assets/flash2_{a100,h100}_fwd_bwd_benchmark.png in Dao-AILab/flash-attention), read from
the charts; the points marked "~" there were hidden by the legend and read from the bar's
height (`ESTIMATED`). Setup: batch x seqlen = 16k tokens, hidden 2048 (32 heads of 64 or 16
of 128), fp16 (the same tensor-core rate as bf16). Their FLOP count (the paper's Sec. 4.1
and benchmarks/benchmark_flash_attention.py) is paraxis's for the flash kernel: forward
4 s^2 d heads per sequence, halved under a causal mask, backward 2.5x forward
(`kernels.FLASH`: causal_fraction 0.5, backward_ratio 2.5), so a bar's TFLOP/s is
directly the rate of the FLOPs `plan/cost.py` prices. cuDNN's fwd + bwd points are built
from the FlashAttention-3 paper's separate forward and backward bars (`CUDNN_FORWARD`).

The model, per (GPU, kernel, mask): rate(s, d) = r_max(d) * s / (s + s_half). s_half is the
sequence length at which the per-row work that does not grow with s (loading a query tile,
the final rescale, writing the output and log-sum-exp) and, under a causal mask, the
half-empty diagonal tiles cost as much as the s-long inner loop; it does not depend on the
head dim. r_max(d) is the plateau, fitted at d = 64 and d = 128 and linear in between
(clamped outside: larger heads run as 128, smaller as 64). Three parameters per (GPU,
kernel, mask), 24 for FA1 and FA2 on A100 and H100, fitted by least squares on the
relative error by `python -m validation.fit_attention` (`FITTED`, with the rms error of each);
cuDNN's two (H100) bring them to 30.

Other GPUs of the same architecture run at the measured rates scaled by their bf16 peak
(`MEASURED_ON`: the H100 PCIe at 756/989 of the SXM's, the H200 at the H100 SXM's).

Pure data and arithmetic: the planner imports it without torch.
"""

from __future__ import annotations

from dataclasses import dataclass

SEQ_LENS = (512, 1024, 2048, 4096, 8192, 16384)

# The GPUs the charts were measured on, with the dense fp16/bf16 peak the rates belong to.
CHART_PEAKS = {"a100": 312e12, "h100": 989e12}

# (GPU, kernel, head dim, causal) -> TFLOP/s at SEQ_LENS, fwd + bwd (FA2 paper Figs. 4, 7).
# "fa1": FlashAttention (CUDA, v1); "fa2": FlashAttention-2; "triton-tutorial": the paper's
# "FlashAttention Triton" bars (A100 only), kept as the evidence that a Triton kernel of
# 2023 runs close to FA1 (validation/fit_attention.py prints the ratio); not priced itself.
CHARTS: dict[tuple[str, str, int, bool], tuple[float, ...]] = {
    ("a100", "fa1", 64, False): (91, 92, 104, 108, 110, 110),
    ("a100", "fa1", 128, False): (76, 72, 76, 80, 82, 83),
    ("a100", "fa1", 64, True): (58, 70, 77, 87, 92, 97),
    ("a100", "fa1", 128, True): (55, 62, 69, 76, 80, 83),
    ("a100", "triton-tutorial", 64, False): (90, 102, 98, 98, 100, 100),
    ("a100", "triton-tutorial", 128, False): (78, 85, 90, 93, 95, 95),
    ("a100", "triton-tutorial", 64, True): (59, 75, 79, 76, 79, 80),
    ("a100", "triton-tutorial", 128, True): (50, 61, 68, 74, 78, 80),
    ("a100", "fa2", 64, False): (132, 153, 162, 171, 175, 176),
    ("a100", "fa2", 128, False): (151, 173, 187, 196, 201, 203),
    ("a100", "fa2", 64, True): (88, 119, 140, 156, 165, 171),
    ("a100", "fa2", 128, True): (99, 133, 155, 173, 182, 189),
    ("h100", "fa1", 64, False): (157, 159, 161, 161, 166, 168),
    ("h100", "fa1", 128, False): (127, 127, 128, 131, 137, 139),
    ("h100", "fa1", 64, True): (104, 123, 136, 138, 149, 156),
    ("h100", "fa1", 128, True): (98, 109, 108, 126, 135, 137),
    ("h100", "fa2", 64, False): (215, 254, 274, 288, 294, 296),
    ("h100", "fa2", 128, False): (248, 294, 320, 326, 335, 338),
    ("h100", "fa2", 64, True): (141, 192, 232, 257, 273, 284),
    ("h100", "fa2", 128, True): (163, 221, 265, 294, 308, 328),
}

# cuDNN's fused flash attention (what PyTorch SDPA picks on Hopper from torch 2.11, whose
# bundled cuDNN passes its version gate; opt-in from 2.6 to 2.10): the forward and backward
# bars of the FlashAttention-3 paper (Shah et al. 2024, arXiv:2407.08608, Fig. 5 forward, Fig.
# 6 backward: H100 80GB SXM5, bf16, the FA2 paper's setup of 16k tokens and hidden 2048),
# TFLOP/s at SEQ_LENS. The paper charts the backward without a mask only; under a causal mask
# the backward is taken to keep the forward's ratio to its unmasked rate. Its FA2 bars match
# the FA2 paper's within 4% (fwd + bwd, d = 128), so the two sets of charts agree.
CUDNN_FORWARD = {(64, False): (335, 373, 395, 408, 412, 413),
                 (128, False): (497, 574, 617, 609, 600, 595),
                 (64, True): (225, 288, 334, 363, 379, 388),
                 (128, True): (315, 410, 484, 518, 529, 539)}
CUDNN_BACKWARD = {64: (266, 348, 395, 417, 432, 433), 128: (305, 408, 465, 499, 518, 516)}


def _fwd_bwd(forward: float, backward: float) -> float:
    # one forward and a backward of 2.5x its FLOPs (kernels.FLASH), at their own rates
    return 3.5 / (1 / forward + 2.5 / backward)


for (_d, _causal), _forward in CUDNN_FORWARD.items():
    CHARTS[("h100", "cudnn", _d, _causal)] = tuple(
        round(_fwd_bwd(f, b * f / unmasked), 1) for f, b, unmasked in zip(
            _forward, CUDNN_BACKWARD[_d], CUDNN_FORWARD[(_d, False)], strict=True))

# Points whose label the legend hid (A100 FA2): read from the bar's height.
ESTIMATED = {(("a100", "fa2", 64, False), 1024), (("a100", "fa2", 128, False), 512),
             (("a100", "fa2", 128, False), 1024)}


@dataclass(frozen=True)
class KernelFit:
    """rate(s, d) = r_max(d) * s / (s + s_half), r_max linear in d between 64 and 128."""

    r_max_64: float  # FLOP/s
    r_max_128: float  # FLOP/s
    s_half: float  # tokens
    rms: float  # rms relative error over its 12 chart points (what the fit achieved)

    def rate(self, seq_len: float, head_dim: float) -> float:
        share = (min(max(head_dim, 64), 128) - 64) / 64
        r_max = self.r_max_64 + share * (self.r_max_128 - self.r_max_64)
        return r_max * seq_len / (seq_len + self.s_half)


# python -m validation.fit_attention (least squares on the relative error, CHARTS above);
# (GPU, kernel, causal) -> fit. 30 parameters on 120 points: rms 2.5%, largest 11.2% (H100 FA1
# causal at 4K, a dip of the published bar). FA2's shapes fit within 1%, FA1's within 4.3%,
# cuDNN's within 2.1%.
FITTED: dict[tuple[str, str, bool], KernelFit] = {
    ("a100", "fa1", False): KernelFit(1.079e+14, 8.24e+13, 93, 0.0394),
    ("a100", "fa1", True): KernelFit(9.34e+13, 8.29e+13, 313, 0.034),
    ("a100", "fa2", False): KernelFit(1.784e+14, 2.045e+14, 181, 0.0051),
    ("a100", "fa2", True): KernelFit(1.749e+14, 1.943e+14, 495, 0.0074),
    ("h100", "fa1", False): KernelFit(1.656e+14, 1.343e+14, 36, 0.0199),
    ("h100", "fa1", True): KernelFit(1.511e+14, 1.333e+14, 226, 0.0433),
    ("h100", "fa2", False): KernelFit(3.004e+14, 3.45e+14, 196, 0.0088),
    ("h100", "fa2", True): KernelFit(2.918e+14, 3.343e+14, 539, 0.008),
    ("h100", "cudnn", False): KernelFit(4.45e+14, 5.576e+14, 292, 0.0193),
    ("h100", "cudnn", True): KernelFit(4.29e+14, 5.088e+14, 640, 0.021),
}

# The kernels a GPU preset or a published run can name (GPU.attention_impl). "triton" is
# the Triton FlashAttention of 2022-23 (flash_attn_triton.py of flash-attn 1.0.x, which
# MosaicML's llm-foundry ran as `attn_impl: triton`): never measured on its own; its
# docstring calls it "slightly slower than CUDA forward + backward" (FlashAttention v1), so it
# is priced at FA1's fit on both GPUs. "cudnn" is measured on Hopper only. "" (no kernel
# named): the core at the GEMM rate.
PRICED_AS = {"fa2": "fa2", "fa1": "fa1", "triton": "fa1", "cudnn": "cudnn"}
IMPLEMENTATIONS = ("", *PRICED_AS)

# GPU presets (by name prefix) -> the chart GPU their kernels run like.
MEASURED_ON = (("a100", "a100"), ("h100", "h100"), ("h200", "h100"))


def measured_on(gpu_name: str) -> str | None:
    """The chart GPU a GPU of this name runs attention kernels like (None: none measured)."""
    for prefix, chart in MEASURED_ON:
        if gpu_name.startswith(prefix):
            return chart
    return None


def measured_for(gpu_name: str, implementation: str) -> bool:
    """Whether `implementation`'s rate was measured on the chart GPU this GPU runs like."""
    chart = measured_on(gpu_name)
    return any((chart, PRICED_AS.get(implementation), causal) in FITTED
               for causal in (False, True))


def kernel_flops(gpu_name: str, peak_flops: float, implementation: str, seq_len: float,
                 head_dim: float, causal: bool = True) -> float:
    """FLOP/s of `implementation`'s fwd + bwd on one GPU, in the flash kernel's own count
    (the FLOPs it computes: half the square under a causal mask), for sequences of
    `seq_len` with heads of `head_dim`; the chart GPU's rate scaled by `peak_flops`."""
    chart = measured_on(gpu_name)
    if chart is None or (chart, PRICED_AS.get(implementation), causal) not in FITTED:
        raise ValueError(f"no attention measurements for {implementation!r} on {gpu_name!r}")
    fit = FITTED[(chart, PRICED_AS[implementation], causal)]
    return fit.rate(seq_len, head_dim) * peak_flops / CHART_PEAKS[chart]
