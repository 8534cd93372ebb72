"""ZeRO-3 that all-gathers a block's FP8 weights in FP8: one byte per element on the wire
instead of two, as torchao's float8 all-gather for FSDP2 does (`--fp8-weight-gather`).

A block's weights that run in FP8 (tensorwise: one scale per GEMM) form a unit of their own
(`zero.zero3_units`), the weights of one GEMM side by side (q, k, v; gate, up), apart from
the block's other parameters (norms, biases), which travel in 16 bits. Before the
block's forward each rank:

    amax   the largest magnitude of each GEMM's weight over its own shard, max-reduced over
           the unit's ranks (and tensor parallelism's, which split the weight further)
    cast   its shard in FP8, each element by its GEMM's power-of-two scale
    gather the FP8 shards, end to end: every GEMM's whole weight in FP8, its scale beside it

The GEMM then multiplies that copy (`kernels.fp8.Fp8Matmul`, its `cast`) instead of casting
the weight itself. The amax of the whole weight is the max of its shards', and the cast is
elementwise, so the copy is the one the weight's own cast makes on one device, bit for bit.
Backward multiplies the same copy, which autograd keeps (as it keeps the cast's copy without
ZeRO), so an FP8 unit is never gathered again in backward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from paraxis.engine.data_parallel.flat import FlatUnit
from paraxis.kernels.fp8 import E4M3, Groups, amax, cast_scaled, reduce_max, scale_of
from paraxis.kernels.linear import stackable, stacked_layers
from paraxis.spec.errors import ParaxisError


@dataclass
class Fp8Weights:
    """The GEMMs of an FP8 unit: each one's layers (one, or those stacked into one GEMM),
    its weights' range [start, end) in the unit, and the groups its amax is reduced over
    beyond the unit's own (tensor parallelism's)."""

    gemms: list[list[nn.Module]]
    spans: list[tuple[int, int]]
    groups: Groups


def fp8_gemms(block: nn.Module) -> list[list[nn.Module]]:
    """The FP8 GEMMs of a block, as its forward runs them: projections stacked into one
    GEMM together, the others alone. A mixture of experts' layer is left out (its experts
    are gathered with their own units)."""
    gemms: list[list[nn.Module]] = []
    seen: set[int] = set()
    for name, module in block.named_modules():
        if name.split(".")[0] == "moe":
            continue
        stack = stacked_layers(module)
        if len(stack) > 1 and all(getattr(m, "fp8", None) is not None for m in stack) \
                and stackable(stack):
            gemms.append(stack)
            seen.update(id(m) for m in stack)
    for name, module in block.named_modules():
        if name.split(".")[0] != "moe" and getattr(module, "fp8", None) is not None \
                and id(module) not in seen:
            gemms.append([module])
    return gemms


def weight_groups(gemms: list[list[nn.Module]]) -> Groups:
    """The groups that split the FP8 weights beyond ZeRO (`Fp8Gemm.weight_groups`): one set
    for the whole unit."""
    splits = {layer.fp8.weight_groups for gemm in gemms for layer in gemm}
    if len(splits) != 1:
        raise ParaxisError("--fp8-weight-gather: a block's FP8 weights are split over "
                           f"different groups ({len(splits)}); drop --fp8-weight-gather")
    return splits.pop()


def describe(unit: FlatUnit, gemms: list[list[nn.Module]]) -> Fp8Weights:
    """The unit's GEMMs, their ranges in its flat order (their weights are its parameters,
    in the order of `gemms`)."""
    spans, at = [], 0
    for gemm in gemms:
        size = sum(layer.weight.numel() for layer in gemm)
        spans.append((at, at + size))
        at += size
    if at != unit.numel:
        raise ParaxisError("--fp8-weight-gather: an FP8 unit must hold exactly its GEMMs' "
                           "weights; drop --fp8-weight-gather")
    return Fp8Weights(gemms, spans, weight_groups(gemms))


@torch.no_grad()
def cast_shard(unit: FlatUnit, weights: Fp8Weights) -> tuple[torch.Tensor, torch.Tensor]:
    """(this rank's shard in FP8, one scale per GEMM): the collective part (the amaxes'
    max over the unit's group and the weights' other groups) is blocking and small."""
    shard = unit.param_shard
    lo, hi = unit.shard_start, unit.shard_start + unit.shard_numel
    parts = []  # (GEMM, range in the shard)
    for index, (start, end) in enumerate(weights.spans):
        a, b = max(start, lo), min(end, hi)
        if a < b:
            parts.append((index, a - lo, b - lo))
    largest = torch.zeros(len(weights.spans), dtype=torch.float32, device=shard.device)
    for index, a, b in parts:
        largest[index] = torch.maximum(largest[index], amax(shard[a:b], rowwise=False))
    largest = reduce_max(largest, (unit.group,) + weights.groups if unit.group is not None
                         else weights.groups)
    scales = scale_of(largest, E4M3)
    out = torch.zeros(unit.shard_numel, dtype=E4M3, device=shard.device)
    for index, a, b in parts:
        out[a:b] = cast_scaled(shard[a:b], scales[index], E4M3)
    return out, scales


def attach(full8: torch.Tensor, scales: torch.Tensor, weights: Fp8Weights) -> None:
    """Give each GEMM's first weight its gathered FP8 copy and scale (`fp8_cast`, what
    `kernels.linear` multiplies): the stacked copy for stacked GEMMs."""
    for gemm, (start, end), scale in zip(weights.gemms, weights.spans, scales, strict=True):
        columns = gemm[0].weight.shape[1]
        gemm[0].weight.fp8_cast = (full8[start:end].view(-1, columns), scale)


def detach(weights: Fp8Weights) -> None:
    for gemm in weights.gemms:
        if hasattr(gemm[0].weight, "fp8_cast"):
            del gemm[0].weight.fp8_cast
