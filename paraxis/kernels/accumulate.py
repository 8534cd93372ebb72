"""A GEMM added into an accumulator, as one operator the compiler keeps in its place.

The fused LM head and loss (`parallel.tensor.cross_entropy.linear_cross_entropy`) sums each
chunk of tokens' share of the head's weight gradient, a vocabulary x width GEMM, into one
fp32 tensor. Written as `acc += (a @ b).float()`, compiled on CUDA, inductor fused the adds
of every chunk into one pass at the end, so each chunk's GEMM output stayed alive until the
last one existed: for Llama 3's 128256 x 4096 head and 16 chunks, sixteen 1,002 MiB bf16
buffers at once. As a custom operator that mutates its accumulator, each chunk's product is
added in turn, eager and compiled.

Where the GEMM can add into the accumulator itself (`beta = 1`), no product is made: the
same dtype anywhere, and on CUDA an fp32 sum of bf16 or fp16 products, which cuBLAS adds in
its epilogue from its fp32 accumulators (Megatron-LM's gradient-accumulation fusion does
the same for every weight). Added as a separate pass instead, each chunk's product is
written, read back and the sum read and written: on the Llama slice's head, 6 GiB of memory
traffic a chunk against 4 GiB in the epilogue.
"""

from __future__ import annotations

import torch

_EPILOGUE_INPUTS = (torch.bfloat16, torch.float16)  # CUDA's out_dtype GEMMs take these
# torch's addmm with an out_dtype (a recent release's, NVIDIA's cuBLAS; not ROCm's)
_EPILOGUE = hasattr(torch.ops.aten.addmm, "dtype_out") and torch.version.hip is None


@torch.library.custom_op("paraxis::add_matmul_", mutates_args=("acc",))
def add_matmul_(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """acc += a @ b, summed in acc's dtype: in the GEMM's epilogue where it can, else the
    product in a's dtype, then added."""
    if acc.dtype == a.dtype:
        acc.addmm_(a, b)
    elif (_EPILOGUE and acc.is_cuda and acc.dtype == torch.float32
          and a.dtype in _EPILOGUE_INPUTS):
        torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
    else:
        acc.add_(a @ b)


@add_matmul_.register_fake
def _(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    return None
