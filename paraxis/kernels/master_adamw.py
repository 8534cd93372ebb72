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

It steps flat ranges (the units of `engine.data_parallel.masters`, which it hands
MASTER_UNITS_A_CALL at a time): each unit's masters, moments and 16-bit parameters as flat
tensors of one length, the weight-decayed elements first (`decayed` of them: units put their
matrices first, `FlatUnit`). Compiled on CUDA, a unit's update is one generated kernel, and
a graph launches eight units' kernels a call; elsewhere (a CPU) torch's fused kernel runs on
an fp32 copy of a unit's gradient at a time and the 16-bit parameters are written after.
The formula is torch's fused AdamW's, in its order (decoupled decay, then the moments, then
the bias-corrected step); `grad_scale` divides the gradient (clipping, fp16's unscaling) and
a non-zero `found_inf` leaves every tensor as it was, as the fused kernel does.
"""

from __future__ import annotations

import functools

import torch

from paraxis.spec.precision import MASTER_UNITS_A_CALL


def _update(master: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
            param: torch.Tensor, grad: torch.Tensor, decayed: torch.Tensor, lr: torch.Tensor,
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
    """The same step uncompiled: torch's fused AdamW kernel on an fp32 copy of each unit's
    gradient, its decayed range and the rest apart, then the 16-bit parameters from the
    masters (op by op, the one-pass expressions would make a dozen passes over fp32
    temporaries)."""
    for master, grad, exp_avg, exp_avg_sq, n in zip(masters, grads, exp_avgs, exp_avg_sqs,
                                                    decayed, strict=True):
        fp32 = grad.float()  # one unit's copy at a time
        for part, decay in ((slice(0, n), weight_decay), (slice(n, None), 0.0)):
            torch._fused_adamw_([master[part]], [fp32[part]], [exp_avg[part]],
                                [exp_avg_sq[part]], [], [step], lr=lr, beta1=beta1,
                                beta2=beta2, weight_decay=decay, eps=eps, amsgrad=False,
                                maximize=False, grad_scale=grad_scale, found_inf=found_inf)
        del fp32  # before the next unit's copy exists
    torch._foreach_copy_(params, masters)


@functools.cache
def _compiled(beta1: float, beta2: float, eps: float, weight_decay: float) -> object:
    """`MASTER_UNITS_A_CALL` units' steps in one compiled call, the hyperparameters constants of
    the graph. Every call has the same number of units (`_calls` pads the last) and each
    unit's decayed length is a tensor, not an int the compiler would specialise where it is
    0 or 1, so a model's units take a graph or a few (which of them have equal lengths, or
    one element, still tells graphs apart). A process that builds many engines (a test
    session) can pass torch.compile's recompile limit: without `fullgraph` the calls past
    it run the same expressions uncompiled, where `fullgraph` would stop the run."""

    def update(masters: list[torch.Tensor], exp_avgs: list[torch.Tensor],
               exp_avg_sqs: list[torch.Tensor], params: list[torch.Tensor],
               grads: list[torch.Tensor], decayed: list[torch.Tensor], lr: torch.Tensor,
               step: torch.Tensor, grad_scale: torch.Tensor, found_inf: torch.Tensor) -> None:
        for unit in zip(masters, exp_avgs, exp_avg_sqs, params, grads, decayed, strict=True):
            _update(*unit, lr, beta1, beta2, eps, weight_decay, step, grad_scale, found_inf)

    # dynamic: one graph for every unit's length
    return torch.compile(update, dynamic=True)


@functools.cache
def _on_device(value: int, device: torch.device, slot: int) -> torch.Tensor:
    """`value` as a 0-d tensor on `device` for `slot` of a call, made once (a unit's decayed
    length). A tensor a slot: one tensor in two slots of a call would be a different graph
    (the compiler dedupes its inputs), as would one idle unit stepped twice."""
    return torch.tensor(value, device=device)


@functools.cache
def _idle_unit(device: torch.device, dtype: torch.dtype, grad_dtype: torch.dtype,
               slot: int) -> tuple[torch.Tensor, ...]:
    """A unit of two elements that nothing reads, stepped in `slot` of a call that has
    fewer units than `MASTER_UNITS_A_CALL`."""
    return (torch.zeros(2, device=device), torch.zeros(2, device=device),
            torch.zeros(2, device=device), torch.zeros(2, dtype=dtype, device=device),
            torch.zeros(2, dtype=grad_dtype, device=device))


def _calls(units: tuple[list, ...], decayed: list[int]) -> list[tuple[list, ...]]:
    """The units `MASTER_UNITS_A_CALL` to a call, the last padded with idle units, each with its
    decayed length as a tensor."""
    masters, params, grads = units[0], units[3], units[4]
    device = masters[0].device
    calls = []
    for start in range(0, len(masters), MASTER_UNITS_A_CALL):
        call = [[] for _ in range(len(units) + 1)]
        for slot in range(MASTER_UNITS_A_CALL):
            index = start + slot
            if index < len(masters):
                tensors, boundary = [each[index] for each in units], decayed[index]
            else:
                tensors, boundary = _idle_unit(device, params[0].dtype, grads[0].dtype,
                                               slot), 0
            for each, tensor in zip(call, [*tensors, _on_device(boundary, device, slot)],
                                    strict=True):
                each.append(tensor)
        calls.append(tuple(call))
    return calls


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
    is one generated kernel, launched `MASTER_UNITS_A_CALL` units a call of the graph (a compiled
    call costs the host tens of microseconds before its first kernel: once a unit, that
    would be most of a small unit's step)."""
    scalars = (lr, step, grad_scale, found_inf)
    if not (masters[0].is_cuda if compiled is None else compiled):
        _update_in_passes(masters, exp_avgs, exp_avg_sqs, params, grads, decayed, *scalars,
                          beta1, beta2, eps, weight_decay)
        return
    update = _compiled(beta1, beta2, eps, weight_decay)
    for call in _calls((masters, exp_avgs, exp_avg_sqs, params, grads), decayed):
        update(*call, *scalars)
