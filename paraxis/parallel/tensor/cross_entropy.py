"""Cross-entropy over vocab-parallel logits, without ever gathering the full logits.

Each rank holds logits for its vocab slice [start, start + V/tp) of every token. Softmax
cross-entropy needs three per-token numbers that are sums or maxima over the vocabulary,
so three all-reduces of (tokens,) vectors replace an all-gather of (tokens, V) logits
(Megatron-LM, Shoeybi et al. 2019, sec. 3, "fuse the output of the parallel GEMM with the
cross entropy loss"):

    m      = max_v z_v                 (all-reduce MAX; for numerical stability)
    s      = sum_v exp(z_v - m)        (all-reduce SUM)
    z_t    = z_target - m              (all-reduce SUM; only the owning rank contributes)
    loss   = log s - z_t
    dloss/dz_v = softmax_v - [v == target]   (local to the shard: no backward comm)

The backward keeps the logits in their own dtype and one log-sum-exp per token; the fp32
softmax exists a chunk of tokens at a time (`paraxis.spec.kernels`, what the planner prices).
Compiled (`--compile`), the same formulas are written as whole-tensor expressions instead,
which the compiler fuses into one pass over the logits forward (the max apart) and one
backward, with no fp32 tensor of the logits' size in memory; eager, each of those would be a
separate fp32 pass, which the in-place chunks avoid.
Targets equal to IGNORE_INDEX (-100, as
F.cross_entropy; document packing masks targets so) count in neither the mean nor the
gradient.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd.function import FunctionCtx

from paraxis.dist.watchdog import WATCH
from paraxis.kernels.accumulate import add_matmul_
from paraxis.parallel.context.packing import IGNORE_INDEX
from paraxis.parallel.tensor.comm import eager_collective
from paraxis.parallel.tensor.counter import record
from paraxis.spec.kernels import chunk_rows


@eager_collective  # compiled with the head, its collectives stay eager too
def _all_reduce(x: torch.Tensor, group: dist.ProcessGroup | None,
                op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> None:
    if group is not None:
        record("all_reduce", x.numel() * x.element_size(), "forward", "loss")
        with WATCH.waiting("all_reduce", group):
            dist.all_reduce(x, op=op, group=group)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx: FunctionCtx, logits: torch.Tensor, targets: torch.Tensor,
                group: dist.ProcessGroup | None, overwrite: bool) -> torch.Tensor:
        ctx.overwrite = overwrite
        rank = 0 if group is None else dist.get_rank(group)
        shard_width = logits.shape[-1]
        z = logits.reshape(-1, shard_width)  # in its own dtype: no fp32 copy of the whole
        targets = targets.reshape(-1)
        peak = z.amax(dim=-1).float()  # exact in any dtype: a max rounds nothing
        _all_reduce(peak, group, dist.ReduceOp.MAX)

        local = targets - rank * shard_width
        elsewhere = (local < 0) | (local >= shard_width)
        local = local.masked_fill(elsewhere, 0)
        target_logit = z.gather(1, local.unsqueeze(-1)).squeeze(-1).float() - peak
        target_logit = target_logit.masked_fill(elsewhere, 0.0)

        if torch.compiler.is_compiling():  # one fused reduction: no fp32 chunk exists
            sum_exp = torch.exp(z.float() - peak.unsqueeze(-1)).sum(dim=-1)
        else:
            sum_exp = torch.empty_like(peak)
            for rows in _chunks(z):  # the fp32 exponentials a chunk at a time
                sum_exp[rows] = _minus(z[rows], peak[rows]).exp_().sum(dim=-1)
        # The two sums travel in one all-reduce: one latency instead of two.
        sums = torch.stack((target_logit, sum_exp))
        _all_reduce(sums, group)
        target_logit, sum_exp = sums[0], sums[1]

        log_sum_exp = sum_exp.log()
        losses = log_sum_exp - target_logit
        # The mean over counted targets, computed on the device whether or not any target
        # is ignored: asking first (`ignored.any()`) would stop the host every microbatch.
        ignored = targets == IGNORE_INDEX
        counted = (~ignored).float().unsqueeze(-1)
        count = counted.sum()  # none kept: 0 / 0 = NaN, as F.cross_entropy's mean
        # for the backward: the logits as they came, and the whole vocabulary's log-sum-exp
        ctx.save_for_backward(logits, log_sum_exp.add_(peak), local, elsewhere, counted)
        return losses.masked_fill(ignored, 0.0).sum() / count

    @staticmethod
    def backward(ctx: FunctionCtx, grad: torch.Tensor
                 ) -> tuple[torch.Tensor, None, None, None]:
        logits, log_sum_exp, local, elsewhere, counted = ctx.saved_tensors
        z = logits.reshape(-1, logits.shape[-1])
        # d(mean)/d(token loss): 1 / counted tokens; ignored rows get no gradient (also when
        # none counts: 0, as F.cross_entropy's, where 0 / 0 would make every gradient NaN)
        scale = counted * (grad / counted.sum().clamp(min=1))
        here = ~elsewhere  # the rows whose target is in this rank's slice
        if torch.compiler.is_compiling():  # one fused pass: logits in, gradient out
            grad_logits = _logits_grad(z, log_sum_exp, local, here, scale)
            return grad_logits.view(logits.shape), None, None, None
        # a chunk at a time; over the logits themselves where they are the model's own,
        # which nothing reads after the loss: one logits-sized tensor instead of two
        grad_logits = z if ctx.overwrite else torch.empty_like(z)
        for rows in _chunks(z):
            _logits_grad(z[rows], log_sum_exp[rows], local[rows], here[rows], scale[rows],
                         out=grad_logits[rows])
        return grad_logits.view(logits.shape), None, None, None


def _logits_grad(z: torch.Tensor, log_sum_exp: torch.Tensor, local: torch.Tensor,
                 here: torch.Tensor, scale: torch.Tensor, out: torch.Tensor | None = None
                 ) -> torch.Tensor:
    """d(loss)/d(z) = (softmax(z) - one-hot of `local` on the rows `here`) x `scale`, in z's
    dtype. Compiled: one expression the compiler fuses into a pass over z. Eager: through one
    fp32 workspace of z's size, written into `out` as it is cast (`out` may be z itself)."""
    if torch.compiler.is_compiling():
        columns = torch.arange(z.shape[-1], device=z.device)
        one_hot = (columns == local.unsqueeze(-1)) & here.unsqueeze(-1)
        softmax = torch.exp(z.float() - log_sum_exp.unsqueeze(-1))
        return ((softmax - one_hot.float()) * scale).to(z.dtype)
    softmax = _minus(z, log_sum_exp).exp_()
    softmax[torch.arange(softmax.shape[0], device=softmax.device), local] -= \
        here.to(softmax.dtype)
    return torch.mul(softmax, scale, out=torch.empty_like(z) if out is None else out)


def _chunks(z: torch.Tensor) -> list[slice]:
    """The row slices of (tokens, width) logits, a chunk's fp32 workspace each."""
    return _chunks_of(z.shape[0], z.shape[-1])


def _minus(z: torch.Tensor, per_row: torch.Tensor) -> torch.Tensor:
    """z - per_row[:, None] as a new fp32 chunk, read from z in its own dtype in one pass
    (fp32 `per_row` promotes the result): the workspace, free to change in place."""
    return torch.sub(z, per_row.unsqueeze(-1))


def vocab_parallel_cross_entropy(logits: torch.Tensor, targets: torch.Tensor,
                                 group: dist.ProcessGroup | None, overwrite: bool = False
                                 ) -> torch.Tensor:
    """Mean next-token loss from this rank's (..., V/tp) logits; the same on every TP rank.
    With `group` None, the plain cross entropy of one device's full logits. `overwrite`:
    the backward writes the logits' gradient over the logits (eager), for a caller that
    made them for the loss alone and reads them no more."""
    return _VocabParallelCrossEntropy.apply(logits, targets, group, overwrite)


class VocabParallelCrossEntropy(nn.Module):
    """Mean next-token loss over the targets not IGNORE_INDEX (-100, F.cross_entropy's
    default: packing masks targets so), from (..., V/tp) logits; with `group` None, one
    device's whole vocabulary (paraxis.model.transformer's loss). The model's head makes
    the logits for it alone, so their gradient is written over them."""

    def __init__(self, group: dist.ProcessGroup | None) -> None:
        super().__init__()
        self.group = group

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return vocab_parallel_cross_entropy(logits, targets, self.group, overwrite=True)


class _LinearCrossEntropy(torch.autograd.Function):
    """The mean cross entropy of x W^T without the logits: the loss and both gradients
    computed together in forward, a chunk of tokens at a time."""

    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor, weight: torch.Tensor,
                targets: torch.Tensor) -> torch.Tensor:
        ignored = targets == IGNORE_INDEX
        counted = (~ignored).float().unsqueeze(-1)
        local = targets.masked_fill(ignored, 0)
        kept = saved_dtype(x.dtype)
        losses, grads_x = [], []
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        every = torch.ones_like(ignored)  # every target is in the one whole vocabulary
        for rows in _chunks_of(x.shape[0], weight.shape[0]):
            # Each chunk's gradients of the summed token losses: what d(mean) adds, 1 / the
            # count, is applied to their sums below. The count reduces every target, and a
            # chunk that waited for it would keep its logits until then: compiled, the count
            # fuses into the last chunk's pass, so every chunk's logits were alive at once.
            loss, grad_logits = _chunk_loss(x[rows] @ weight.t(), local[rows], every[rows],
                                            counted[rows])
            losses.append(loss)
            grads_x.append((grad_logits @ weight).to(kept))
            add_matmul_(grad_w, grad_logits.t(), x[rows])  # added in turn, in place
            del grad_logits  # before the next chunk's logits exist
        # 0 / 0 = NaN with nothing counted, as F.cross_entropy's mean; the gradients are 0
        total = counted.sum()
        inverse = 1 / total.clamp(min=1)
        grad_x = torch.cat(grads_x)
        del grads_x  # the chunks' parts, before the cast below adds a weight-sized copy
        # scaled in place: a second fp32 vocabulary x width tensor would be 2 GB on Llama 3
        ctx.save_for_backward(grad_x.mul_(inverse), grad_w.mul_(inverse).to(kept))
        ctx.dtypes = x.dtype, weight.dtype
        return torch.cat(losses).masked_fill(ignored, 0.0).sum() / total

    @staticmethod
    def backward(ctx: FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                                 None]:
        grad_x, grad_w = ctx.saved_tensors
        x_dtype, w_dtype = ctx.dtypes
        # the loss's gradient (fp32: 1 / microbatches, times fp16's loss scale) multiplied
        # as it is, not rounded to the gradients' dtype first
        return (grad_x * grad).to(x_dtype), (grad_w * grad).to(w_dtype), None


def saved_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the fused loss keeps dL/dx and dL/dW in until its backward: the compute
    dtype's, but fp32 for fp16, whose range cannot hold them before the loss scale reaches
    them (`spec.kernels.fused_loss_bytes` prices the same)."""
    return torch.float32 if dtype == torch.float16 else dtype


def _chunk_loss(logits: torch.Tensor, local: torch.Tensor, here: torch.Tensor,
                scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk's token losses (fp32) and d(mean loss)/d(logits) in the logits' dtype
    (`_logits_grad`, written over the logits eager)."""
    target = logits.gather(1, local.unsqueeze(-1)).squeeze(-1).float()
    if torch.compiler.is_compiling():
        log_sum_exp = torch.logsumexp(logits.float(), dim=-1)
    else:
        peak = logits.amax(dim=-1).float()
        log_sum_exp = _minus(logits, peak).exp_().sum(dim=-1).log_().add_(peak)
    return log_sum_exp - target, _logits_grad(logits, log_sum_exp, local, here, scale,
                                              out=logits)


def _chunks_of(rows: int, width: int) -> list[slice]:
    """Slices of `rows` tokens with `width` logits each, `spec.kernels.chunk_rows` a slice."""
    step = chunk_rows(width)
    return [slice(start, min(start + step, rows)) for start in range(0, rows, step)]


def linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor
                         ) -> torch.Tensor:
    """Mean next-token loss of the logits x W^T (one device's whole vocabulary; targets
    IGNORE_INDEX count in neither the mean nor the gradient), the logits never made whole:
    per chunk of tokens their logits, loss and gradient, and that chunk's share of dL/dx and
    dL/dW, so at the loss the step holds dL/dx and an fp32 dL/dW instead of the logits and
    their gradient (Liger-Kernel's fused linear cross entropy, Hsu et al. 2024). The GEMMs
    run in autocast's dtype where it is on, as `F.linear` would."""
    kind = x.device.type
    dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else x.dtype
    with torch.autocast(kind, enabled=False):
        rows, weight, targets = x.reshape(-1, x.shape[-1]).to(dtype), weight.to(dtype), \
            targets.reshape(-1)
        if torch.is_grad_enabled() and (rows.requires_grad or weight.requires_grad):
            return _LinearCrossEntropy.apply(rows, weight, targets)
        return _loss_only(rows, weight, targets)


def _loss_only(x: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """`linear_cross_entropy` where no gradient is wanted (evaluation): a chunk's logits at a
    time, no dL/dx nor dL/dW computed."""
    ignored = targets == IGNORE_INDEX
    local = targets.masked_fill(ignored, 0)
    losses = []
    for rows in _chunks_of(x.shape[0], weight.shape[0]):
        logits = x[rows] @ weight.t()
        target = logits.gather(1, local[rows].unsqueeze(-1)).squeeze(-1).float()
        losses.append(torch.logsumexp(logits.float(), dim=-1) - target)
        del logits
    return torch.cat(losses).masked_fill(ignored, 0.0).sum() / (~ignored).sum()
