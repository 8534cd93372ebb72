"""What a parameter is to the parallel axes, and the global gradient norm built on that.

Conventions every axis follows (attributes set on the `nn.Parameter`):

- `tp_sharded = True`: this rank holds a slice of a tensor-parallel weight; the slices of
  the TP group together make the full tensor. Parameters without it are replicated across
  the TP group and their gradients are identical on every TP rank once backward is done.
- `ep_sharded = True`: an expert's weight under expert parallelism: the ranks of an EP
  group hold different experts, the ranks of the experts' data-parallel group
  (`ParallelGroups.expert_group`) the same ones (`paraxis.moe.expert_parallel`).
- `pp_duplicate = True`: a copy of a weight that another pipeline stage owns (the tied
  embedding on the last stage); counted once in the gradient norm.
- `tp_partial_grad = True`: a replicated parameter that sequence parallelism applies to
  this rank's tokens only; its gradient is this rank's part until the engine sums it over
  the TP group once a step (`sum_partial_grads`).

The data-parallel side knows whether its gradients are sharded across the dp group
(ZeRO-2/3) or whole on every dp rank (ZeRO-0/1).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from paraxis.runtime.distributed import ParallelGroups
from paraxis.runtime.watchdog import WATCH


def is_tp_sharded(param: torch.Tensor) -> bool:
    return bool(getattr(param, "tp_sharded", False))


def is_partial_over_tp(param: torch.Tensor) -> bool:
    return bool(getattr(param, "tp_partial_grad", False))


def mark_partial_grad(param: torch.Tensor, group: dist.ProcessGroup | None) -> None:
    """Mark a replicated parameter that sequence parallelism applies to this rank's tokens
    only (norm weights and biases, row-parallel biases, learned positions): its gradient on
    each TP rank covers that rank's tokens, and the single-device gradient is their sum
    (Korthikanti et al. 2022, sec. 4.2.2). The engine sums them once a step with
    `sum_partial_grads` (`is_partial_over_tp`)."""
    if group is not None and dist.get_world_size(group) > 1:
        param.tp_partial_grad = True  # type: ignore[attr-defined]


def sum_partial_grads(grads: list[torch.Tensor], group: dist.ProcessGroup | None) -> None:
    """Sum over the TP group, in place and in one call per dtype, the gradients of the
    parameters `mark_partial_grad` marked; call on every rank of the group with the same
    list, once a step after the data-parallel reduction (both are sums over disjoint ranks,
    so they commute, and the sum over microbatches is already in each gradient).

    Megatron-LM does the same in `finalize_model_grads` (one flattened all-reduce of the
    sequence-parallel parameters' gradients). paraxis first summed each parameter in its own
    backward: one call per parameter per microbatch, 52 a step on the first rank of tiny at
    tp=4, pp=2, 4 microbatches, beside SP's own 72 all-gathers and reduce-scatters
    (`python -m bench.sp_grad_sums` counts them).
    """
    from paraxis.tensor_parallel.counter import record  # the package imports this module

    if group is None or dist.get_world_size(group) == 1 or not grads:
        return
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for grad in grads:
        by_dtype.setdefault(grad.dtype, []).append(grad)
    for same in by_dtype.values():
        flat = torch.cat([grad.reshape(-1) for grad in same])
        record("all_reduce", flat.numel() * flat.element_size(), "backward", "param_grad")
        with WATCH.waiting("all_reduce", group):
            dist.all_reduce(flat, group=group)
        offset = 0
        for grad in same:
            grad.copy_(flat[offset:offset + grad.numel()].view_as(grad))
            offset += grad.numel()


def is_ep_sharded(param: torch.Tensor) -> bool:
    return bool(getattr(param, "ep_sharded", False))


def is_pp_duplicate(param: torch.Tensor) -> bool:
    return bool(getattr(param, "pp_duplicate", False))


def global_norm_squared(tp_sharded_sq: torch.Tensor, replicated_sq: torch.Tensor,
                        groups: ParallelGroups | None, grads_sharded_over_dp: bool,
                        expert_sq: torch.Tensor | None = None) -> torch.Tensor:
    """Squared L2 norm of the whole model's gradient from this rank's local pieces.

    tp_sharded_sq: sum of squares of this rank's TP-sharded gradients (or gradient shards);
    replicated_sq: the same for TP-replicated ones (pp duplicates already left out).
    Sharded pieces are summed over the TP group, replicated ones counted once; then summed
    over the dp group when ZeRO shards gradients there, and over the pipeline's stages.
    expert_sq: the same for `ep_sharded` gradients (replicated over TP): each expert counted
    once, so summed over the EP group (different experts), and over the experts' dp group
    too when ZeRO shards them there (the two together are the dp x cp group).
    """
    total = replicated_sq.float().clone()
    sharded = tp_sharded_sq.float().clone()
    if groups is not None and groups.tp_group is not None:
        with WATCH.waiting("all_reduce", groups.tp_group):
            dist.all_reduce(sharded, group=groups.tp_group)
    total += sharded
    replicas = groups.replica_group if groups is not None else None  # dp (x cp)
    if grads_sharded_over_dp and replicas is not None:
        with WATCH.waiting("all_reduce", replicas):
            dist.all_reduce(total, group=replicas)
    if expert_sq is not None and groups is not None:
        experts = expert_sq.float().clone()
        over = replicas if grads_sharded_over_dp else groups.ep_group
        if over is not None:
            with WATCH.waiting("all_reduce", over):
                dist.all_reduce(experts, group=over)
        total += experts
    if groups is not None and groups.pp_group is not None:
        with WATCH.waiting("all_reduce", groups.pp_group):
            dist.all_reduce(total, group=groups.pp_group)
    return total


def local_norm_squares(params: list[torch.nn.Parameter]) -> tuple[torch.Tensor, torch.Tensor]:
    """(tp-sharded, replicated) sums of squared gradients over whole local parameters."""
    device = params[0].device if params else torch.device("cpu")
    sharded = [p.grad for p in params if p.grad is not None and not is_pp_duplicate(p)
               and is_tp_sharded(p)]
    replicated = [p.grad for p in params if p.grad is not None and not is_pp_duplicate(p)
                  and not is_tp_sharded(p)]
    return norm_squared(sharded, device), norm_squared(replicated, device)


def norm_squared(tensors: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """Sum of squares of `tensors` (fp32), without a squared copy of each (the multi-tensor
    norm `clip_grad_norm_` uses)."""
    if not tensors:
        return torch.zeros((), device=device)
    norms = torch._foreach_norm([t.detach().float() for t in tensors])
    return torch.stack(norms).pow(2).sum()
