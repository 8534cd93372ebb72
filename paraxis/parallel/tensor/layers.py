"""Tensor-parallel layers: each holds this rank's slice of a single-device layer's weights.

Built from the plain layer (`from_linear`, `from_embedding`), so a TP rank
starts from exactly the single-device weights. Every sliced parameter carries
`tp_sharded = True` and `tp_shard_dim` (the dim along which the TP ranks' slices
concatenate into the full tensor, rank order); the other attributes a parameter had
(`pp_duplicate`, ...) travel with it.

Where the communication sits (Megatron-LM, Shoeybi et al. 2019, sec. 3):
- A column-parallel layer needs its input inside the TP region. Attention's q/k/v and the
  MLP's up/gate share one input, so the plan enters the region once on the parent module
  (`enter_tp_region`), not once per projection; the LM head enters on its own.
- A row-parallel layer leaves the region itself: all-reduce, or reduce-scatter along the
  sequence with sequence parallelism, then adds its (replicated) bias once.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from paraxis.kernels.embedding import embedding
from paraxis.kernels.fp8 import Fp8Gemm
from paraxis.kernels.linear import linear
from paraxis.parallel.tensor.comm import (
    copy_to_tp,
    gather_from_sequence,
    reduce_from_tp,
    reduce_scatter_to_sequence,
)
from paraxis.parallel.tensor.partial import mark_partial_grad
from paraxis.spec.errors import ParaxisError


def shard_parameter(param: nn.Parameter, dim: int, rank: int, size: int) -> nn.Parameter:
    """This rank's contiguous slice of `param` along `dim`, as a new TP-sharded Parameter."""
    piece = param.detach().chunk(size, dim=dim)[rank].clone()
    shard = nn.Parameter(piece, requires_grad=param.requires_grad)
    shard.__dict__.update(param.__dict__)  # keep roles such as pp_duplicate
    shard.tp_sharded = True
    shard.tp_shard_dim = dim
    return shard


def enter_tp_region(x: torch.Tensor, group: dist.ProcessGroup | None,
                    sequence_parallel: bool) -> torch.Tensor:
    """Make `x` the replicated, full-sequence input that column-parallel layers need."""
    return gather_from_sequence(x, group) if sequence_parallel else copy_to_tp(x, group)


def leave_tp_region(x: torch.Tensor, group: dist.ProcessGroup | None,
                    sequence_parallel: bool) -> torch.Tensor:
    """Sum the row-parallel partial outputs: whole on every rank, or this rank's sequence
    shard with sequence parallelism."""
    return reduce_scatter_to_sequence(x, group) if sequence_parallel else reduce_from_tp(x, group)


def _group_rank_size(group: dist.ProcessGroup | None) -> tuple[int, int]:
    if group is None:
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


class ColumnParallelLinear(nn.Module):
    """y_r = x W_r^T + b_r: this rank's slice of the output features (Megatron eq. 3).

    `enter_region=True` applies `enter_tp_region` to the input first (the LM head); q/k/v
    and up/gate leave that to their parent module so the region is entered once.
    """

    # Which dim of each single-device parameter is sliced across the TP group: the rows of
    # the weight and the bias entries are output features. (Checkpoint conversion reads it.)
    SPLIT_DIMS: ClassVar[dict[str, int]] = {"weight": 0, "bias": 0}
    # which features of its GEMM the TP group splits: an FP8 scale spanning them is
    # max-reduced over the group (`kernels.fp8.Fp8Gemm`)
    FP8_SPLIT: ClassVar[str] = "outputs"
    fp8: Fp8Gemm | None = None  # the matmul in FP8 (an FP8 policy: parallelize's fp8 step)

    def __init__(self, weight: nn.Parameter, bias: nn.Parameter | None,
                 group: dist.ProcessGroup | None, sequence_parallel: bool = False,
                 enter_region: bool = False) -> None:
        super().__init__()
        self.weight = weight
        self.bias = bias
        self.group = group
        self.sequence_parallel = sequence_parallel
        self.enter_region = enter_region
        # whether siblings sharing its input may run in one GEMM with it
        # (`kernels.linear.stackable`): only when the parent entered the TP region for them,
        # and the call is this class's own (a subclass's forward would be bypassed)
        self.stackable = not enter_region and type(self).forward is ColumnParallelLinear.forward
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]

    @classmethod
    def from_linear(cls, linear: nn.Linear, group: dist.ProcessGroup | None,
                    sequence_parallel: bool = False, enter_region: bool = False
                    ) -> ColumnParallelLinear:
        rank, size = _group_rank_size(group)
        weight = shard_parameter(linear.weight, cls.SPLIT_DIMS["weight"], rank, size)
        bias = (None if linear.bias is None
                else shard_parameter(linear.bias, cls.SPLIT_DIMS["bias"], rank, size))
        return cls(weight, bias, group, sequence_parallel, enter_region)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.enter_region:
            x = enter_tp_region(x, self.group, self.sequence_parallel)
        return linear(x, self.weight, self.bias, self.fp8)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features} (local), "
                f"bias={self.bias is not None}, enter_region={self.enter_region}")


class RowParallelLinear(nn.Module):
    """y = sum_r x_r W_r^T + b: input features sliced, partial sums reduced (Megatron eq. 3).

    The bias is replicated and added after the reduction (adding it per rank would count it
    tp times). With sequence parallelism it is added to a sequence shard, so its gradient is
    summed over the TP group.
    """

    SPLIT_DIMS: ClassVar[dict[str, int]] = {"weight": 1}  # input features; bias replicated
    FP8_SPLIT: ClassVar[str] = "inputs"  # as ColumnParallelLinear's
    fp8: Fp8Gemm | None = None

    def __init__(self, weight: nn.Parameter, bias: nn.Parameter | None,
                 group: dist.ProcessGroup | None, sequence_parallel: bool = False,
                 leave_region: bool = True) -> None:
        super().__init__()
        self.weight = weight
        self.bias = bias
        self.group = group
        self.sequence_parallel = sequence_parallel
        self.leave_region = leave_region
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        if sequence_parallel and bias is not None:  # added to this rank's tokens only
            mark_partial_grad(bias, group)

    @classmethod
    def from_linear(cls, linear: nn.Linear, group: dist.ProcessGroup | None,
                    sequence_parallel: bool = False, leave_region: bool = True
                    ) -> RowParallelLinear:
        rank, size = _group_rank_size(group)
        weight = shard_parameter(linear.weight, cls.SPLIT_DIMS["weight"], rank, size)
        return cls(weight, linear.bias, group, sequence_parallel, leave_region)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = linear(x, self.weight, fp8=self.fp8)
        if self.leave_region:  # else the parent sums the partial outputs (ExpertsRegion)
            y = leave_tp_region(y, self.group, self.sequence_parallel)
        if self.bias is None:
            return y
        return y + self.bias

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features} (local), out_features={self.out_features}, "
                f"bias={self.bias is not None}")


class VocabParallelEmbedding(nn.Module):
    """Rows [vocab_start, vocab_start + V/tp) of the token embedding on this rank.

    Tokens outside the range look up zeros; the sum over the TP group is then the full
    embedding (Megatron-LM, sec. 3, "input embedding weight matrix ... parallelized along
    the vocabulary dimension"): all-reduced, or reduce-scattered along the sequence when the
    blocks run sequence-parallel.
    """

    SPLIT_DIMS: ClassVar[dict[str, int]] = {"weight": 0}  # vocabulary rows

    def __init__(self, weight: nn.Parameter, vocab_start: int, group: dist.ProcessGroup | None,
                 sequence_parallel: bool = False) -> None:
        super().__init__()
        self.weight = weight
        self.vocab_start = vocab_start
        self.group = group
        self.sequence_parallel = sequence_parallel

    @classmethod
    def from_embedding(cls, embedding: nn.Embedding, group: dist.ProcessGroup | None,
                       sequence_parallel: bool = False) -> VocabParallelEmbedding:
        rank, size = _group_rank_size(group)
        weight = shard_parameter(embedding.weight, cls.SPLIT_DIMS["weight"], rank, size)
        return cls(weight, rank * weight.shape[0], group, sequence_parallel)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        local = idx - self.vocab_start
        outside = (local < 0) | (local >= self.weight.shape[0])
        rows = embedding(local.masked_fill(outside, 0), self.weight)
        rows = rows.masked_fill(outside.unsqueeze(-1), 0.0)
        return leave_tp_region(rows, self.group, self.sequence_parallel)

    def extra_repr(self) -> str:
        return (f"rows={self.vocab_start}..{self.vocab_start + self.weight.shape[0]}, "
                f"dim={self.weight.shape[1]}")


class SequenceParallelNorm(nn.Module):
    """LayerNorm or RMSNorm on this rank's sequence shard, with the same parameters.

    Each rank normalises only its tokens (Korthikanti et al. 2022, sec. 4.2.2), so the
    weight's (and bias's) gradient is summed over the TP group to equal the single-device one,
    once a step by the engine (`tensor_parallel.partial`).
    """

    def __init__(self, norm: nn.LayerNorm | nn.RMSNorm, group: dist.ProcessGroup | None
                 ) -> None:
        super().__init__()
        self.is_layer_norm = isinstance(norm, nn.LayerNorm)
        self.normalized_shape = tuple(norm.normalized_shape)
        self.eps = norm.eps
        self.weight = norm.weight
        self.bias = getattr(norm, "bias", None)
        self.group = group
        for param in (self.weight, self.bias):
            if param is not None:
                mark_partial_grad(param, group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.is_layer_norm:
            return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return F.rms_norm(x, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        kind = "LayerNorm" if self.is_layer_norm else "RMSNorm"
        return f"{kind}{self.normalized_shape}, eps={self.eps}, sequence-parallel"


class SequenceShardedPositions(nn.Module):
    """Learned positions for this rank's sequence shard only (GPT-2 with SP).

    The model asks for positions 0..S-1; with the hidden states split along the sequence,
    this rank adds rows [rank*S/tp, (rank+1)*S/tp). The table stays replicated; each rank's
    gradient touches only its rows, so it is summed over the TP group (once a step, by the
    engine: `tensor_parallel.partial`).
    """

    def __init__(self, embedding: nn.Embedding, group: dist.ProcessGroup | None) -> None:
        super().__init__()
        self.weight = embedding.weight
        self.group = group
        mark_partial_grad(self.weight, group)

    def forward(self, positions: torch.Tensor) -> torch.Tensor:
        rank, size = _group_rank_size(self.group)
        if positions.shape[-1] % size:
            raise ParaxisError(f"sequence parallelism needs the sequence length "
                               f"({positions.shape[-1]}) divisible by tp ({size})")
        mine = positions.chunk(size, dim=-1)[rank]
        return F.embedding(mine, self.weight)
