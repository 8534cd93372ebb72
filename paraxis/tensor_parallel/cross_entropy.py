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

The largest tensor is one (tokens, V/tp) shard. Targets equal to IGNORE_INDEX (-100, as
F.cross_entropy; document packing masks targets so) count in neither the mean nor the
gradient.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd.function import FunctionCtx

from paraxis.packing import IGNORE_INDEX
from paraxis.runtime.watchdog import WATCH
from paraxis.tensor_parallel.counter import record


def _all_reduce(x: torch.Tensor, group: dist.ProcessGroup | None,
                op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> None:
    if group is not None:
        record("all_reduce", x.numel() * x.element_size(), "forward", "loss")
        with WATCH.waiting("all_reduce", group):
            dist.all_reduce(x, op=op, group=group)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx: FunctionCtx, logits: torch.Tensor, targets: torch.Tensor,
                group: dist.ProcessGroup | None) -> torch.Tensor:
        rank = 0 if group is None else dist.get_rank(group)
        shard_width = logits.shape[-1]
        z = logits.reshape(-1, shard_width)
        targets = targets.reshape(-1)
        peak = z.max(dim=-1).values
        _all_reduce(peak, group, dist.ReduceOp.MAX)
        shifted = z - peak.unsqueeze(-1)  # the one (tokens, V/tp) temporary

        local = targets - rank * shard_width
        elsewhere = (local < 0) | (local >= shard_width)
        local = local.masked_fill(elsewhere, 0)
        target_logit = shifted.gather(1, local.unsqueeze(-1)).squeeze(-1)
        target_logit = target_logit.masked_fill(elsewhere, 0.0)

        probs = shifted.exp_()  # in place: `shifted` is not needed any more
        sum_exp = probs.sum(dim=-1)
        # The two sums travel in one all-reduce: one latency instead of two.
        sums = torch.stack((target_logit, sum_exp))
        _all_reduce(sums, group)
        target_logit, sum_exp = sums[0], sums[1]

        probs.div_(sum_exp.unsqueeze(-1))  # softmax over the whole vocabulary, this slice
        losses = sum_exp.log() - target_logit
        # The mean over counted targets, computed on the device whether or not any target
        # is ignored: asking first (`ignored.any()`) would stop the host every microbatch.
        ignored = targets == IGNORE_INDEX
        ctx.counted = (~ignored).to(probs.dtype).unsqueeze(-1)
        count = ctx.counted.sum()  # none kept: 0 / 0 = NaN, as F.cross_entropy's mean
        ctx.save_for_backward(probs, local, elsewhere)
        ctx.logits_shape = logits.shape
        return losses.masked_fill(ignored, 0.0).sum() / count

    @staticmethod
    def backward(ctx: FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        probs, local, elsewhere = ctx.saved_tensors
        grad_logits = probs.clone()
        rows = torch.arange(grad_logits.shape[0], device=grad_logits.device)
        grad_logits[rows, local] -= (~elsewhere).to(grad_logits.dtype)
        # d(mean)/d(token loss): 1 / counted tokens; ignored rows get no gradient (also when
        # none counts: 0, as F.cross_entropy's, where 0 / 0 would make every gradient NaN)
        grad_logits.mul_(ctx.counted * (grad / ctx.counted.sum().clamp(min=1)))
        return grad_logits.view(ctx.logits_shape), None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, targets: torch.Tensor,
                                 group: dist.ProcessGroup | None) -> torch.Tensor:
    """Mean next-token loss from this rank's (..., V/tp) logits; the same on every TP rank."""
    return _VocabParallelCrossEntropy.apply(logits.float(), targets, group)


class VocabParallelCrossEntropy(nn.Module):
    """Drop-in for `paraxis.model.CrossEntropy` when the LM head is vocab-parallel."""

    def __init__(self, group: dist.ProcessGroup | None) -> None:
        super().__init__()
        self.group = group

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return vocab_parallel_cross_entropy(logits, targets, self.group)
