"""`PipelineEngine`: the Engine contract for pp > 1, over a data-parallel engine.

Each rank holds its stage's parts (`stage.stage_parts`, split for its TP group by
`runtime.parallelize`) and a `DataParallelEngine` over them, which owns gradient reduction,
ZeRO sharding, clipping and the optimizer (with dp = 1 it is a group of one and does not
communicate). Per step the executor runs this stage's action list; after the last backward
the tied embedding's gradient is summed between first and last stage, the dp reduction
finishes, and the loss (held by the last stage) is broadcast over the pipeline so every rank
returns it. Norms are global over every axis (`runtime.params.global_norm_squared`: tp, dp
when sharded, pp), the tied copy counted once. Under document packing every stage finds each
microbatch's documents in its token ids, which every rank holds (the executor hands them to
each chunk with its activations).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist

from paraxis.dist.groups import ParallelGroups
from paraxis.dist.watchdog import WATCH
from paraxis.engine.contract import LocalEngine
from paraxis.engine.data_parallel.engine import DataParallelEngine
from paraxis.engine.data_parallel.loss_scale import torch_dtype
from paraxis.engine.pipeline_parallel.executor import PipelineExecutor
from paraxis.engine.pipeline_parallel.tied import TiedEmbedding
from paraxis.engine.pipeline_parallel.zero3 import PipelineZero3
from paraxis.model.checkpoint.entries import Entry
from paraxis.model.transformer import Transformer
from paraxis.parallel.experts.layer import set_aux_loss_scale
from paraxis.spec.schedules import build_schedule, forward_only, head_stage, validate


class PipelineEngine(LocalEngine):
    """`parts`: this stage's chunks; `data_parallel`: the engine over their parameters.

    The precision policy is the data-parallel engine's: the executor autocasts each stage's
    compute to its compute dtype, sends activations in the parameters' dtype, and starts
    backward from the loss times fp16's scale, which `clip_grad_norm` below removes once.
    """

    def __init__(self, parts: list[Transformer], data_parallel: DataParallelEngine,
                 groups: ParallelGroups) -> None:
        layout = groups.layout
        self.parts = parts
        self.data_parallel = data_parallel
        self.groups = groups
        self.model, self.layout = data_parallel.model, layout
        self.autocast_dtype = data_parallel.autocast_dtype
        self.end_of_document = data_parallel.end_of_document  # packing masks and weighs the loss
        self.optimizer = data_parallel.optimizer
        self.loss_scaler = data_parallel.loss_scaler
        boundary = torch_dtype(data_parallel.policy.param_dtype)
        # The tied pair is found after TP replaced the embedding / head modules.
        self.tied = TiedEmbedding(groups, parts)
        self.schedule = validate(build_schedule(layout.schedule, layout.pp,
                                                layout.microbatches, layout.virtual_stages))
        # ZeRO-3: the schedule says when each chunk is gathered, freed and reduced
        self.zero3: PipelineZero3 | None = None
        if data_parallel.gatherer is not None:
            tied = [p for p in (self.tied.param, *(self.tied.local_pair or ())) if p is not None]
            self.zero3 = PipelineZero3(data_parallel.gatherer, parts, self.schedule,
                                       groups.pp_rank, layout.zero3_reshard, layout.recompute,
                                       tied)
        # Under context parallelism the microbatch's ids are already this rank's s/cp tokens
        # (the loop splits them), so the boundary shape follows them unchanged. Sequence
        # parallelism keeps the residual stream split along the sequence between blocks, so a
        # stage boundary carries 1/tp of the sequence (Korthikanti et al.).
        shape = None
        if layout.sequence_parallel:
            d_model = parts[0].cfg.d_model
            shape = lambda ids: (ids[0], ids[1] // layout.tp, d_model)  # noqa: E731
        self.executor = PipelineExecutor(
            self.schedule, groups.pp_rank, parts, groups.pp_ranks, groups.rank, boundary,
            boundary_shape=shape, around_compute=self.zero3.around if self.zero3 else None)
        self.eval_executor = PipelineExecutor(forward_only(self.schedule), groups.pp_rank,
                                              parts, groups.pp_ranks, groups.rank, boundary,
                                              boundary_shape=shape)

    # ------------------------------------------------------------------- the contract

    def forward_backward_on_device(self, inputs: torch.Tensor, targets: torch.Tensor
                                   ) -> torch.Tensor:
        micro = self.microbatches(inputs, targets)
        xs, ys = [x for x, _ in micro], [y for _, y in micro]
        self.executor.trace.clear()
        scale = self.loss_scale()
        set_aux_loss_scale(self.moe_layers, scale / len(xs))  # an MoE's aux loss, as the loss
        loss = self.executor.run(xs, ys, self.autocast_dtype,
                                 backward_context=self._backward_context, loss_scale=scale,
                                 loss_weights=self.loss_weights(micro))
        self.finish_grad_sync()
        return self._loss_from_last_stage(loss)

    @torch.no_grad()
    def evaluate(self, inputs: torch.Tensor, targets: torch.Tensor) -> float:
        micro = self.microbatches(inputs, targets)
        loss = self.eval_executor.run([x for x, _ in micro], [y for _, y in micro],
                                      self.autocast_dtype,
                                      loss_weights=self.loss_weights(micro))
        return float(self._loss_from_last_stage(loss))

    def _loss_from_last_stage(self, loss: torch.Tensor) -> torch.Tensor:
        # Only the last stage computed the loss: it tells the rest of its pipeline.
        holder = head_stage(self.schedule.num_stages, self.schedule.placement)  # zb-v: stage 0
        with WATCH.waiting("broadcast", self.groups.pp_group):
            dist.broadcast(loss, src=self.groups.pp_ranks[holder], group=self.groups.pp_group)
        return self.reduce_loss(loss.double())

    def _backward_context(self, last: bool) -> contextlib.AbstractContextManager[Any]:
        # A rank holding a tied embedding copy must sum it with its partner stage before
        # the dp reduction (ZeRO-2 keeps only a shard of the reduced gradient), so its dp
        # reduction is launched in finish_grad_sync rather than from the last backward.
        # ZeRO-3 reduces each chunk from its own last backward (`zero3.py`).
        if self.zero3 is not None:
            return self.data_parallel.no_sync(last=self.zero3.sync_now)
        return self.data_parallel.no_sync(last=last and self.tied.param is None)

    def no_sync(self, last: bool) -> contextlib.AbstractContextManager[Any]:
        return self._backward_context(last)

    def finish_grad_sync(self) -> None:
        self.tied.sum_grads(self.data_parallel.reducer.grad_of)
        self.data_parallel.finish_grad_sync()

    def reduce_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return self.data_parallel.reduce_loss(loss)

    def count_over_replicas(self, count: int) -> int:
        return self.data_parallel.count_over_replicas(count)

    def grad_norm_squared(self) -> torch.Tensor:
        return self.data_parallel.grad_norm_squared()

    def clip_grad_norm_on_device(self, max_norm: float) -> torch.Tensor:
        return self.data_parallel.clip_grad_norm_on_device(max_norm)

    def skipped_overflow(self) -> bool:
        return self.data_parallel.skipped_overflow()

    def optimizer_step(self, lr: float) -> None:
        self.data_parallel._nonfinite = self._nonfinite  # set by train_step for its step
        try:
            self.data_parallel.optimizer_step(lr)
        finally:
            self.data_parallel._nonfinite = None

    def zero_grad(self) -> None:
        self.data_parallel.zero_grad()

    # ------------------------------------------------------ checkpoints, traces, reports

    def checkpoint_entries(self) -> list[Entry]:
        return self.data_parallel.checkpoint_entries()

    def trace_events(self) -> list[dict[str, Any]]:
        return list(self.executor.trace)

    def memory_report(self) -> dict[str, int]:
        return self.data_parallel.memory_report()
