"""Several projections of one input as one GEMM, without keeping the stacked weight.

`torch.cat` of the weights followed by `F.linear` would run one GEMM, but autograd would
then keep the stacked copy until the backward: for q/k/v and gate/up that is most of a
block's weights again, per block, for the whole forward (and under ZeRO-3 it would undo the
point of freeing gathered weights). This function keeps the input and the weights
themselves, as separate linears do, and its backward never reads the forward's stacked
copy: with the copy there, torch.compile's partitioner would keep it from the forward for
the backward (it saves what a GEMM reads rather than recompute it), 2.1 GB over the 8
blocks of Llama 3 8B. The input's gradient is one GEMM per weight, summed, or, where
stacking the weights again moves fewer bytes than those sums (`_stacks_for_input_grad`:
q/k/v, whose weights are small beside the tokens' gradients), one GEMM over weights
stacked inside an operator the compiler calls as it is (`stacked_input_grad`), so that
nothing of it is saved from the forward.

Mixed precision follows autocast: the forward's `F.linear` runs under whatever autocast is
active, and the backward computes in the dtype the forward produced, casting each gradient
back to its tensor's own dtype (what autocast's casts do for separate linears).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd.function import FunctionCtx

from paraxis.kernels.grads import wanted


@torch.library.custom_op("paraxis::stacked_input_grad", mutates_args=())
def stacked_input_grad(grad: torch.Tensor, weights: list[torch.Tensor]) -> torch.Tensor:
    """grad [W_1; W_2; ...]: the input's gradient of a stacked projection, (rows, sum of
    the weights' rows) by the weights stacked here, in one GEMM."""
    return grad @ torch.cat(weights)


@stacked_input_grad.register_fake
def _(grad: torch.Tensor, weights: list[torch.Tensor]) -> torch.Tensor:
    return grad.new_empty((grad.shape[0], weights[0].shape[1]))


def _keep_operands(ctx: FunctionCtx, inputs: tuple, output: torch.Tensor) -> None:
    grad, weights = inputs
    ctx.save_for_backward(grad, *weights)


def _through_stacked_input_grad(ctx: FunctionCtx, upstream: torch.Tensor
                                ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Its own gradients, for a backward through the backward (`create_graph`): of
    grad S, upstream S^T for grad and grad^T upstream for the stacked S, in its rows."""
    grad, *weights = ctx.saved_tensors
    through_weights = (grad.t() @ upstream).split([w.shape[0] for w in weights])
    return upstream @ torch.cat(weights).t(), list(through_weights)


stacked_input_grad.register_autograd(_through_stacked_input_grad,
                                     setup_context=_keep_operands)


def _stacks_for_input_grad(widths: list[int], rows: int) -> bool:
    """Whether the input's gradient over `rows` tokens should stack weights `widths` rows
    each: stacking reads and writes every weight once (2 x their rows x the input's
    width), where one GEMM a weight adds each one's product into the sum so far, reading
    and writing the (rows, input width) sum once a weight after the first (and launches a
    GEMM a weight). GPT-2 124M's q/k/v at 8 x 1024 tokens: 2,304 rows stacked against
    2 x 8,192 summed; the Llama 3 8B's gate and up at 2 x 4096: 28,672 against 8,192."""
    return sum(widths) < (len(widths) - 1) * rows


class _Stacked(torch.autograd.Function):
    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor, *tensors_then_count: torch.Tensor | int
                ) -> torch.Tensor:
        # the count last: autograd's next_functions list the tensor inputs only, so the
        # tensors' positions are then the same there as in needs_input_grad
        *tensors, count = tensors_then_count
        weights, biases = tensors[:count], tensors[count:]
        out = F.linear(x, torch.cat(weights), torch.cat(biases) if biases else None)
        ctx.save_for_backward(x, *weights)
        ctx.count, ctx.compute_dtype = count, out.dtype
        ctx.bias_dtypes = [b.dtype for b in biases]
        return out

    @staticmethod
    def backward(ctx: FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        """The input's gradient and the weights' (and biases'), each only where this pass
        asks for it (`kernels.grads.wanted`: a split backward asks for them apart)."""
        x, *weights = ctx.saved_tensors
        dtype, count = ctx.compute_dtype, ctx.count
        widths = [w.shape[0] for w in weights]
        grad = grad.to(dtype)
        rows = grad.reshape(-1, grad.shape[-1])
        grad_x = None
        if wanted(ctx, 0) and _stacks_for_input_grad(widths, rows.shape[0]):
            grad_x = stacked_input_grad(rows, [w.to(dtype) for w in weights])
            grad_x = grad_x.reshape(x.shape).to(x.dtype)
        elif wanted(ctx, 0):  # one GEMM per weight on its columns of the gradient, summed
            parts = rows.split(widths, dim=1)
            grad_x = parts[0] @ weights[0].to(dtype)
            for part, weight in zip(parts[1:], weights[1:], strict=True):
                grad_x = torch.addmm(grad_x, part, weight.to(dtype))
            grad_x = grad_x.reshape(x.shape).to(x.dtype)
        grad_weights: list[torch.Tensor | None] = [None] * count
        if any(wanted(ctx, 1 + i) for i in range(count)):
            grad_weight = rows.t() @ x.reshape(-1, x.shape[-1]).to(dtype)
            grad_weights = [g.to(w.dtype) for g, w in zip(grad_weight.split(widths), weights,
                                                         strict=True)]
        grad_biases: list[torch.Tensor | None] = [None] * len(ctx.bias_dtypes)
        if any(wanted(ctx, 1 + count + i) for i in range(len(ctx.bias_dtypes))):
            grad_biases = [g.to(d) for g, d in zip(rows.sum(0).split(widths), ctx.bias_dtypes,
                                                  strict=True)]
        return grad_x, *grad_weights, *grad_biases, None


def stacked_linear(x: torch.Tensor, weights: list[torch.Tensor],
                   biases: list[torch.Tensor] | None = None) -> torch.Tensor:
    """x [W_1; W_2; ...]^T + [b_1; b_2; ...]: one GEMM, outputs side by side."""
    return _Stacked.apply(x, *weights, *(biases or []), len(weights))
