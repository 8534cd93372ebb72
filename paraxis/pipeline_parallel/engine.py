"""`PipelineEngine`: the training-step contract (`LocalEngine`) for pp > 1.

Each rank builds only its stage's chunks, generates and validates the layout's schedule,
and per step lets the executor run its action list. After the last backward it sums the
tied embedding's gradient between first and last stage; the loss (held by the last stage)
is broadcast over the pipeline so every rank returns it. The gradient norm is summed over
the stages (`global_norm_squared`), with the tied copy counted once.
"""

from __future__ import annotations

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
from paraxis.schedules import build_schedule, validate


class PipelineEngine(LocalEngine):
    def __init__(self, cfg: ModelConfig, layout: Layout, groups: ParallelGroups,
                 device: torch.device, seed: int = 0, weight_decay: float = 0.1,
                 autocast_dtype: torch.dtype | None = None, partition: Partition | None = None,
                 seq_len: int | None = None, announce: bool = False) -> None:
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
        super().__init__(nn.ModuleList(self.chunks), layout, weight_decay=weight_decay,
                         autocast_dtype=autocast_dtype)
        kind = layout.schedule
        self.schedule = validate(build_schedule(kind, layout.pp, layout.microbatches,
                                                layout.virtual_stages))
        self.executor = PipelineExecutor(self.schedule, groups.pp_rank, self.chunks,
                                         groups.pp_ranks, groups.rank)
        self.tied = TiedEmbedding(cfg, groups, self.chunks)

    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """This stage's parameters under their single-device names (a tied copy once)."""
        seen: dict[str, nn.Parameter] = {}
        for chunk in self.chunks:
            for name, param in chunk.named_parameters():
                seen.setdefault(name, param)
        return list(seen.items())

    def forward_backward(self, inputs: torch.Tensor, targets: torch.Tensor) -> float:
        micro = self.microbatches(inputs, targets)
        xs, ys = [x for x, _ in micro], [y for _, y in micro]
        self.executor.trace.clear()
        loss = self.executor.run(xs, ys, self.autocast_dtype, backward_context=self.no_sync)
        self.finish_grad_sync()
        # Only the last stage computed the loss: it tells the rest of its pipeline.
        dist.broadcast(loss, src=self.groups.pp_ranks[-1], group=self.groups.pp_group)
        return self.reduce_loss(float(loss))

    def finish_grad_sync(self) -> None:
        """After the last backward: both copies of a tied embedding get the summed grad."""
        self.tied.all_reduce_grad()

    def grad_norm_squared(self) -> torch.Tensor:
        sharded, replicated = local_norm_squares(list(self.model.parameters()))
        return global_norm_squared(sharded, replicated, self.groups, grads_sharded_over_dp=False)
