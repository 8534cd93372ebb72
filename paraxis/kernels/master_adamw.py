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

It works on one flat range at a time (a unit of `engine.data_parallel.masters`): masters,
moments and the 16-bit parameters as flat tensors of one length, the weight-decayed elements
first (`decayed` of them: units put their matrices first, `FlatUnit`). Compiled on CUDA,
the whole update is one generated kernel; elsewhere (a CPU) torch's fused kernel runs on an
fp32 copy of the gradient and the 16-bit parameter is written after it.
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


def _update_in_passes(master: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                      param: torch.Tensor, grad: torch.Tensor, decayed: int, lr: torch.Tensor,
                      beta1: float, beta2: float, eps: float, weight_decay: float,
                      step: torch.Tensor, grad_scale: torch.Tensor,
                      found_inf: torch.Tensor) -> None:
    """The same step uncompiled: torch's fused AdamW kernel on an fp32 copy of the gradient,
    the decayed range and the rest apart, then the 16-bit parameter from the master (op by
    op, the one-pass expressions would make a dozen passes over fp32 temporaries)."""
    g = grad.float()
    for part, decay in ((slice(0, decayed), weight_decay), (slice(decayed, None), 0.0)):
        torch._fused_adamw_([master[part]], [g[part]], [exp_avg[part]], [exp_avg_sq[part]],
                            [], [step], lr=lr, beta1=beta1, beta2=beta2, weight_decay=decay,
                            eps=eps, amsgrad=False, maximize=False, grad_scale=grad_scale,
                            found_inf=found_inf)
    param.copy_(master)


@functools.cache
def _compiled() -> object:
    # dynamic: one graph for every unit's length and split
    return torch.compile(_update, dynamic=True, fullgraph=True)


def master_adamw_(master: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                  param: torch.Tensor, grad: torch.Tensor, decayed: int, lr: torch.Tensor,
                  beta1: float, beta2: float, eps: float, weight_decay: float,
                  step: torch.Tensor, grad_scale: torch.Tensor, found_inf: torch.Tensor,
                  compiled: bool | None = None) -> None:
    """One AdamW step of flat fp32 `master` (with its moments) from the 16-bit `grad`,
    writing the rounded result to the 16-bit `param` too. `lr`, `step` (already counting
    this step), `grad_scale` and `found_inf` are 0-d fp32 tensors on the masters' device, so
    a new learning rate or step runs the same compiled kernel. `compiled`: by default on
    CUDA."""
    run = _compiled() if (master.is_cuda if compiled is None else compiled) \
        else _update_in_passes
    run(master, exp_avg, exp_avg_sq, param, grad, decayed, lr, beta1, beta2, eps,
        weight_decay, step, grad_scale, found_inf)
