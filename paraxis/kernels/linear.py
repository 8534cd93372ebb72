"""The model's GEMMs: one projection (`linear`) and several projections of one input in one
GEMM (`project`).

Attention's q, k and v read the same input, and so do a SwiGLU MLP's gate and up. Three
GEMMs of width d launch three kernels and read the input three times; one GEMM over the
weights stacked along the output features does the same work at the rate of a wider matrix
(Megatron-LM keeps a fused `linear_qkv` for this). The weights stay separate Parameters
(`attn.q.weight`, ...): checkpoints, Hugging Face names, initial values and tensor
parallelism's slices are unchanged. A tensor-parallel rank stacks its own slices, so its
GEMM holds whole heads of q, k and v, and gate and up stay paired column for column. The
stacking copy is part of the weight's cast to the compute dtype that autocast makes anyway,
and under `torch.compile` one kernel does both.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from paraxis.kernels.stacked import stacked_linear


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
           ) -> torch.Tensor:
    """y = x W^T + b: every projection of the model goes through here."""
    return F.linear(x, weight, bias)


def stackable(layers: list[nn.Module]) -> bool:
    """Whether `layers` can run as one GEMM: each is x W^T + b and nothing else (an
    `nn.Linear`, or a layer saying so by its `stackable` attribute: a column-parallel
    layer that does not enter the TP region itself), none has hooks of its own, and their
    biases are all there or all absent."""
    plain = all(getattr(layer, "stackable", isinstance(layer, nn.Linear))
                and not (layer._forward_hooks or layer._forward_pre_hooks)
                for layer in layers)
    return plain and len({layer.bias is None for layer in layers}) == 1


def project(x: torch.Tensor, layers: list[nn.Module]) -> list[torch.Tensor]:
    """[layer(x) for layer in layers], in one GEMM where the layers allow it (`stackable`);
    for backward it keeps the weights, not their stacked copy (`kernels.stacked`)."""
    if len(layers) == 1 or not stackable(layers):
        return [layer(x) for layer in layers]
    weights = [layer.weight for layer in layers]
    biases = None if layers[0].bias is None else [layer.bias for layer in layers]
    widths = [w.shape[0] for w in weights]
    return list(stacked_linear(x, weights, biases).split(widths, dim=-1))
