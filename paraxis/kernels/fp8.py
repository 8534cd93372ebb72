"""FP8 GEMMs with dynamic scaling: a projection's matmul on FP8 operands, its output in the
compute dtype.

For y = x W^T (x: tokens x in, W: out x in) each operand is scaled so that its largest
magnitude lands on the FP8 format's largest value, cast, multiplied with fp32 accumulation,
and the product divided by both scales (Micikevicius et al., "FP8 Formats for Deep Learning",
2022; torchao's float8 training and Transformer Engine do the same):

    forward    y      = x W^T   x, W in e4m3 (more mantissa: 3 bits, up to 448)
    backward   dL/dx  = g W     g = dL/dy in e5m2 (more range: up to 57344) for tensorwise,
               dL/dW  = g^T x   e4m3 for rowwise (its per-row scales cover the range), as
                                torchao's recipes choose

Two recipes (`spec.precision.FP8_RECIPES`): tensorwise, one scale per tensor, each operand
cast once and reused transposed in backward (the FP8 copies are what backward keeps);
rowwise, one scale per row along each GEMM's contraction dim (per token and per output
feature in forward, per feature over the tokens for dL/dW), so each GEMM casts its operands
itself, from the 16-bit tensors kept for backward.

Scales are powers of two in both recipes (torchao rounds rowwise's so, tensorwise's on
request): multiplying by one is exact, so the cast is the only rounding, and a scale moves
only when an amax crosses a power of two. An amax that differs in its last bits (a layout's
fp32 sums rounding otherwise) then leaves the FP8 values unchanged, where a scale exact to
the amax would move every element and flip some casts (docs/precision.md, "FP8").

Why torch._scaled_mm and not torchao: torchao's `convert_to_float8_training` swaps
`nn.Linear` modules and reaches tensor parallelism and FSDP through DTensor, while paraxis's
GEMMs run through `kernels.linear` (stacked q/k/v and gate/up; column- and row-parallel
layers that are not `nn.Linear`) and its tensor parallelism and ZeRO are its own. The GPU
image also has no network, so torchao would be a wheel to carry and keep matched to its
torch. The scaling is this file's ~200 lines, the matmul one call, and the CPU emulation
below the same code.

Where it runs: on a CUDA GPU of compute capability 8.9 or more, `torch._scaled_mm` (its
contraction dim padded with zeros to a multiple of 16: the token count of an expert's GEMM is
any number). Elsewhere (the CPU tests) an emulation: the same scales and the same casts to
the FP8 dtypes, then the FP8 values multiplied in fp32 and the product divided by the scales,
as `_scaled_mm`'s epilogue does: a reference scaled matmul.

Layouts (`Fp8Gemm`): a scale must not depend on how a layout splits a tensor that one
device holds whole, so each operand's amax is max-reduced over the groups that split the
dims it is taken over: tensor parallelism's feature slices (a row-parallel layer's input
features and weight columns, a column-parallel layer's output features), and the token
dim where context parallelism (or sequence-parallel experts) split it. torchao's
DTensor-based TP reduces its amaxes the same way. What the layouts compare with is in
docs/precision.md ("FP8").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.autograd.function import FunctionCtx

from paraxis.dist.watchdog import WATCH
from paraxis.kernels.grads import wanted
from paraxis.spec.precision import FP8_DIM_MULTIPLE, FP8_MIN_CAPABILITY, FP8_RECIPES

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2
AMAX_FLOOR = 1e-12  # an all-zero tensor's scale stays finite (torchao's EPS)

Groups = tuple[dist.ProcessGroup | None, ...]


@dataclass(frozen=True)
class Fp8Gemm:
    """How one projection runs in FP8: the recipe, and the process groups that split its
    token dim (`tokens`), its input features (`inputs`) and its output features (`outputs`),
    over which the amaxes of the operands spanning those dims are max-reduced (groups of one
    rank are dropped: they split nothing)."""

    recipe: str
    tokens: Groups = ()
    inputs: Groups = ()
    outputs: Groups = ()

    def __post_init__(self) -> None:
        if self.recipe not in FP8_RECIPES:
            raise ValueError(f"FP8 recipe {self.recipe!r}; use {' or '.join(FP8_RECIPES)}")
        for name in ("tokens", "inputs", "outputs"):
            object.__setattr__(self, name, tuple(
                g for g in getattr(self, name) if g is not None and dist.get_world_size(g) > 1))

    @property
    def weight_groups(self) -> Groups:
        """The groups the weight's amax is max-reduced over: its input features' splitters,
        and for one scale per tensor (tensorwise) its output features' too."""
        return self.inputs + (() if self.recipe == "rowwise" else self.outputs)


# ------------------------------------------------------------------------ scales and casts


def amax(x: torch.Tensor, rowwise: bool) -> torch.Tensor:
    """The largest magnitude of `x` (fp32): of all of it, or of each row along the last dim
    (kept as a column). An empty tensor's is 0."""
    if x.numel() == 0:
        shape = (*x.shape[:-1], 1) if rowwise else ()
        return torch.zeros(shape, dtype=torch.float32, device=x.device)
    if rowwise:
        return x.abs().amax(dim=-1, keepdim=True).float()
    return x.abs().amax().float()


def reduce_max(value: torch.Tensor, groups: Groups) -> torch.Tensor:
    """`value`'s elementwise max over every rank of `groups` (they split its tensor)."""
    if not groups:
        return value
    value = value.contiguous()
    for group in groups:
        with WATCH.waiting("all_reduce (fp8 amax)", group):
            dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)
    return value


def scale_of(amax: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The largest power of two that keeps `amax` within `dtype`'s range (fp32): the amax
    lands in the format's top octave."""
    scale = torch.finfo(dtype).max / amax.clamp(min=AMAX_FLOOR)
    return torch.exp2(torch.floor(torch.log2(scale)))


def quantize(x: torch.Tensor, dtype: torch.dtype, rowwise: bool, groups: Groups = ()
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """(x * scale cast to `dtype`, scale): the scale from the amax of all of `x` or of each
    row (rowwise), max-reduced over `groups`. Saturates, as torchao's casts do."""
    scale = scale_of(reduce_max(amax(x, rowwise), groups), dtype)
    return cast_scaled(x, scale, dtype), scale


def cast_scaled(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x * scale in `dtype`, saturating at its largest value (the cast of `quantize`)."""
    limit = torch.finfo(dtype).max
    return (x.float() * scale).clamp(-limit, limit).to(dtype).contiguous()


def dequantize(x8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x8.float() / scale


# ------------------------------------------------------------------------------- the matmul


def runs_on_tensor_cores(device: torch.device) -> bool:
    """Whether `device` multiplies FP8 natively (`torch._scaled_mm`); else emulated."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= \
        FP8_MIN_CAPABILITY


def scaled_mm(a8: torch.Tensor, a_scale: torch.Tensor, b8: torch.Tensor,
              b_scale: torch.Tensor, out_dtype: torch.dtype, fast_accum: bool = False
              ) -> torch.Tensor:
    """a b^T / (a_scale b_scale^T) for a (m x k) and b (n x k), both FP8 and row-major, the
    scales scalars or columns (m x 1, n x 1); fp32 accumulation, output in `out_dtype`."""
    if runs_on_tensor_cores(a8.device):
        pad = -a8.shape[1] % FP8_DIM_MULTIPLE
        if pad:  # zeros along the contraction add nothing
            a8, b8 = F.pad(a8.view(torch.uint8), (0, pad)).view(a8.dtype), \
                F.pad(b8.view(torch.uint8), (0, pad)).view(b8.dtype)
        # _scaled_mm wants the second operand column-major (b row-major, transposed) and the
        # inverse scales; rowwise: (m x 1) and (1 x n), written in bf16 only
        rowwise = b_scale.dim() > 0
        return torch._scaled_mm(a8, b8.t(), scale_a=a_scale.reciprocal(),
                                scale_b=b_scale.reciprocal().reshape(1, -1) if rowwise
                                else b_scale.reciprocal(),
                                out_dtype=torch.bfloat16 if rowwise else out_dtype,
                                use_fast_accum=fast_accum).to(out_dtype)
    with torch.autocast(a8.device.type, enabled=False):
        product = a8.float() @ b8.float().t()
    return (product / (a_scale * b_scale.reshape(1, -1) if b_scale.dim() else
                       a_scale * b_scale)).to(out_dtype)


class Fp8Matmul(torch.autograd.Function):
    """y = x W^T with FP8 operands in forward and backward; x: (tokens, in), W: (out, in)."""

    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor, weight: torch.Tensor, gemm: Fp8Gemm,
                out_dtype: torch.dtype, cast: tuple[torch.Tensor, torch.Tensor] | None = None,
                *parts: torch.Tensor) -> torch.Tensor:
        """cast: the weight already in FP8 and its scale (tensorwise; ZeRO-3 gathers it so,
        `engine.data_parallel.fp8_gather`); `parts`: the Parameters `weight` stacks
        (tensorwise, `kernels.linear.project`), stacked here. With either, `weight` is only
        its shape and its gradient's place: its values are not read."""
        ctx.gemm, ctx.out_dtype = gemm, out_dtype
        ctx.x_dtype, ctx.w_dtype, ctx.parts = x.dtype, weight.dtype, len(parts)
        rowwise = gemm.recipe == "rowwise"
        tensor_groups = () if rowwise else gemm.tokens
        x8, x_scale = quantize(x, E4M3, rowwise, tensor_groups + gemm.inputs)
        sources = parts or (weight,)
        w8, w_scale = cast if cast is not None else quantize(
            torch.cat(sources) if parts else weight, E4M3, rowwise, gemm.weight_groups)
        # the weight cast again in the backward with the forward's scale (the same bits, no
        # amax) from what autograd keeps anyway, its Parameters: an FP8 copy kept instead
        # would add a byte a parameter for every microbatch in flight
        ctx.recast = cast is None and not rowwise and all(p.is_leaf for p in sources)
        if rowwise:  # backward casts along other dims, from the 16-bit tensors
            ctx.save_for_backward(x, weight)
        elif ctx.recast:  # and the input's FP8 copy, reused transposed
            ctx.save_for_backward(x8, x_scale, w_scale, *sources)
        else:  # the FP8 weight ZeRO-3 gathered (`cast`), or a cast of a made tensor, kept
            ctx.save_for_backward(x8, x_scale, w_scale, w8)
        return scaled_mm(x8, x_scale, w8, w_scale, out_dtype, fast_accum=True)

    @staticmethod
    def backward(ctx: FunctionCtx, grad: torch.Tensor
                 ) -> tuple[torch.Tensor | None, ...]:
        gemm, out = ctx.gemm, ctx.out_dtype
        want_x, want_w = (wanted(ctx, index) for index in (0, 1))
        grad_x = grad_w = None
        if gemm.recipe == "rowwise":
            x, weight = ctx.saved_tensors
            if want_x:  # dL/dx = g W: contraction over the output features
                g8, g_scale = quantize(grad, E4M3, True, gemm.outputs)
                wt8, wt_scale = quantize(weight.t(), E4M3, True, gemm.outputs)
                grad_x = scaled_mm(g8, g_scale, wt8, wt_scale, out)
            if want_w:  # dL/dW = g^T x: contraction over the tokens
                gt8, gt_scale = quantize(grad.t(), E4M3, True, gemm.tokens)
                xt8, xt_scale = quantize(x.t(), E4M3, True, gemm.tokens)
                grad_w = scaled_mm(gt8, gt_scale, xt8, xt_scale, out)
        else:
            x8, x_scale, w_scale, *sources = ctx.saved_tensors
            g8, g_scale = quantize(grad, E5M2, False, gemm.tokens + gemm.outputs)
            if want_x:
                w = torch.cat(sources) if len(sources) > 1 else sources[0]
                wt8 = cast_scaled(w.t(), w_scale, E4M3) if ctx.recast else w.t().contiguous()
                grad_x = scaled_mm(g8, g_scale, wt8, w_scale, out)
            if want_w:
                grad_w = scaled_mm(g8.t().contiguous(), g_scale, x8.t().contiguous(), x_scale,
                                   out)
        return (None if grad_x is None else grad_x.to(ctx.x_dtype),
                None if grad_w is None else grad_w.to(ctx.w_dtype), None, None, None,
                *[None] * ctx.parts)  # the parts' gradients come through `weight`


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               gemm: Fp8Gemm, cast: tuple[torch.Tensor, torch.Tensor] | None = None,
               parts: tuple[torch.Tensor, ...] = ()) -> torch.Tensor:
    """x W^T + b with the matmul in FP8, its output in the compute dtype (autocast's, else
    the weight's). cast: W already in FP8 with its scale; parts: the Parameters W stacks
    (`Fp8Matmul.forward`)."""
    kind = x.device.type
    out_dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) \
        else weight.dtype
    matmul = Fp8Matmul.apply
    if torch.compiler.is_compiling() and (gemm.tokens or gemm.inputs or gemm.outputs):
        # its amax all-reduces stay eager, as tensor parallelism's collectives do: a graph
        # break around the GEMM rather than a traced process group
        matmul = torch.compiler.disable(matmul)
    y = matmul(x.reshape(-1, x.shape[-1]), weight, gemm, out_dtype, cast, *parts)
    y = y.view(*x.shape[:-1], weight.shape[0])
    return y if bias is None else y + bias.to(out_dtype)
