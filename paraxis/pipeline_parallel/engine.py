"""`PipelineEngine`: the training-step contract (`LocalEngine`) for pp > 1, with tensor and
data parallelism (ZeRO 0-2) inside each stage: any dp x tp x pp layout.

Each rank builds only its stage's chunks, splits them for its TP group
(`apply_tensor_parallel` works on stage modules), and, with dp > 1, hands the chunks'
parameters to a `DataParallelEngine` over the dp group, which then owns gradient reduction,
ZeRO sharding, clipping and the optimizer. Per step the executor runs this stage's action
list; after the last backward the tied embedding's gradient is summed between first and last
stage, the dp reduction finishes, and the loss (held by the last stage) is broadcast over the
pipeline so every rank returns it. Norms are global over every axis
(`runtime.params.global_norm_squared`: tp, dp when sharded, pp), the tied copy counted once.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from paraxis.layout import Layout
from paraxis.model_config import ModelConfig
from paraxis.pipeline_parallel.executor import PipelineExecutor
from paraxis.pipeline_parallel.partition import Partition, partition_layers
from paraxis.pipeline_parallel.stage import StageModule, TiedEmbedding, build_stage_modules
from paraxis.runtime.distributed import ParallelGroups
from paraxis.runtime.engine import LocalEngine
from paraxis.runtime.params import global_norm_squared, local_norm_squares
from paraxis.runtime.watchdog import WATCH
from paraxis.schedules import build_schedule, forward_only, validate


class PipelineEngine(LocalEngine):
    def __init__(self, cfg: ModelConfig, layout: Layout, groups: ParallelGroups,
                 device: torch.device, seed: int = 0, weight_decay: float = 0.1,
                 autocast_dtype: torch.dtype | None = None, partition: Partition | None = None,
                 seq_len: int | None = None, announce: bool = False,
                 eps: float = 1e-8) -> None:
        self.groups = groups
        self.partition = partition or partition_layers(cfg, layout.pp, layout.virtual_stages,
                                                       seq_len=seq_len)
        if announce:
            print(f"pipeline split ({layout.pp} stages):\n{self.partition.describe()}",
                  flush=True)
        self.chunks: list[StageModule] = build_stage_modules(cfg, self.partition,
                                                             groups.pp_rank, seed, device)
        for chunk in self.chunks:
            chunk.set_recompute(layout.recompute)
        if layout.tp > 1:
            from paraxis.tensor_parallel import apply_tensor_parallel

            for chunk in self.chunks:
                apply_tensor_parallel(chunk, groups, layout.sequence_parallel)
        container = nn.ModuleList(self.chunks)
        # The tied pair is found after TP replaced the embedding / head modules.
        self.tied = TiedEmbedding(cfg, groups, self.chunks)
        self.data_parallel: LocalEngine | None = None
        if layout.dp > 1:
            from paraxis.data_parallel import DataParallelEngine

            self.data_parallel = DataParallelEngine(container, layout, groups,
                                                    weight_decay=weight_decay, eps=eps,
                                                    autocast_dtype=autocast_dtype)
            self.model, self.layout, self.autocast_dtype = container, layout, autocast_dtype
            self.optimizer = self.data_parallel.optimizer
        else:
            super().__init__(container, layout, weight_decay=weight_decay, eps=eps,
                             autocast_dtype=autocast_dtype)
        self.schedule = validate(build_schedule(layout.schedule, layout.pp,
                                                layout.microbatches, layout.virtual_stages))
        self.executor = PipelineExecutor(self.schedule, groups.pp_rank, self.chunks,
                                         groups.pp_ranks, groups.rank)
        self.eval_executor = PipelineExecutor(forward_only(self.schedule), groups.pp_rank,
                                              self.chunks, groups.pp_ranks, groups.rank)
        if layout.sequence_parallel:
            # Sequence parallelism keeps the residual stream split along the sequence between
            # blocks, so a stage boundary carries 1/tp of the sequence (Korthikanti et al.).
            for executor in (self.executor, self.eval_executor):
                executor.boundary_shape = lambda ids: (ids[0], ids[1] // layout.tp,
                                                       cfg.d_model)

    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """This stage's parameters under their single-device names (a tied copy once)."""
        seen: dict[str, nn.Parameter] = {}
        for chunk in self.chunks:
            for name, param in chunk.named_parameters():
                seen.setdefault(name, param)
        return list(seen.items())

    # ------------------------------------------------------------------- the contract

    def forward_backward(self, inputs: torch.Tensor, targets: torch.Tensor) -> float:
        micro = self.microbatches(inputs, targets)
        xs, ys = [x for x, _ in micro], [y for _, y in micro]
        self.executor.trace.clear()
        loss = self.executor.run(xs, ys, self.autocast_dtype,
                                 backward_context=self._backward_context)
        self.finish_grad_sync()
        return self._loss_from_last_stage(loss)

    @torch.no_grad()
    def evaluate(self, inputs: torch.Tensor, targets: torch.Tensor) -> float:
        micro = self.microbatches(inputs, targets)
        loss = self.eval_executor.run([x for x, _ in micro], [y for _, y in micro],
                                      self.autocast_dtype)
        return self._loss_from_last_stage(loss)

    def _loss_from_last_stage(self, loss: torch.Tensor) -> float:
        # Only the last stage computed the loss: it tells the rest of its pipeline.
        with WATCH.waiting("broadcast", self.groups.pp_group):
            dist.broadcast(loss, src=self.groups.pp_ranks[-1], group=self.groups.pp_group)
        return self.reduce_loss(float(loss))

    def _backward_context(self, last: bool) -> Any:
        if self.data_parallel is None:
            return contextlib.nullcontext()
        # A rank holding a tied embedding copy must sum it with its partner stage before
        # the dp reduction (ZeRO-2 keeps only a shard of the reduced gradient), so its dp
        # reduction is launched in finish_grad_sync rather than from the last backward.
        return self.data_parallel.no_sync(last=last and self.tied.param is None)

    def no_sync(self, last: bool):  # noqa: ANN201 - a context manager
        return self._backward_context(last)

    def finish_grad_sync(self) -> None:
        self.tied.all_reduce_grad()
        if self.data_parallel is not None:
            self.data_parallel.finish_grad_sync()

    def reduce_loss(self, loss: float) -> float:
        return loss if self.data_parallel is None else self.data_parallel.reduce_loss(loss)

    def grad_norm_squared(self) -> torch.Tensor:
        if self.data_parallel is not None:
            return self.data_parallel.grad_norm_squared()
        sharded, replicated = local_norm_squares(list(self.model.parameters()))
        return global_norm_squared(sharded, replicated, self.groups, grads_sharded_over_dp=False)

    def clip_grad_norm(self, max_norm: float) -> float:
        if self.data_parallel is not None:
            return self.data_parallel.clip_grad_norm(max_norm)
        return super().clip_grad_norm(max_norm)

    def skipped_overflow(self) -> bool:
        return self.data_parallel is not None and self.data_parallel.skipped_overflow()

    def optimizer_step(self, lr: float) -> None:
        if self.data_parallel is not None:
            self.data_parallel.optimizer_step(lr)
        else:
            super().optimizer_step(lr)

    def zero_grad(self) -> None:
        if self.data_parallel is not None:
            self.data_parallel.zero_grad()
        else:
            super().zero_grad()

    def trace_events(self) -> list[dict]:
        return list(self.executor.trace)
