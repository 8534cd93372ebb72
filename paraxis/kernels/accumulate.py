"""A GEMM added into an accumulator, as one operator the compiler keeps in its place.

The fused LM head and loss (`parallel.tensor.cross_entropy.linear_cross_entropy`) sums each
chunk of tokens' share of the head's weight gradient, a vocabulary x width GEMM, into one
fp32 tensor. Written as `acc += (a @ b).float()`, compiled on CUDA, inductor fused the adds
of every chunk into one pass at the end, so each chunk's GEMM output stayed alive until the
last one existed: for Llama 3's 128256 x 4096 head and 16 chunks, sixteen 1,002 MiB bf16
buffers at once. As a custom operator that mutates its accumulator, each chunk's product is
made, added and freed in turn, eager and compiled, with the same rounding (the product in
the inputs' dtype, summed in the accumulator's).
"""

from __future__ import annotations

import torch


@torch.library.custom_op("paraxis::add_matmul_", mutates_args=("acc",))
def add_matmul_(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """acc += a @ b, the product in a's dtype and the sum in acc's."""
    acc.add_(a @ b)


@add_matmul_.register_fake
def _(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    return None
