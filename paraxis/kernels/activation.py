"""SwiGLU's activation, silu(gate) * up, keeping only its two inputs for the backward.

Written as `F.silu(gate) * up`, eager autograd keeps gate (for silu's backward), silu(gate)
and up (for the product's): with gate and up one GEMM's output (`kernels.linear.project`),
that output and a third tensor of the MLP's width, per layer, for the whole forward. Here
the backward recomputes silu(gate) from gate, one elementwise pass, so a SwiGLU MLP keeps
gate and up and the product the down projection reads: 6sbf bytes in 16 bits, what
`plan.activations` prices (Megatron-LM's fused SwiGLU keeps the same). The gradients are
autograd's own, bit for bit: the same kernels on the same operands. Compiled, the
expression is left to the compiler, whose partitioner makes that choice itself.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd.function import FunctionCtx


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx: FunctionCtx, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx: FunctionCtx, grad: torch.Tensor
                 ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        gate, up = ctx.saved_tensors
        grad_gate = grad_up = None
        if ctx.needs_input_grad[1]:
            grad_up = grad * F.silu(gate)
        if ctx.needs_input_grad[0]:
            grad_gate = torch.ops.aten.silu_backward(grad * up, gate)
        return grad_gate, grad_up


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up; eager, silu(gate) is not kept for the backward but recomputed."""
    if torch.compiler.is_compiling():
        return F.silu(gate) * up
    return _SwiGLU.apply(gate, up)
