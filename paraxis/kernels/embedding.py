"""The token embedding's lookup, with a backward the compiler keeps as one native kernel.

Compiled, torch's inductor decomposes the lookup's backward (`aten.embedding_dense_backward`)
into a zero table in the computation dtype, an accumulating scatter and a cast: for a 16-bit
table, a whole fp32 copy of it (vocabulary x width x 4 bytes, 2.1 GB for Llama 3's 128256 x
4096) alive beside the 16-bit gradient at the end of every backward. Here the backward is a
custom operator that the compiler calls as it is, the kernel eager PyTorch runs: the
gradient made in the table's own dtype (on CUDA, summed in fp32 per row of the batch's
tokens, not per row of the table), the same in eager and compiled steps. The forward stays
`F.embedding`, which the compiler fuses with what follows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor


@torch.library.custom_op("paraxis::embedding_backward", mutates_args=())
def embedding_backward(grad: torch.Tensor, ids: torch.Tensor, rows: int) -> torch.Tensor:
    """The gradient of a `rows`-row table looked up at `ids`, given the rows' gradient."""
    return torch.ops.aten.embedding_dense_backward(grad, ids, rows, -1, False)


@embedding_backward.register_fake
def _(grad: torch.Tensor, ids: torch.Tensor, rows: int) -> torch.Tensor:
    return grad.new_empty((rows, grad.shape[-1]))


class _Lookup(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(ids)
        ctx.rows = weight.shape[0]
        return F.embedding(ids, weight)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[None, torch.Tensor]:
        (ids,) = ctx.saved_tensors
        return None, embedding_backward(grad.contiguous(), ids, ctx.rows)


def embedding(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`F.embedding(ids, weight)`; compiled, its weight's gradient from `embedding_backward`
    (eager autograd runs that kernel already, without the custom function's Python). A
    DTensor table (PyTorch's tensor parallelism, which the CPU bench runs on this model)
    takes torch's own lookup: the custom operator has no sharding rule."""
    if not torch.compiler.is_compiling() or isinstance(weight, DTensor):
        return F.embedding(ids, weight)
    return _Lookup.apply(ids, weight)


class Embedding(nn.Embedding):
    """`nn.Embedding` (same parameter, same names) looked up through `embedding`."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return embedding(ids, self.weight)
