"""FP8 training as the planner prices it: the block linears on FP8 tensor cores, less the
casts that feed them; what FP8 changes in memory and in ZeRO's gathers.

What runs in FP8 (`PrecisionPolicy.fp8_recipe`, spec/precision.py): the block linears, q/k/v,
the attention output, the MLP's (or the experts') up, gate and down. The LM head, the MoE
router and the attention core stay bf16, as torchao's float8 training leaves the output
layer out (torchtitan's float8 converter skips `output`) and Transformer Engine's recipes
run only its Linear layers in FP8.

GEMMs: 2 k n FLOPs a row each, at the GPU's dense FP8 peak (`GPU.fp8_peak_flops`) times the
bf16 curve's ceiling (`matmul_efficiency`: torchao's float8 roofline, roofline_utils.py,
takes one achievable share for both dtypes) over a half width scaled by the peaks' ratio:
the carried curve's rule that a chip with twice the FLOP/s per byte needs twice the width
(plan/hardware.py, MAMF_SHARE's comment), applied to the FP8 peak.

Casts (`CAST_BYTES`): memory-bound passes over each linear's input and output gradient (per
row) and its weight (per microbatch), counted as torchao's roofline counts them
(torchao/float8/roofline_utils.py at 086ff72, `get_float8_mem_sympy`): for a dynamic scale
one amax pass reading the bf16 tensor (none where the amax fuses into the kernel that made
the tensor: inputs and output gradients under fused kernels, never the weight), then one
pass reading it and writing FP8 twice, row- and column-major for the three GEMMs; the
FP8 input is kept for the backward, where the output gradient is cast, and under the
tensorwise recipe the weight cast again from the forward's scale (`RECAST_BYTES`: no
amax pass; paraxis's runtime, as torchao's, keeps the 16-bit weight, not an FP8 copy, unless
ZeRO-3 gathered it in FP8).
Each dynamic cast also pays its amax reduction's second stage, one small kernel
(`AMAX_KERNEL_S`). Rowwise scales cast each layout with its own amax (their GEMM is priced
at the tensorwise rate: no measurement here says how much slower it runs); Transformer
Engine's delayed scaling ("delayed", a pricing recipe of the published runs) takes the scale
from the amax history and reduces the amax inside one cast-transpose pass.
Not modelled: FP8 all-gathers of tensor-parallel inputs (priced at bf16's 2 bytes), the
experts' inputs kept in FP8 (bf16's bytes), and how the experts' FP8 time splits between
forward and backward (a third and two thirds, as in bf16).

Memory: each linear's input is kept for the backward in FP8 (torchao's roofline assumes
it; Transformer Engine keeps its FP8 inputs; paraxis's runtime under the tensorwise recipe):
`saved_fp8_bytes_per_token` is what that saves against bf16. The rowwise recipe keeps the
16-bit inputs (its backward casts them along the other dim): nothing saved. torchao's
autograd function itself saves the bf16 input and weight and casts them again in the
backward (float8_linear.py, `matmul_with_hp_or_float8_args`); what a compiled step keeps is
its partitioner's choice, so a torchao run may keep bf16's bytes (torchtitan's Table 1
reports the same memory with and without Float8). The FP8 copy of the weights a block
computes with, row- and column-major, is transient (cast each microbatch): plan/memory.py
holds one block's in its buffers; where ZeRO-3 gathers the weights in FP8 autograd keeps
the gathered copies from the forward to the backward (`kept_fp8_weight_bytes`). Scales are
a float each (rowwise: per row, 4 / k of the FP8 bytes), below the planner's resolution.
The states are bf16's.
"""

from __future__ import annotations

import dataclasses
import functools

from paraxis.plan.compute import layer_gemm_shapes
from paraxis.plan.hardware import GPU, Cluster
from paraxis.spec.errors import ParaxisError
from paraxis.spec.model_config import ModelConfig
from paraxis.spec.precision import (
    FP8_MIN_CAPABILITY,
    FP8_RECIPES,
    Precision,
    fp8_weights_regathered,
)

# The planner's recipes: the runtime's, and Transformer Engine's delayed scaling.
PRICED_RECIPES = (*FP8_RECIPES, "delayed")

# Bytes a cast moves per element (bf16 in, FP8 out), (amax fused into the kernel before,
# not fused): torchao roofline_utils.get_tensor_memory_traffic_bytes (amax read 2, cast
# read 2 + write 1 + 1); rowwise casts each layout with its own amax pass; Transformer
# Engine's cast-transpose reads once and writes both layouts.
CAST_BYTES = {"tensorwise": (4.0, 6.0), "rowwise": (8.0, 10.0), "delayed": (4.0, 4.0)}
# The tensorwise weight's second cast, in the backward, with the forward's scale: bf16 read,
# FP8 written (paraxis.kernels.fp8.Fp8Matmul).
RECAST_BYTES = 3.0
# The second stage of a dynamic cast's amax reduction, one small kernel a cast: torchao
# roofline_utils.TRITON_KERNEL_1_ELEMENT_TIME_SEC (measured on an H100).
AMAX_KERNEL_S = 2e-6


def recasts(precision: Precision, gathered: bool = False) -> float:
    """1 where the backward casts a linear's weight to FP8 again (the tensorwise recipe,
    `RECAST_BYTES`), unless ZeRO-3 `gathered` it in FP8 and autograd kept that copy."""
    return 1.0 if precision.fp8_recipe == "tensorwise" and not gathered else 0.0


def check_fp8(gpu: GPU, precision: Precision) -> None:
    """Refuse FP8 where the GPU has no FP8 tensor cores (`GPU.fp8_peak_flops` 0) or the
    recipe is not one the planner prices."""
    if precision.fp8_recipe is None:
        return
    if precision.fp8_recipe not in PRICED_RECIPES:
        raise ParaxisError(f"FP8 recipe {precision.fp8_recipe!r} is unknown; use "
                           f"{', '.join(PRICED_RECIPES)}")
    if not gpu.fp8_peak_flops:
        major, minor = FP8_MIN_CAPABILITY
        raise ParaxisError(f"FP8 precisions need FP8 tensor cores (compute capability "
                           f"{major}.{minor} and up: H100, H200, L40S); {gpu.name} has none: "
                           "use --precision bf16 or an FP8 GPU")


def fp8_gemm_efficiency(gpu: GPU, width: float) -> float:
    """Fraction of the FP8 peak a GEMM whose narrower side is `width` reaches: the bf16
    ceiling over the half width scaled by the FP8 / bf16 peaks (module docstring)."""
    if not gpu.gemm_half_width:
        return gpu.matmul_efficiency
    half = gpu.gemm_half_width * gpu.fp8_peak_flops / gpu.peak_flops
    return gpu.matmul_efficiency * width / (width + half)


def linear_seconds(cluster: Cluster, precision: Precision, rows: float, k: float, n: float,
                   hbm_Bps: float, weight_share: float = 1.0, recast: float = 0.0
                   ) -> tuple[float, float]:
    """(forward, backward) seconds of one FP8 linear of `rows` rows, k inputs and n
    outputs on one GPU: its three GEMMs (forward, input and weight gradients: 2 + 4 m k n
    FLOPs) at the FP8 rate, and its casts at `hbm_Bps`: the input and the weight (of which
    `weight_share` is cast here: a shard where ZeRO gathers FP8 weights) forward, the output
    gradient backward, and `recast` times the weight again there (`recasts`)."""
    gpu = cluster.gpu
    rate = gpu.fp8_peak_flops * cluster.compute_share * fp8_gemm_efficiency(gpu, min(k, n))
    fused, unfused = CAST_BYTES[precision.fp8_recipe]
    activations = unfused if gpu.kernels == "eager" else fused
    kernel = 0.0 if precision.fp8_recipe == "delayed" else AMAX_KERNEL_S
    forward = (2 * rows * k * n / rate + (rows * k * activations
                                          + weight_share * k * n * unfused) / hbm_Bps
               + 2 * kernel)
    backward = 4 * rows * k * n / rate + (rows * activations + k * recast * RECAST_BYTES) \
        * n / hbm_Bps + kernel
    return forward, backward


def layer_linears_seconds(cfg: ModelConfig, cluster: Cluster, precision: Precision, tp: int,
                          tokens: float, hbm_Bps: float, mlp: bool = True,
                          weight_share: float = 1.0, gathered: bool = False
                          ) -> tuple[float, float]:
    """(forward, backward) seconds of one layer's block linears on one TP rank for `tokens`
    tokens in FP8 (without `mlp`: the attention half of an MoE block)."""
    forward = backward = 0.0
    recast = recasts(precision, gathered)
    for k, n in layer_gemm_shapes(cfg, tp, mlp):
        f, b = linear_seconds(cluster, precision, tokens, k, n, hbm_Bps, weight_share, recast)
        forward, backward = forward + f, backward + b
    return forward, backward


def experts_seconds(cfg: ModelConfig, cluster: Cluster, precision: Precision, rows: float,
                    etp: int, hbm_Bps: float, experts_held: float) -> float:
    """Forward-equivalent seconds (a third of forward + backward, as an MoE block's backward
    is priced at twice its forward) of `rows` routed and shared expert rows in FP8 on the
    busiest rank: gate + up and down as one GEMM each over all its rows, and the weights
    of the `experts_held` experts it holds cast once a microbatch."""
    h, f = cfg.d_model, cfg.d_ff_expert / etp
    seconds = 0.0
    for k, n in ((h, 2 * f), (f, h)):
        seconds += sum(linear_seconds(cluster, precision, rows, k, n, hbm_Bps, experts_held,
                                      experts_held * recasts(precision)))
    return seconds / 3


def saved_fp8_bytes_per_token(cfg: ModelConfig, tp: int, sequence_parallel: bool,
                              mlp: bool = True, projection_input: bool = True,
                              sp_regather: bool = True) -> float:
    """Bytes per token a layer keeps for the backward less than bf16 does, where its linears'
    inputs are kept in FP8 (1 byte, not 2): the attention and MLP inputs (the norms'
    outputs, h each, split over tp only with SP) and the MLP's down-projection input (f,
    split over tp); the output projection's input (h) too where
    `activations.projection_input_bytes` counts it apart (`projection_input`), else its FP8
    copy is kept beside the attention kernel's own output, one byte an element more.
    activations.layer_activation_bytes counts each at 2 bytes (whole under SP without
    `sp_regather`, as the gathered inputs are kept there)."""
    outside = 2 * cfg.d_model if mlp else cfg.d_model
    inside = (cfg.d_model if projection_input else -cfg.d_model) + (cfg.d_ff if mlp else 0)
    return outside / (tp if sequence_parallel and sp_regather else 1) + inside / tp


@functools.lru_cache(maxsize=256)  # a layout search asks for every layout
def gather_bytes_per_param(cfg: ModelConfig, precision: Precision) -> float:
    """Mean bytes per parameter ZeRO's gathers move, over the parameters outside the routed
    experts: 1 for the blocks' FP8 linears' weights where they travel in FP8
    (`Precision.fp8_weight_gather`), the stored bytes for the rest (embeddings, norms,
    biases, the LM head, the router, shared experts). Routed experts are gathered with their
    own units at the stored bytes (`engine.data_parallel.fp8_gather`)."""
    return _fp8_share(cfg, precision) * 1 + (1 - _fp8_share(cfg, precision)) \
        * precision.param_bytes


def regather_bytes_per_param(cfg: ModelConfig, precision: Precision, recompute: str,
                             rerun_share: float = 1.0) -> float:
    """Mean bytes per parameter (as `gather_bytes_per_param`) ZeRO-3 gathers again for the
    backward: all of them, except the FP8 linears' weights where they travel in FP8, whose
    copy autograd keeps from the forward, unless full recompute runs the forward again: of
    `rerun_share` of the blocks (the block method's checkpointed ones; every block else)."""
    kept = (1 - _fp8_share(cfg, precision)) * precision.param_bytes
    if not fp8_weights_regathered(recompute):
        return kept
    return rerun_share * gather_bytes_per_param(cfg, precision) + (1 - rerun_share) * kept


def block_fp8_params(cfg: ModelConfig, precision: Precision, mlp: bool = True) -> float:
    """Parameters of a dense block (without `mlp`: of an MoE block, whose experts travel in
    bf16) that ZeRO gathers in FP8, a unit of their own (its linears' weights, where they
    travel in FP8); 0 otherwise."""
    if precision.fp8_recipe is None or not precision.fp8_weight_gather:
        return 0.0
    return float(sum(k * n for k, n in layer_gemm_shapes(cfg, mlp=mlp)))


def kept_fp8_weight_bytes(cfg: ModelConfig, precision: Precision, tp: int, dense: int,
                          moe: int) -> float:
    """Bytes of the FP8 weights ZeRO-3 gathered for `dense` and `moe` blocks that autograd
    keeps from their forward to their backward (`engine.data_parallel.fp8_gather`), one
    rank's tp share: a byte a parameter."""
    return (dense * block_fp8_params(cfg, precision)
            + moe * block_fp8_params(cfg, precision, mlp=False)) / tp


def keeps_fp8_inputs(precision: Precision) -> bool:
    """Whether the linears keep their inputs for the backward in FP8 (`saved_fp8_bytes_per_
    token`): every recipe but rowwise, which keeps them in 16 bits."""
    return precision.fp8_recipe is not None and precision.fp8_recipe != "rowwise"


def runtime_precision(precision: Precision, zero: int) -> Precision:
    """`precision` as paraxis's runtime runs it under ZeRO stage `zero`: its weights are
    gathered in FP8 only by ZeRO-3 (`spec.precision.fp8_gather_problem`); the ZeRO-1 runs
    of the published sources that gather FP8 parameters after the step are priced by
    `cost.evaluate` as given."""
    if precision.fp8_weight_gather and zero != 3:
        return dataclasses.replace(precision, fp8_weight_gather=False)
    return precision


def _fp8_share(cfg: ModelConfig, precision: Precision) -> float:
    """The share of the parameters outside the routed experts that ZeRO gathers in FP8."""
    linears = kept_fp8_weight_bytes(cfg, precision, 1, cfg.n_layers - cfg.n_moe_layers,
                                    cfg.n_moe_layers)  # a byte each: their count
    if not linears:
        return 0.0
    routed = cfg.n_moe_layers * cfg.n_experts * cfg.expert_params()
    return min(1.0, linears / (cfg.num_params() - routed))
