"""The model's GEMMs: one projection (`linear`) and several projections of one input in one
GEMM (`project`).

Attention's q, k and v read the same input, and so do a SwiGLU MLP's gate and up. Three
GEMMs of width d launch three kernels and read the input three times; one GEMM over the
weights stacked along the output features does the same work at the rate of a wider matrix
(Megatron-LM keeps a fused `linear_qkv` for this). The weights stay separate Parameters
(`attn.q.weight`, ...): checkpoints, Hugging Face names, initial values and tensor
parallelism's slices are unchanged. A tensor-parallel rank stacks its own slices, so its
GEMM holds whole heads of q, k and v, and gate and up stay paired column for column. The
stacked weight exists only while a GEMM runs (`kernels.stacked`: forward, and again in
backward); with 16-bit compute over fp32 weights the stacking copy is the cast autocast
makes anyway, and under `torch.compile` one kernel does both.

Under an FP8 policy a projection carries its `Fp8Gemm` (`fp8`: how it scales, over which
groups; `kernels.fp8`), and `linear` runs its matmul in FP8; stacked projections share one,
so the stacked weight is scaled as one tensor, as on one device.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import FunctionCtx
from torch.nn.modules import module as modules

from paraxis.kernels.fp8 import Fp8Gemm, fp8_linear
from paraxis.kernels.stacked import stacked_linear
from paraxis.spec.errors import ParaxisError


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           fp8: Fp8Gemm | None = None,
           cast: tuple[torch.Tensor, torch.Tensor] | None = None,
           parts: tuple[torch.Tensor, ...] = ()) -> torch.Tensor:
    """y = x W^T + b: every projection of the model goes through here; with `fp8`, its
    matmul in FP8 (`kernels.fp8`), from the weight's FP8 copy where ZeRO-3 gathered one
    (`cast`; by default the weight's own `fp8_cast`, `engine.data_parallel.fp8_gather`), or
    from the Parameters `weight` stacks (`parts`)."""
    if fp8 is not None:
        cast = cast if cast is not None else getattr(weight, "fp8_cast", None)
        if cast is not None and cast[0].shape[0] != weight.shape[0]:
            raise ParaxisError(STACKING_CHANGED)
        return fp8_linear(x, weight, bias, fp8, cast, parts)
    return F.linear(x, weight, bias)


# ZeRO-3's FP8 gather casts each GEMM as `stackable` said when it was set up (one copy for
# q, k and v together, or one each); a hook added or removed since changes the GEMMs run
STACKING_CHANGED = ("--fp8-weight-gather: projections run as other GEMMs than ZeRO-3 gathered "
                    "their FP8 weights for (a hook was added or removed on them, or on every "
                    "module, after the model was wrapped); register hooks before, or drop "
                    "--fp8-weight-gather")


class Fp8Linear(nn.Linear):
    """An `nn.Linear` whose matmul runs in FP8 (`fp8`), holding the same Parameters as the
    layer it replaces (`from_linear`): names, values and checkpoints are unchanged."""

    fp8: Fp8Gemm

    @classmethod
    def from_linear(cls, layer: nn.Linear, fp8: Fp8Gemm) -> Fp8Linear:
        with torch.device("meta"):  # nothing allocated: the Parameters are the layer's
            new = cls(layer.in_features, layer.out_features, bias=layer.bias is not None)
        new.weight, new.bias = layer.weight, layer.bias
        new.fp8 = fp8
        return new

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self.fp8)


# the layers whose call is x W^T + b and nothing else, as exact types (`stackable`)
_PLAIN = (nn.Linear, Fp8Linear)


def stackable(layers: list[nn.Module]) -> bool:
    """Whether `layers` can run as one GEMM: each is x W^T + b and nothing else (an
    `nn.Linear` or `Fp8Linear` itself, not a subclass with a forward of its own such as
    a fake-quantised or low-rank one, or a layer whose own `stackable` attribute says so:
    a column-parallel layer that does not enter the TP region itself), no hook would run
    on a call of one (the layer's or every module's), their biases are all there or all
    absent, and they run in one precision (one `fp8`), but not rowwise FP8, whose GEMM keeps
    its 16-bit weight for the backward's casts: stacked, a stacked copy of the weights would
    be kept from forward to backward, where separate layers keep the Parameters themselves.

    Both attributes are read from the layer's `__dict__`, never looked up where a layer
    lacks them: compiled, every attribute read here becomes a guard checked before each
    call of the graph, two a projection, and a failed lookup is the slow kind (Python's
    `nn.Module.__getattr__`, or an AttributeError raised and caught)."""
    plain = all((type(layer) in _PLAIN or layer.__dict__.get("stackable", False))
                and not (layer._forward_hooks or layer._forward_pre_hooks
                         or layer._backward_hooks or layer._backward_pre_hooks)
                for layer in layers) and not _global_hooks()
    fp8 = _fp8(layers[0])
    return plain and len({layer.bias is None for layer in layers}) == 1 and all(
        _fp8(layer) == fp8 for layer in layers) and (fp8 is None or fp8.recipe != "rowwise")


def _global_hooks() -> bool:
    """Whether hooks registered for every module (`nn.modules.module.register_module_*`)
    would run on a layer's call."""
    return bool(modules._global_forward_hooks or modules._global_forward_pre_hooks
                or modules._global_backward_hooks or modules._global_backward_pre_hooks)


def stacked_layers(module: nn.Module) -> list[nn.Module]:
    """The projections `module` runs as one GEMM (its `STACKED` names, those it has: a
    GELU MLP has no gate)."""
    return [module._modules[name] for name in getattr(module, "STACKED", ())
            if name in module._modules]


def _fp8(layer: nn.Module) -> Fp8Gemm | None:
    """The layer's FP8 GEMM, set on the layer itself under an FP8 policy (None: none)."""
    return layer.__dict__.get("fp8")


def project(x: torch.Tensor, layers: list[nn.Module]) -> list[torch.Tensor]:
    """[layer(x) for layer in layers], in one GEMM where the layers allow it (`stackable`)."""
    if len(layers) == 1 or not stackable(layers):
        return [layer(x) for layer in layers]
    weights = [layer.weight for layer in layers]
    biases = None if layers[0].bias is None else [layer.bias for layer in layers]
    widths = [w.shape[0] for w in weights]
    fp8 = _fp8(layers[0])
    if fp8 is None:  # keeps the weights, not their stacked copy, for backward
        return list(stacked_linear(x, weights, biases).split(widths, dim=-1))
    bias = None if biases is None else torch.cat(biases)
    # the stacked weight as autograd sees it; its values: the FP8 copy ZeRO-3 gathered, or
    # the Parameters, stacked and cast inside the GEMM (neither stack kept for backward)
    cast = getattr(weights[0], "fp8_cast", None)
    stacked = functools.reduce(_StackedShape.apply, weights)
    return list(linear(x, stacked, bias, fp8, cast, () if cast is not None else tuple(weights))
                .split(widths, dim=-1))


class _StackedShape(torch.autograd.Function):
    """Two weights stacked, as autograd sees it, without their values: the FP8 GEMM reads the
    copy ZeRO-3 gathered (the 16-bit weights then hold no storage) or stacks the Parameters
    itself; the stacked gradient goes back to each weight in its rows. (Two inputs, folded
    over three: torch.compile traces a fixed number of them.)"""

    @staticmethod
    def forward(ctx: FunctionCtx, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
        ctx.rows = (first.shape[0], second.shape[0])
        return first.new_zeros(()).expand(sum(ctx.rows), first.shape[1])

    @staticmethod
    def backward(ctx: FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        first, second = grad.split(ctx.rows)
        return first, second
