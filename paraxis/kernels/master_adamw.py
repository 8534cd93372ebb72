"""AdamW on the fp32 masters of 16-bit parameters in one pass over memory.

torch's fused AdamW steps tensors of one dtype: with bf16 parameters and fp32 masters the
step around it is three passes, the gradients cast to an fp32 copy (read 2 bytes a
parameter, write 4), the kernel (read master, gradient and both moments, 16 bytes; write
master, moments and the unscaled gradient, 16) and the write-back of the rounded masters
(read 4, write 2): 44 bytes a parameter. `master_adamw_` reads the 16-bit gradient and
writes the 16-bit parameter in the same pass as the rest: 2 + 12 bytes read, 12 + 2
written, 28 (Megatron-LM's and Transformer Engine's fused Adam with master weights do the
same); on one GPU, where the gradients are the parameters' own, 4 more for those gathered
into one flat copy first (the parameters that share a unit). On the Llama 3 8B slice's 2.8
billion parameters, most of them in matrices alone in their units, that is about 16 bytes a
parameter, 45 GB of memory traffic a step.

It steps flat ranges (the units of `engine.data_parallel.masters`), all of them in one
call: each unit's masters, moments and 16-bit parameters as flat tensors of one length, the
weight-decayed elements first (`decayed` of them: units put their matrices first,
`FlatUnit`). Compiled on CUDA, a unit's update is one generated kernel, and one graph
launches them all; elsewhere (a CPU) torch's fused kernel runs on fp32 copies of the
gradients and the 16-bit parameters are written after it.
The formula is torch's fused AdamW's, in its order (decoupled decay, then the moments, then
the bias-corrected step); `grad_scale` divides the gradient (clipping, fp16's unscaling) and
a non-zero `found_inf` leaves every tensor as it was, as the fused kernel does.
"""

from __future__ import annotations

import functools

import torch


def _update(master: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
            param: torch.Tensor, grad: torch.Tensor, decayed: int, lr: torch.Tensor,
            beta1: float, beta2: float, eps: float, weight_decay: float, step: torch.Tensor,
            grad_scale: torch.Tensor, found_inf: torch.Tensor) -> None:
    """The step as expressions the compiler fuses into one kernel: every value is read once
    and each output written once, the decay chosen by the element's index."""
    g = grad.float() / grad_scale
    index = torch.arange(master.numel(), device=master.device)
    decay = torch.where(index < decayed, lr * weight_decay, 0.0)
    p = master - decay * master
    m = beta1 * exp_avg + (1 - beta1) * g
    v = beta2 * exp_avg_sq + (1 - beta2) * g * g
    step64 = step.double()
    step_size = (lr.double() / (1 - beta1 ** step64)).float()
    bias_correction2_sqrt = (1 - beta2 ** step64).sqrt().float()
    p = p - step_size * m / (v.sqrt() / bias_correction2_sqrt + eps)
    keep = found_inf != 0
    p = torch.where(keep, master, p)
    master.copy_(p)
    exp_avg.copy_(torch.where(keep, exp_avg, m))
    exp_avg_sq.copy_(torch.where(keep, exp_avg_sq, v))
    param.copy_(p)


def _update_in_passes(masters: list[torch.Tensor], exp_avgs: list[torch.Tensor],
                      exp_avg_sqs: list[torch.Tensor], params: list[torch.Tensor],
                      grads: list[torch.Tensor], decayed: list[int], lr: torch.Tensor,
                      step: torch.Tensor, grad_scale: torch.Tensor, found_inf: torch.Tensor,
                      beta1: float, beta2: float, eps: float, weight_decay: float) -> None:
    """The same step uncompiled: torch's fused AdamW kernel on fp32 copies of the gradients,
    the decayed ranges and the rest apart, then the 16-bit parameters from the masters (op
    by op, the one-pass expressions would make a dozen passes over fp32 temporaries)."""
    flat = (masters, [grad.float() for grad in grads], exp_avgs, exp_avg_sqs)
    leading = [[t[:n] for t, n in zip(tensors, decayed, strict=True)] for tensors in flat]
    rest = [[t[n:] for t, n in zip(tensors, decayed, strict=True)] for tensors in flat]
    for parts, decay in ((leading, weight_decay), (rest, 0.0)):
        torch._fused_adamw_(*parts, [], [step] * len(masters), lr=lr, beta1=beta1,
                            beta2=beta2, weight_decay=decay, eps=eps, amsgrad=False,
                            maximize=False, grad_scale=grad_scale, found_inf=found_inf)
    torch._foreach_copy_(params, masters)


# Units a compiled call steps: each adds its kernel's code generation to the compile (about
# a second on a CPU), so a model of many units (a matrix larger than a gradient bucket is
# one alone: most of the Llama slice's) compiles one graph of eight and one of the rest,
# and launches its step in a few calls.
UNITS_A_CALL = 8


@functools.cache
def _compiled(beta1: float, beta2: float, eps: float, weight_decay: float) -> object:
    """Every unit's step in one compiled call, its hyperparameters constants of the graph."""

    def update(masters: list[torch.Tensor], exp_avgs: list[torch.Tensor],
               exp_avg_sqs: list[torch.Tensor], params: list[torch.Tensor],
               grads: list[torch.Tensor], decayed: list[int], lr: torch.Tensor,
               step: torch.Tensor, grad_scale: torch.Tensor, found_inf: torch.Tensor) -> None:
        for unit in zip(masters, exp_avgs, exp_avg_sqs, params, grads, decayed, strict=True):
            _update(*unit, lr, beta1, beta2, eps, weight_decay, step, grad_scale, found_inf)

    # dynamic: one graph for every unit's length and split
    return torch.compile(update, dynamic=True, fullgraph=True)


def master_adamw_(masters: list[torch.Tensor], exp_avgs: list[torch.Tensor],
                  exp_avg_sqs: list[torch.Tensor], params: list[torch.Tensor],
                  grads: list[torch.Tensor], decayed: list[int], lr: torch.Tensor,
                  beta1: float, beta2: float, eps: float, weight_decay: float,
                  step: torch.Tensor, grad_scale: torch.Tensor, found_inf: torch.Tensor,
                  compiled: bool | None = None) -> None:
    """One AdamW step of each flat fp32 master (with its moments) from its 16-bit gradient,
    writing the rounded result to its 16-bit parameter too; the first `decayed` elements of
    each are weight-decayed. `lr`, `step` (already counting this step), `grad_scale` and
    `found_inf` are 0-d fp32 tensors on the masters' device, so a new learning rate or step
    runs the same compiled kernels. `compiled`: by default on CUDA, where every unit's step
    is one generated kernel, launched `UNITS_A_CALL` units a call of the graph (a compiled
    call costs the host tens of microseconds before its first kernel: once a unit, that was
    most of a small unit's step)."""
    units = (masters, exp_avgs, exp_avg_sqs, params, grads, decayed)
    scalars = (lr, step, grad_scale, found_inf)
    if not (masters[0].is_cuda if compiled is None else compiled):
        _update_in_passes(*units, *scalars, beta1, beta2, eps, weight_decay)
        return
    update = _compiled(beta1, beta2, eps, weight_decay)
    for start in range(0, len(masters), UNITS_A_CALL):
        update(*(each[start:start + UNITS_A_CALL] for each in units), *scalars)
