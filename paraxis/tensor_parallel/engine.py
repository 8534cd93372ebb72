"""The training engine for tp > 1 with one data-parallel replica (dp == 1, pp == 1).

The step is `LocalEngine`'s: every TP rank runs the same microbatches on its shard. Two
things change: the gradient norm is global (TP-sharded gradients summed over the TP group,
replicated ones counted once), and the loss every rank reports is the same number.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from paraxis.layout import Layout
from paraxis.runtime.distributed import ParallelGroups
from paraxis.runtime.engine import LocalEngine
from paraxis.runtime.params import global_norm_squared, local_norm_squares
from paraxis.runtime.watchdog import WATCH


class TensorParallelEngine(LocalEngine):
    def __init__(self, model: nn.Module, layout: Layout, groups: ParallelGroups,
                 **options: object) -> None:
        super().__init__(model, layout, **options)  # type: ignore[arg-type]
        self.groups = groups

    def grad_norm_squared(self) -> torch.Tensor:
        sharded, replicated = local_norm_squares(list(self.model.parameters()))
        return global_norm_squared(sharded, replicated, self.groups, grads_sharded_over_dp=False)

    def reduce_loss(self, loss: float) -> float:
        # The vocab-parallel loss is already the same on every TP rank (its sums are
        # all-reduced); averaging over the TP group anyway makes that a guarantee, bit for
        # bit, whatever future loss is plugged in.
        if self.groups.tp_group is None:
            return loss
        value = torch.tensor([loss], dtype=torch.float64)
        with WATCH.waiting("all_reduce", self.groups.tp_group):
            dist.all_reduce(value, op=dist.ReduceOp.AVG, group=self.groups.tp_group)
        return float(value)
