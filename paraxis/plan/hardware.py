"""GPUs and clusters: the hardware the cost model prices.

A hardware description is plain data. It can come from a preset, from command-line flags, or
from a TOML/JSON file (`--hardware FILE`), including the profile `paraxis calibrate` writes.
File schema (every key optional; units in the names; bandwidths are per GPU, one direction):

    {
      "gpu": "a100-80gb",                 # preset to start from
      "name": "my-a100",                  # any of the GPU fields below override the preset
      "peak_flops": 312e12,               # dense bf16 FLOP/s
      "fp8_peak_flops": 0,                # dense FP8 FLOP/s (0: none); fp32_peak_flops, bf16 too
      "memory_bytes": 80e9,
      "nvlink_bandwidth_Bps": 300e9,      # intra-node, bytes/s per GPU per direction
      "hbm_bandwidth_Bps": 2.039e12,      # device memory bandwidth
      "matmul_efficiency": 0.6,           # achieved fraction of peak_flops in training GEMMs
      "link_efficiency": 0.8,             # achieved fraction of link bandwidth in collectives
      "hbm_efficiency": 0.8,              # achieved fraction of HBM bandwidth, elementwise ops
      "attention_flops": 0,               # achieved FLOP/s of the attention core (0: GEMM rate)
      "attention_impl": "fa2",            # unmeasured: a fitted kernel's rate (fa2, cudnn, fa1,
                                          # triton; "": GEMM rate)
      "kernels": "fused",                 # Megatron's fused ops, "eager" or "compiled" (paraxis)
      "attention_kernel": "flash",        # or "math" (keeps the s x s scores, Megatron 2021-22)
      "gradient_bucket_bytes": 26214400,  # ZeRO-0/1/2 grads per call (25 MiB); 0: per layer (FSDP)
      "gradient_bucket_rule": "fixed",    # or "megatron": max(40M, 1M x dp) parameters a bucket
      "pipeline_zero2_reduce": "step",    # ZeRO-2 under PP: once a step, or each "microbatch"
      "tp_comm_overlap": "backward",      # TP collectives behind GEMMs: backward, or "all" (SP)
      "param_gather_overlap": false,      # ZeRO-1/2 parameter all-gather behind the next forward
      "recompute_rerun": "auto",          # a full recompute reruns the "whole" block, or "needed"
      "optimizer_kernel": "auto",         # AdamW: fused, foreach, paraxis; auto: by "kernels"
      "loss_kernel": "chunked",           # or "fused-linear": head + loss never hold the logits
      "layer_overhead_s": 0,              # CPU: a layer's per-microbatch op dispatch (measured)
      "kernel_launch_s": 3.66e-5,         # GPU: host seconds per kernel launched
      "nodes": 8, "gpus_per_node": 8,
      "inter_node_bandwidth_Bps": 25e9,   # one NIC (rail), bytes/s per direction
      "nics_per_node": 8,                 # rails (0: one per GPU)
      "collective_algorithm": "ring",     # across nodes: ring or hierarchical
      "expert_dispatch": "per_expert",    # MoE all-to-all across nodes, or "per_node" (DeepEP)
      "expert_tp_dispatch": "every_rank", # experts split over tp, SP: or "sequence_shard"
      "intra_node_latency_s": 5e-6, "inter_node_latency_s": 1e-5,   # per ring step
      "collective_latency_s": 1e-5,       # per collective call
      "cores_per_node": 0,                # CPU cores the ranks of a node share (0: own devices)
      "available_cores": 0,               # cores our ranks get on a shared node (0: all)
      "collectives": {"all_reduce": {"8": {"2": {"alpha_s": 1e-4, "bandwidth_Bps": 5e8}}}},
      "sync_wait_s": {"8": {"2": 2e-3}},  # CPU: a call's wait in a step [ranks on node][group]
      "sync_wait_curve_s": {"8": {"2": [[5e-4, 1e-3], [0.016, 3e-3]]}},  # ... by compute before
      "scalar_call_s": {"8": {"8": 2e-3}} # CPU: a one-element all-reduce [ranks on node][group]
    }

Keys may also sit under "gpu"/"cluster" tables ({"gpu": {...}, "cluster": {...}}).
"collectives" holds measured fits, `[op][ranks on the node][group size]` (op: all_reduce,
all_gather, reduce_scatter, send_recv), which price a group inside a node in place of the
generic link; `paraxis calibrate` writes them. "schema" and "calibration" (the raw
measurements of a calibration) are read and ignored.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from paraxis.plan.attention_rates import IMPLEMENTATIONS, measured_for, measured_on
from paraxis.plan.compute import BACKWARD_FLOPS_RATIO, ELEMENTWISE_KERNELS
from paraxis.plan.hardware_values import check_profile, check_structure, check_values
from paraxis.spec.errors import ParaxisError
from paraxis.spec.grid import node_of
from paraxis.spec.kernels import KERNELS, LOSS_KERNELS, RUNTIME_KERNEL
from paraxis.spec.units import DEFAULT_BUCKET_BYTES, DEFAULT_RESERVED_BYTES, MIB


@dataclass(frozen=True)
class GPU:
    name: str
    peak_flops: float  # dense bf16 tensor-core FLOP/s (vendor datasheet)
    memory_bytes: float
    nvlink_bandwidth_Bps: float  # per GPU, one direction
    hbm_bandwidth_Bps: float = 2.0e12  # device memory bandwidth (datasheet)
    # dense FP8 tensor-core FLOP/s (datasheet; compute capability 8.9 and up); 0: none, and
    # the FP8 precisions are refused (plan/fp8.py)
    fp8_peak_flops: float = 0.0
    # dense FP32 FLOP/s on the CUDA cores (datasheet), where fp32 matmuls run: PyTorch leaves
    # TF32 off and paraxis does not turn it on (`rates.for_precision`); 0: not known
    fp32_peak_flops: float = 0.0
    bf16: bool = True  # bf16 tensor cores (compute capability 8.0 and up; a V100 has none)
    # Calibration, a few physical factors per GPU type (docs/validation.md): achieved fraction
    # of peak FLOP/s in the GEMMs of a training step, of link bandwidth in NCCL rings, and of
    # HBM bandwidth in memory-bound elementwise kernels.
    matmul_efficiency: float = 0.6
    # GEMM shape: a GEMM whose narrower side (k or n, per GPU)
    # is w reaches matmul_efficiency * w / (w + gemm_half_width) of peak: narrow GEMMs fill
    # fewer tiles and waves of the SMs and reuse each byte less. 0: every GEMM alike. (The
    # attention core has its own rate by shape: attention_impl below.)
    gemm_half_width: float = 0.0
    link_efficiency: float = 0.8
    hbm_efficiency: float = 0.8
    # The attention core (softmax(QK^T)V, a FlashAttention-style kernel) runs at its own rate;
    # 0 prices it like the GEMMs (peak x matmul_efficiency). A calibration measures it.
    attention_flops: float = 0.0
    # Unmeasured, the FlashAttention implementation the trainer runs (plan/attention_rates.py):
    # "fa2" (PyTorch SDPA on A100 since torch 2.2), "cudnn" (SDPA on H100/H200 from torch 2.11),
    # "fa1", "triton" (2022-23, priced as fa1), its fwd + bwd rate fitted by sequence and head
    # dim on published kernel benchmarks of this GPU type; "" prices the core like the GEMMs.
    attention_impl: str = ""
    # How elementwise ops run: "fused" kernels that touch each tensor once (Megatron-LM, the
    # published runs), "eager", one PyTorch kernel per op (paraxis's own runtime), or
    # "compiled", paraxis's runtime under torch.compile (its elementwise ops fused as
    # "fused" prices them). The name stands for the runtime too (`megatron_runtime`):
    # Megatron's GPT blocks have dropout, it keeps SP inputs' shards and re-gathers them in
    # the backward, each tp rank sends 1/tp of a pipeline boundary (scatter-gather) and its
    # Adam is one fused kernel; paraxis's blocks have no dropout, keep the gathered inputs,
    # send the boundary whole without SP (cost.layer_times, memory.layout_memory,
    # compute.optimizer_traffic_per_param).
    kernels: str = "fused"
    # CPU ranks: seconds a layer's forward + backward spends dispatching its eager ops (one
    # token's pass, measured by a calibration), paid per layer per microbatch whatever the
    # shard size. 0: not measured (datasheet presets, older profiles): not priced.
    layer_overhead_s: float = 0.0
    # GPU ranks: host seconds to issue one kernel (PyTorch's dispatch, autograd and the CUDA
    # launch). The host runs ahead of the GPU, so a layer takes the longer of its GPU time
    # and its launches (compute.layer_kernels) x this: small microbatches go host-bound.
    # 0: not priced (CPU ranks price their dispatch by layer_overhead_s).
    kernel_launch_s: float = 0.0
    # Memory held back on every device (units.DEFAULT_RESERVED_BYTES on a GPU); on a CPU a
    # rank's process baseline, measured by `paraxis calibrate` (calibrate/baseline.py).
    reserved_bytes: float = DEFAULT_RESERVED_BYTES
    # The attention core's kernel (paraxis/spec/kernels.py): "flash", what
    # paraxis.model.transformer
    # runs, or "math", which keeps the s x s scores (Megatron-LM's published 2021-22 runs).
    attention_kernel: str = RUNTIME_KERNEL.name
    # ZeRO-0/1/2 gradient reductions: one collective call per bucket of this many bytes
    # (paraxis's runtime and PyTorch DDP: 25 MiB, each call paying its latency), or 0: one call
    # per layer, as PyTorch FSDP reduces each wrapped block as one unit (ZeRO-3 always is).
    gradient_bucket_bytes: float = DEFAULT_BUCKET_BYTES
    # How the runtime sizes those buckets: "fixed", gradient_bucket_bytes; "megatron",
    # Megatron-Core's DDP default, max(40M, 1M x dp) parameters a bucket (comm.py).
    gradient_bucket_rule: str = "fixed"
    # ZeRO-2 under a pipeline: "step", as paraxis's runtime does it (a stage accumulates its
    # gradients whole over the microbatches and reduce-scatters them once, at the step's end:
    # ZeRO-1's traffic, the whole gradients in memory beside the shards), or "microbatch",
    # PyTorch FSDP's default (each microbatch's backward reduce-scatters; only shards
    # accumulate), as Llama 3's runs did. Without a pipeline paraxis reduces each microbatch.
    pipeline_zero2_reduce: str = "step"
    # TP collectives a runtime overlaps with GEMMs: "backward", the input-gradient all-reduce
    # (with SP, reduce-scatter and re-gather) of each column-parallel linear behind its
    # weight-gradient GEMM (Megatron-LM's default, Korthikanti et al. 2022 Sec. 6.2), the
    # forward's blocking; "all", with SP, every TP collective pipelined with the GEMM beside
    # it, forward too (Megatron-Core --tp-comm-overlap, NeMo ub_tp_comm_overlap: Transformer
    # Engine's userbuffers; tp_layer.tp_layer_exposed_time).
    tp_comm_overlap: str = "backward"
    # ZeRO-1/2's all-gather of the updated parameters: after the step, exposed (False:
    # paraxis's runtime, DeepSpeed ZeRO-1/2), or bucket by bucket behind the next step's first
    # forward (True: Megatron-Core --overlap-param-gather).
    param_gather_overlap: bool = False
    # What a full recomputation reruns of a block in its backward: "whole", its forward
    # (Megatron-LM's checkpoint, torch.utils.checkpoint before PyTorch 2.1 or reentrant), or
    # "needed", up to the last tensor the backward reads (PyTorch's non-reentrant checkpoint
    # from 2.1, which stops early, as paraxis's runtime runs it; torch.compile's partitioner
    # likewise): not a dense block's down projection, nor what follows it (layer_cost.py).
    # "auto": "whole" with Megatron's fused kernels, "needed" with paraxis's.
    recompute_rerun: str = "auto"
    # How AdamW runs (`compute.optimizer_traffic_per_param`): "fused" (Megatron/Apex
    # multi-tensor Adam), "foreach" (torch.optim.AdamW's multi-tensor ops, one pass per op),
    # "paraxis" (paraxis's runtime: torch's fused kernel and its own norm, clipping and
    # master passes); "auto" is "fused" with fused kernels and "paraxis" with paraxis's.
    optimizer_kernel: str = "auto"
    # What the LM head and the loss keep (`spec.kernels`): "chunked", the logits (their
    # gradient written over them) and one chunk's fp32 workspace (paraxis's default);
    # "fused-linear", dL/dx, an fp32 dL/dW and one chunk's logits (paraxis --fused-loss,
    # Liger-Kernel's fused linear cross entropy).
    loss_kernel: str = "chunked"

    @property
    def megatron_runtime(self) -> bool:
        """Whether `kernels` names Megatron-LM's runtime (the published runs), not paraxis's."""
        return self.kernels == "fused"


# Host seconds per kernel launched, measured with paraxis's eager runtime on the host of an
# H100 (docs/gpu/gpu-profile.json): the host-bound GPT-2 1.5B step issued 5334 kernels in
# 195 ms (36.6 us each; GPT-2 124M: 1224 in 49 ms, 40 us). A property of the host and of
# PyTorch's per-op cost, so every GPU preset carries it.
HOST_SECONDS_PER_KERNEL = 36.6e-6

# Datasheet figures. NVLink: A100 600 GB/s, H100/H200 900 GB/s bidirectional -> half per way.
# Memory as the driver reports it (nvidia-smi's total, binary units): an "80GB" A100 81920
# MiB, an "80GB HBM3" H100 (SXM or PCIe) 81559, a "40GB" A100 40960, an H200 143771, a 32 GB
# V100 32768, an L40S 46068 (ECC on): 1-7% above the "GB" of the name.

# A100: GEMM efficiency by shape, fitted on the fitted measurements of docs/validation.md
# (python -m validation.fit_gemm: rms 5.1%; one efficiency for every GEMM: 5.2% at best).
A100_MATMUL_EFFICIENCY, A100_GEMM_HALF_WIDTH = 0.70, 192.0
A100_PEAK, A100_HBM = 312e12, 2.039e12

# No training run on H100 is fitted: its GEMM curve is the A100's carried over by two
# measured or physical ratios, never by a run's error (docs/validation.md, "H100"):
# - the best achieved bf16 matmul of each chip, torch.matmul over a brute-force search of
#   shapes (Bekman, ml-engineering, compute/accelerator/README.md at b9e2972, "Maximum
#   Achievable Matmul FLOPS comparison table"): A100 SXM 271.2 of 312 TFLOP/s (86.9%),
#   H100 SXM 794.5 of 989 (80.3%, "H200 is the same"): the ceiling falls by 0.803 / 0.869;
# - the half width scales with the machine balance (peak FLOP/s per byte/s of HBM): a GEMM
#   whose narrower side is w does about w FLOPs per byte it moves, so it runs at
#   w / (w + balance) of the roofline, and a chip with twice the balance needs twice the w.
# The rule sets the presets below (CARRIED), and again where overrides change a carried
# preset's peak or HBM bandwidth without stating the curve (build_cluster): a 96 GB H100 at
# 2.4 TB/s (validation/validate_heldout.py) has its own balance, not the SXM's.
MAMF_SHARE = {"a100": 271.2 / 312, "h100": 794.5 / 989}


def carried_from_a100(peak_flops: float, hbm_Bps: float, mamf_share: float) -> dict:
    """matmul_efficiency and gemm_half_width of a GPU without fitted runs: the A100 fit
    scaled by the ratio of measured matmul ceilings and of machine balances."""
    balance = (peak_flops / hbm_Bps) / (A100_PEAK / A100_HBM)
    return {"matmul_efficiency": A100_MATMUL_EFFICIENCY * mamf_share / MAMF_SHARE["a100"],
            "gemm_half_width": A100_GEMM_HALF_WIDTH * balance}


# The presets whose GEMM curve is carried from the A100's, with their chip's MAMF share.
CARRIED = {"h100-sxm-80gb": MAMF_SHARE["h100"], "h100-pcie-80gb": MAMF_SHARE["h100"],
           "h200": MAMF_SHARE["h100"]}

GPUS: dict[str, GPU] = {g.name: g for g in (
    GPU("a100-40gb", A100_PEAK, 40960 * MIB, 300e9, 1.555e12, fp32_peak_flops=19.5e12,
        matmul_efficiency=A100_MATMUL_EFFICIENCY, gemm_half_width=A100_GEMM_HALF_WIDTH,
        attention_impl="fa2", kernel_launch_s=HOST_SECONDS_PER_KERNEL),
    GPU("a100-80gb", A100_PEAK, 81920 * MIB, 300e9, A100_HBM, fp32_peak_flops=19.5e12,
        matmul_efficiency=A100_MATMUL_EFFICIENCY, gemm_half_width=A100_GEMM_HALF_WIDTH,
        attention_impl="fa2", kernel_launch_s=HOST_SECONDS_PER_KERNEL),
    # Hopper presets: the kernel torch 2.11's SDPA runs there (cuDNN's, docs/gpu/README.md).
    # FP8 dense peaks: twice bf16's on Hopper (H100 SXM and H200 1979, PCIe 1513 TFLOP/s)
    # and Ada (L40S 733); the datasheets' "with sparsity" figures are twice these
    GPU("h100-sxm-80gb", 989e12, 81559 * MIB, 450e9, 3.35e12, 1979e12, attention_impl="cudnn",
        kernel_launch_s=HOST_SECONDS_PER_KERNEL, fp32_peak_flops=67e12,
        **carried_from_a100(989e12, 3.35e12, CARRIED["h100-sxm-80gb"])),
    # no PCIe H100 was measured: the SXM's ceiling share, at the PCIe card's own balance; its
    # node talks over PCIe Gen5 x16 (its NVLink bridges join pairs of cards only)
    GPU("h100-pcie-80gb", 756e12, 81559 * MIB, 64e9, 2.0e12, 1513e12, attention_impl="cudnn",
        kernel_launch_s=HOST_SECONDS_PER_KERNEL, fp32_peak_flops=51e12,
        **carried_from_a100(756e12, 2.0e12, CARRIED["h100-pcie-80gb"])),
    GPU("h200", 989e12, 143771 * MIB, 450e9, 4.8e12, 1979e12, attention_impl="cudnn",
        kernel_launch_s=HOST_SECONDS_PER_KERNEL, fp32_peak_flops=67e12,
        **carried_from_a100(989e12, 4.8e12, CARRIED["h200"])),
    GPU("v100-32gb", 125e12, 32768 * MIB, 150e9, 0.9e12,  # peak: fp16 tensor cores
        kernel_launch_s=HOST_SECONDS_PER_KERNEL, fp32_peak_flops=15.7e12, bf16=False),
    GPU("l40s", 362e12, 46068 * MIB, 32e9, 0.864e12, 733e12, fp32_peak_flops=91.6e12,
        kernel_launch_s=HOST_SECONDS_PER_KERNEL),  # no NVLink: PCIe Gen4 x16
)}


# The fields that name one of a few ways a runtime works, and those ways.
CHOICES: dict[str, tuple[str, ...]] = {
    "kernels": ELEMENTWISE_KERNELS, "gradient_bucket_rule": ("fixed", "megatron"),
    "optimizer_kernel": ("auto", "fused", "foreach", "paraxis"), "loss_kernel": LOSS_KERNELS,
    "tp_comm_overlap": ("backward", "all"), "pipeline_zero2_reduce": ("step", "microbatch"),
    "recompute_rerun": ("auto", "whole", "needed"), "attention_kernel": tuple(KERNELS),
    "collective_algorithm": ("ring", "hierarchical"),
    "expert_dispatch": ("per_expert", "per_node"),
    "expert_tp_dispatch": ("every_rank", "sequence_shard")}
GPU_FIELDS = {f.name for f in dataclasses.fields(GPU)}


@dataclass(frozen=True)
class Cluster:
    gpu: GPU
    nodes: int = 1
    gpus_per_node: int = 8
    # One NIC (rail), one direction: 200 Gb/s HDR InfiniBand = 25 GB/s (DGX A100 has one per
    # GPU, so this is also per GPU there).
    inter_node_bandwidth_Bps: float = 25e9
    nics_per_node: int = 0  # rails; 0: one NIC per GPU (DGX)
    # Cross-node collectives: "ring" (one flat NCCL ring) or "hierarchical" (inside the node,
    # then across nodes on each member's rail, then inside again), comm.collective_time.
    collective_algorithm: str = "ring"
    # An MoE all-to-all across nodes: "per_expert" sends every (token, expert) row (paraxis's
    # runtime, Megatron's all-to-all dispatcher); "per_node" sends a token once to each node
    # that holds any of its experts, to the GPU of the same in-node index, which forwards it
    # over NVLink (DeepEP's normal kernels; DeepSeek-AI 2024, Sec. 3.2.2), plan/experts.py.
    expert_dispatch: str = "per_expert"
    # Experts split over tp under SP: "every_rank" sends each tp rank's whole tokens over the
    # expert all-to-all (paraxis's runtime); "sequence_shard" sends its sequence shard and
    # all-gathers the rows within the TP group (Megatron-Core's all-to-all dispatcher),
    # plan/experts.py shard_dispatch_times.
    expert_tp_dispatch: str = "every_rank"
    intra_node_latency_s: float = 5e-6  # per ring step
    inter_node_latency_s: float = 1e-5  # per ring step
    collective_latency_s: float = 0.0  # per collective call: launch and synchronisation
    # CPU ranks time-share the node's cores (0: every rank owns its device, as on GPUs) ...
    cores_per_node: int = 0
    # ... or the cores they get together where other sessions share the machine (0: all).
    # Linux shares the CPU fairly between sessions, then among a session's processes
    # (CFS autogroup), so our ranks get a number of cores whatever their count; a
    # calibration measures it with one busy rank per core.
    available_cores: float = 0.0
    # Measured collective fits, [op][ranks on node][group size] -> {alpha_s, bandwidth_Bps}.
    collectives: dict = field(default_factory=dict, compare=False)
    # CPU ranks: seconds every synchronising call costs in a step beyond its time on idle
    # ranks (`paraxis calibrate`, calibrate/collectives.sync_wait), [ranks on node][group
    # size] -> s:
    # ranks sharing noisy cores drift apart between calls and each call waits for the last,
    # and the compute around it runs slower. Added to collective_latency_s inside a node.
    sync_wait_s: dict = field(default_factory=dict, compare=False)
    # ... and the same wait after GEMM segments of a few lengths, [ranks on node][group size]
    # -> [[segment_s, wait_s], ...] (calibrate/collectives.sync_wait_curve): the longer the
    # compute between two calls, the further the ranks drift apart (plan/sync_wait.py) ...
    sync_wait_curve_s: dict = field(default_factory=dict, compare=False)
    # ... read at this much compute (one rank alone) before a call; 0: at the calibration's
    # own segment (sync_wait_s). Set per layout and call site by plan/sync_wait.at_segment.
    sync_segment_s: float = 0.0
    # ... and a backward's calls read this many of those segments later: a backward computes
    # both gradients, the input's and the weights', between two calls (sync_wait.after_backward).
    backward_segments: float = float(BACKWARD_FLOPS_RATIO)
    # CPU ranks: seconds of a one-element all-reduce back to back, all groups at once
    # (calibrate/collectives.scalar_calls), [ranks on node][group size] -> s: the step's
    # own small calls (plan/step_calls.py). Gloo takes another algorithm below a few
    # elements a rank, so the fits of 16 KB and more do not reach down to it (8 ranks on 2
    # cores, docs/hardware-profile.json: 2.7 ms for one element, 14.1 ms for 16 KB).
    scalar_call_s: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.gpus_per_node < 1:
            raise ParaxisError(f"a cluster needs at least one GPU (nodes={self.nodes}, "
                               f"gpus_per_node={self.gpus_per_node}); give --gpus >= 1")
        if self.cores_per_node < 0:
            raise ParaxisError(f"cores_per_node={self.cores_per_node} must be >= 0 (0: every "
                               "rank has its own device)")
        if not 0 <= self.available_cores <= max(self.cores_per_node, 0):
            raise ParaxisError(f"available_cores={self.available_cores} must be between 0 (all "
                               f"of them) and cores_per_node={self.cores_per_node}")
        for name, ways in CHOICES.items():
            value = getattr(self.gpu if name in GPU_FIELDS else self, name)
            if value not in ways:
                raise ParaxisError(f"{name}={value!r} is unknown; use "
                                   f"{', '.join(ways[:-1])} or {ways[-1]}")
        if self.nics_per_node < 0:
            raise ParaxisError(f"nics_per_node={self.nics_per_node} must be >= 0 (0: one per "
                               "GPU)")
        impl = self.gpu.attention_impl
        if impl not in IMPLEMENTATIONS:
            raise ParaxisError(f"attention_impl={impl!r} is unknown; use one of "
                               f"{', '.join(map(repr, IMPLEMENTATIONS))}")
        if impl and measured_on(self.gpu.name) is None:
            raise ParaxisError(f"attention_impl={impl!r}: no kernel measurements for GPU "
                               f"{self.gpu.name!r} (only A100, H100, H200 presets); give "
                               "attention_impl=\"\" or a measured attention_flops")
        if impl and not measured_for(self.gpu.name, impl):
            raise ParaxisError(f"attention_impl={impl!r} was not measured on GPU "
                               f"{self.gpu.name!r} (cudnn: Hopper only); give fa2 or fa1")

    @property
    def compute_share(self) -> float:
        """Fraction of one core (one device) each rank computes with: the ranks of a node
        time-share the cores they get, min(1, cores / ranks per node); 1 where ranks own
        their device."""
        return self.share_with(self.gpus_per_node)

    def share_with(self, busy_ranks: int) -> float:
        """A rank's fraction of a core while `busy_ranks` ranks of its node compute."""
        if not self.cores_per_node:
            return 1.0
        cores = self.available_cores or self.cores_per_node
        return min(1.0, cores / max(1, busy_ranks))

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    def node_of(self, rank: int) -> int:
        return node_of(rank, self.gpus_per_node)

    def replace(self, **changes: object) -> Cluster:
        return dataclasses.replace(self, **changes)


# Clusters as built, the network included (`--cluster NAME`): overrides of the Cluster and
# GPU fields, from the vendors' reference designs.
CLUSTERS: dict[str, dict[str, object]] = {
    # DGX A100: 8 A100-80GB on NVLink 3, 8 x HDR 200 Gb/s InfiniBand rails (NVIDIA DGX A100
    # user guide / SuperPOD reference architecture): a rail per GPU, whatever the node's size.
    "dgx-a100": {"gpu": "a100-80gb", "gpus_per_node": 8, "nics_per_node": 0,
                 "inter_node_bandwidth_Bps": 25e9, "collective_latency_s": 1e-5},
    # DGX H100: 8 H100-SXM on NVLink 4, 8 x NDR 400 Gb/s InfiniBand rails (ConnectX-7).
    "dgx-h100": {"gpu": "h100-sxm-80gb", "gpus_per_node": 8, "nics_per_node": 0,
                 "inter_node_bandwidth_Bps": 50e9, "collective_latency_s": 1e-5},
    # One 100 Gb/s Ethernet NIC per 8-GPU node (RoCE or TCP): every cross-node byte of the
    # node's GPUs shares 12.5 GB/s, with Ethernet's longer latencies.
    "ethernet-1nic": {"gpu": "a100-80gb", "gpus_per_node": 8, "nics_per_node": 1,
                      "inter_node_bandwidth_Bps": 12.5e9, "inter_node_latency_s": 3e-5,
                      "collective_latency_s": 2e-5},
    # A PCIe box: 8 GPUs without NVLink (PCIe 4.0 x16, 32 GB/s each way through the host),
    # one 100 Gb/s NIC.
    "pcie-box": {"gpu": "l40s", "gpus_per_node": 8, "nics_per_node": 1,
                 "nvlink_bandwidth_Bps": 32e9, "inter_node_bandwidth_Bps": 12.5e9,
                 "intra_node_latency_s": 1e-5, "inter_node_latency_s": 3e-5,
                 "collective_latency_s": 2e-5},
}


def cluster_preset(name: str) -> dict[str, object]:
    if name not in CLUSTERS:
        raise ParaxisError(f"unknown cluster {name!r}; choose one of {', '.join(CLUSTERS)} or "
                           "give --hardware FILE")
    return dict(CLUSTERS[name])


def unknown_gpu(name: str) -> str:
    """Why `name` names no preset: the presets it starts ("h100" -> both H100s), else all."""
    close = [preset for preset in GPUS if name and preset.startswith(name.lower())]
    return f"unknown GPU {name!r}; " + (f"did you mean {' or '.join(close)}?" if close else
                                        f"choose one of {', '.join(GPUS)}")


def get_gpu(name: str) -> GPU:
    if name not in GPUS:
        raise ParaxisError(f"{unknown_gpu(name)} (or give --hardware FILE)")
    return GPUS[name]


# sync_segment_s and backward_segments are the planner's, per layout and call site
# (plan/sync_wait.py), not a machine's
_CLUSTER_KEYS = {f.name for f in dataclasses.fields(Cluster)} - {
    "gpu", "sync_segment_s", "backward_segments"}
_METADATA_KEYS = ("schema", "calibration")  # a calibration profile's record of itself
_KINDS = {f.name: str(f.type) for f in (*dataclasses.fields(GPU), *dataclasses.fields(Cluster))}


def load_hardware_file(path: str | Path) -> dict[str, object]:
    """Read a TOML/JSON hardware file into flat overrides (schema in the module docstring)."""
    path = Path(path)
    if not path.is_file():
        wrong = "is a folder" if path.is_dir() else "does not exist"
        raise ParaxisError(f"hardware file {path} {wrong}; give a .json/.toml file that exists")
    kind = "TOML" if path.suffix == ".toml" else "JSON"
    try:
        data = (tomllib.loads if kind == "TOML" else json.loads)(path.read_text())
    except (ValueError, UnicodeDecodeError) as error:
        raise ParaxisError(f"hardware file {path} is not valid {kind} ({error}); fix it (schema "
                           "in docs/planner.md) or write one with paraxis calibrate") from None
    return hardware_from_data(path, data)


def hardware_from_data(path: Path, data: object) -> dict[str, object]:
    """`load_hardware_file` of the document `data` read from `path` (or about to be written
    there: `paraxis calibrate` checks its profile before writing it)."""
    check_structure(path, data)  # one object; calibrated tables shaped as calibrate writes
    check_profile(path, data)  # a calibration profile: this version's, and whole
    flat: dict[str, object] = {}
    for key, value in data.items():
        if key in ("gpu", "cluster") and isinstance(value, dict):
            flat.update(value)
        else:
            flat[key] = value
    flat = {key: value for key, value in flat.items() if key not in _METADATA_KEYS}
    known = GPU_FIELDS | _CLUSTER_KEYS | {"gpu"}
    unknown = sorted(set(flat) - known)
    if unknown:
        raise ParaxisError(f"hardware file {path}: unknown key(s) {', '.join(unknown)}; known "
                           f"keys are {', '.join(sorted(known))}")
    try:  # here, naming the file: the flags' arithmetic on its values comes after
        check_values(flat, _KINDS)
    except ParaxisError as error:
        raise ParaxisError(f"hardware file {path}: {error}") from None
    return flat


def build_cluster(gpu: str = "a100-80gb", gpus: int | None = None, gpus_per_node: int = 8,
                  overrides: dict[str, object] | None = None) -> Cluster:
    """A cluster from a preset GPU name, a GPU count and optional overrides (file or flags);
    overrides set to None are ignored, so flags left unset keep the file's or preset's value."""
    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    check_values(overrides, _KINDS)
    base = get_gpu(str(overrides.pop("gpu", gpu)))
    gpu_changes = {k: overrides.pop(k) for k in list(overrides) if k in GPU_FIELDS}
    if gpu_changes.get("name", base.name) != base.name:
        # A device of its own (a calibrated profile) measured its rates at the model's
        # shapes: it takes no preset's fitted GEMM shape term, kernel rates or fp32 rate
        # unless it states them.
        gpu_changes.setdefault("gemm_half_width", 0.0)
        gpu_changes.setdefault("attention_impl", "")
        gpu_changes.setdefault("fp32_peak_flops", 0.0)
    if (base.name in CARRIED and gpu_changes.get("name", base.name) == base.name
            and {"peak_flops", "hbm_bandwidth_Bps"} & set(gpu_changes)
            and not {"matmul_efficiency", "gemm_half_width"} & set(gpu_changes)):
        # a carried curve follows the chip's own balance (MAMF_SHARE's comment)
        gpu_changes.update(carried_from_a100(
            float(gpu_changes.get("peak_flops", base.peak_flops)),  # type: ignore[arg-type]
            float(gpu_changes.get("hbm_bandwidth_Bps", base.hbm_bandwidth_Bps)),  # type: ignore[arg-type]
            CARRIED[base.name]))
    gpu_obj = dataclasses.replace(base, **gpu_changes)
    per_node = int(overrides.pop("gpus_per_node", gpus_per_node))
    if gpus is not None:
        if gpus < 1:
            raise ParaxisError(f"--gpus {gpus}: need at least one GPU")
        if gpus < per_node:
            per_node = gpus
        if gpus % per_node:
            raise ParaxisError(f"{gpus} GPUs do not fill whole nodes of {per_node}; give a "
                               f"multiple of --gpus-per-node {per_node}")
        overrides["nodes"] = gpus // per_node  # the flag wins over a file
    return Cluster(gpu=gpu_obj, gpus_per_node=per_node, **overrides)  # type: ignore[arg-type]
