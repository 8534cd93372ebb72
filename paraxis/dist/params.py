"""What a parameter is to the parallel axes, and the global gradient norm built on that.

Conventions every axis follows (attributes set on the `nn.Parameter`):

- `tp_sharded = True`: this rank holds a slice of a tensor-parallel weight; the slices of
  the TP group together make the full tensor. Parameters without it are replicated across
  the TP group and their gradients are identical on every TP rank once backward is done.
- `ep_sharded = True`: an expert's weight under expert parallelism: the ranks of an EP
  group hold different experts, the ranks of the experts' data-parallel group
  (`ParallelGroups.expert_group`) the same ones (`paraxis.parallel.experts.expert_parallel`).
- `pp_duplicate = True`: a copy of a weight that another pipeline stage owns (the tied
  embedding on the last stage); counted once in the gradient norm.
- `tp_partial_grad = True`: a replicated parameter that sequence parallelism applies to
  this rank's tokens only; its gradient is this rank's part until the engine sums it over
  the TP group once a step (`tensor_parallel.partial`).

The data-parallel side knows whether its gradients are sharded across the dp group
(ZeRO-2/3) or whole on every dp rank (ZeRO-0/1).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from paraxis.dist.groups import ParallelGroups
from paraxis.dist.watchdog import WATCH


def is_tp_sharded(param: torch.Tensor) -> bool:
    return bool(getattr(param, "tp_sharded", False))


def is_partial_over_tp(param: torch.Tensor) -> bool:
    return bool(getattr(param, "tp_partial_grad", False))


def is_ep_sharded(param: torch.Tensor) -> bool:
    return bool(getattr(param, "ep_sharded", False))


def is_pp_duplicate(param: torch.Tensor) -> bool:
    return bool(getattr(param, "pp_duplicate", False))


def global_norm_squared(tp_sharded_sq: torch.Tensor, replicated_sq: torch.Tensor,
                        groups: ParallelGroups | None, grads_sharded_over_dp: bool,
                        expert_sq: torch.Tensor | None = None,
                        experts_split_over_tp: bool = False) -> torch.Tensor:
    """Squared L2 norm of the whole model's gradient from this rank's local pieces.

    tp_sharded_sq: sum of squares of this rank's TP-sharded gradients (or gradient shards);
    replicated_sq: the same for TP-replicated ones (pp duplicates already left out).
    Sharded pieces are summed over the TP group, replicated ones counted once; then summed
    over the dp group when ZeRO shards gradients there, and over the pipeline's stages.
    expert_sq: the same for `ep_sharded` gradients: each expert counted once, so summed
    over the EP group (different experts), and over the experts' dp group too when ZeRO
    shards them there (the two together are the dp x cp group); over the TP group as well,
    in the call that sums the sharded ones, where the experts are split over it
    (`experts_split_over_tp`: the layout's etp = tp), else they are whole on every TP rank.
    """
    total = replicated_sq.float().clone()
    sharded = tp_sharded_sq.float().clone()
    split = expert_sq is not None and experts_split_over_tp
    if groups is not None and groups.tp_group is not None:
        if split:  # the experts' tp slices summed in the same call
            sharded = torch.stack([sharded, expert_sq.float()])
        with WATCH.waiting("all_reduce", groups.tp_group):
            dist.all_reduce(sharded, group=groups.tp_group)
        if split:
            sharded, expert_sq = sharded[0], sharded[1]
    total += sharded
    # ZeRO's shards partition dp (x cp), or under hybrid sharding one shard group of it
    shards = groups.zero_group if groups is not None else None
    if grads_sharded_over_dp and shards is not None:
        with WATCH.waiting("all_reduce", shards):
            dist.all_reduce(total, group=shards)
    if expert_sq is not None and groups is not None:
        experts = expert_sq.float().clone()
        # a shard group holds whole expert groups (ep divides dp_shard*cp)
        over = shards if grads_sharded_over_dp else groups.ep_group
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


@torch.no_grad()
def norm_squared(tensors: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """Sum of squares of `tensors` (fp32), without a squared copy of each (the multi-tensor
    norm `clip_grad_norm_` uses)."""
    if not tensors:
        return torch.zeros((), device=device)
    # in fp32 without an fp32 copy of each 16-bit gradient
    norms = torch._foreach_norm(tensors, 2, dtype=torch.float32)
    return torch.stack(norms).pow(2).sum()
