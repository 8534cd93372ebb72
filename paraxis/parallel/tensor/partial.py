"""Sequence parallelism's partial gradients: replicated parameters applied to sequence shards.

With SP each TP rank normalises only its own tokens, so the norms' weights and biases, the
row-parallel biases and learned positions (parameters every TP rank holds whole), and the
router and whole experts of a mixture of experts that runs on sequence shards
(`apply.WholeExperts`), get on each rank the gradient of its tokens only; the
single-device gradient is their sum over the TP group. The layers mark them
(`mark_partial_grad`), and the engine sums them once a step (`sum_partial_grads`, from
`DataParallelEngine.finish_grad_sync`).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from paraxis.dist.params import is_partial_over_tp
from paraxis.dist.watchdog import WATCH
from paraxis.parallel.tensor.counter import record
from paraxis.spec.units import DEFAULT_BUCKET_BYTES, runs_within


def mark_partial_grad(param: torch.Tensor, group: dist.ProcessGroup | None) -> None:
    """Mark a replicated parameter that sequence parallelism applies to this rank's tokens
    only (norm weights and biases, row-parallel biases, learned positions, whole experts on
    shards and their router): its gradient on
    each TP rank covers that rank's tokens, and the single-device gradient is their sum
    (Korthikanti et al. 2022, sec. 4.2.2). The engine sums them once a step with
    `sum_partial_grads` (`is_partial_over_tp`)."""
    if group is not None and dist.get_world_size(group) > 1:
        param.tp_partial_grad = True  # type: ignore[attr-defined]


def sum_partial_grads(grads: list[tuple[torch.Tensor, torch.Tensor | None]],
                      group: dist.ProcessGroup | None,
                      bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> None:
    """Sum over the TP group, in place and in one call per dtype (and bucket), the gradients of the
    parameters `mark_partial_grad` marked, given as (parameter, gradient) pairs (the others
    are passed over); call on every rank of the group with the same pairs, once a step after
    the data-parallel reduction (both are sums over disjoint ranks, so they commute, and the
    sum over microbatches is already in each gradient).

    Megatron-LM does the same in `finalize_model_grads` (one flattened all-reduce of the
    sequence-parallel parameters' gradients). paraxis first summed each parameter in its own
    backward: one call per parameter per microbatch, 52 a step on the first rank of tiny at
    tp=4, pp=2, 4 microbatches, beside SP's own 72 all-gathers and reduce-scatters
    (`python -m tools.probes.sp_grad_sums` counts them). The calls carry at most `bucket_bytes`
    each (one larger gradient alone, in place), so the flat copy stays small when experts
    that run on sequence shards make the gradients large (`WholeExperts`).
    """
    grads = [grad for param, grad in grads if is_partial_over_tp(param) and grad is not None]
    if group is None or dist.get_world_size(group) == 1 or not grads:
        return
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for grad in grads:
        by_dtype.setdefault(grad.dtype, []).append(grad)
    for same in by_dtype.values():
        for bucket in runs_within(same, lambda g: g.numel() * g.element_size(), bucket_bytes):
            _sum_in_one_call(bucket, group)


def _sum_in_one_call(grads: list[torch.Tensor], group: dist.ProcessGroup) -> None:
    """All-reduce `grads` (one dtype) in one call: in place where it is one contiguous
    tensor, else through one flat copy."""
    alone = len(grads) == 1 and grads[0].is_contiguous()
    flat = grads[0] if alone else torch.cat([grad.reshape(-1) for grad in grads])
    record("all_reduce", flat.numel() * flat.element_size(), "backward", "param_grad")
    with WATCH.waiting("all_reduce", group):
        dist.all_reduce(flat, group=group)
    if alone:
        return
    offset = 0
    for grad in grads:
        grad.copy_(flat[offset:offset + grad.numel()].view_as(grad))
        offset += grad.numel()
