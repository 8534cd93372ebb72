"""Where a run's step records go, and the two figures that need more than a clock.

- MFU: model FLOPs per token from the planner's formula (`plan.compute`), so the run and the
  plan never count differently, over the peak FLOP/s of the device the run is on.
- Peak memory: this rank's, and every rank's (with the largest) on logging steps.
- A mixture of experts' per-expert token counts and load-balancing loss of every step.

Records go to a JSON-lines file and, when asked, TensorBoard event files (rank 0 only).
"""

from __future__ import annotations

import json
import math
import resource
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from paraxis.dist.watchdog import WATCH
from paraxis.parallel.experts.layer import MoE
from paraxis.plan.hardware import build_cluster, load_hardware_file
from paraxis.plan.rates import for_precision
from paraxis.spec.errors import ParaxisError, RunFailed
from paraxis.spec.precision import Precision, get_policy
from paraxis.train.run_hardware import gpu_for_device_name

if TYPE_CHECKING:
    from paraxis.dist.groups import ParallelGroups
    from paraxis.spec.model_config import ModelConfig


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def device_memory_bytes(device: torch.device) -> float | None:
    """A GPU's total memory; None on a CPU (whose ranks share the machine's)."""
    if device.type == "cuda":
        return float(torch.cuda.get_device_properties(device).total_memory)
    return None


def over_ranks(value: int) -> list[int]:
    """`value` of every rank, in rank order (one small all-gather; call on every rank)."""
    if not dist.is_initialized():
        return [value]
    tensor = torch.tensor([value], dtype=torch.int64)
    if dist.get_backend() == "nccl":
        tensor = tensor.cuda()
    gathered = [torch.zeros_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, tensor)
    return [int(t) for t in gathered]


def max_over_ranks(value: int) -> int:
    """The largest `value` over every rank (call on every rank)."""
    return max(over_ranks(value))


def print_model_states(states: dict[str, int], rank: int, world: int,
                       precision: str | None = None) -> None:
    """One line: the bytes of parameters, gradients and optimizer states (an engine's
    `memory_report`) on the fullest rank, which is what sharding shrinks, and the precision
    policy that sized them. Collective: every rank calls it."""
    largest = {kind: max_over_ranks(size) for kind, size in states.items()}
    if rank == 0 and largest:
        shown = ", ".join(f"{kind} {size / 1e6:.3g} MB" for kind, size in largest.items())
        where = "this rank" if world == 1 else f"the fullest of {world} ranks"
        policy = f" [{precision}]" if precision else ""
        print(f"model states on {where}: {shown}{policy}", file=sys.stderr, flush=True)


def device_peak_flops(device: torch.device, peak_tflops: float | None = None,
                      hardware_file: str | None = None,
                      precision: str | None = None) -> float | None:
    """Peak FLOP/s of one device for the run's `precision`: --peak-tflops, else a hardware
    file (what `paraxis calibrate` measured), else the preset matching the CUDA device's name
    (its CUDA cores' fp32 rate where the run computes in fp32, as the planner prices it:
    `rates.for_precision`); None on a CPU without either (MFU is then left out rather than
    guessed)."""
    if peak_tflops:
        return peak_tflops * 1e12
    if hardware_file:
        return build_cluster(gpus=1, overrides=load_hardware_file(hardware_file)).gpu.peak_flops
    if device.type == "cuda":
        gpu = gpu_for_device_name(torch.cuda.get_device_name(device))
        if gpu is None:
            return None
        cluster = build_cluster(gpu.name, 1)
        if precision is not None:
            cluster = for_precision(cluster, Precision.of(get_policy(precision)))
        return cluster.gpu.peak_flops
    return None


def strict_json(value: Any) -> Any:
    """`value` with every non-finite float (at any depth) replaced by None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [strict_json(v) for v in value]
    return value


class MetricsSink:
    """Step records to JSON lines (appending when a run resumes) and TensorBoard (whose
    events from `start_step` on, logged before the checkpoint a resumed run continues from,
    are dropped: the steps are about to be taken again)."""

    def __init__(self, jsonl: str | None, tensorboard: str | None, append: bool,
                 start_step: int = 0) -> None:
        self.file = open(jsonl, "a" if append else "w") if jsonl else None  # noqa: SIM115
        self.writer = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import (  # lazy: tensorboard is optional
                    SummaryWriter,
                )
            except ImportError:
                raise ParaxisError("--tensorboard needs the tensorboard package; pip install "
                                   "tensorboard, or leave the flag out") from None
            Path(tensorboard).mkdir(parents=True, exist_ok=True)
            self.writer = SummaryWriter(tensorboard, purge_step=start_step or None)

    def write(self, record: dict[str, Any]) -> None:
        if self.file:
            # strict JSON has no NaN or Infinity: such a value is written as null (the
            # record's `skipped` says what was not finite; run_records.load_metrics reads
            # a null loss or norm back as NaN)
            try:
                self.file.write(json.dumps(strict_json(record), allow_nan=False) + "\n")
                self.file.flush()
            except OSError as error:
                raise RunFailed(f"cannot write the metrics file {self.file.name} at step "
                                f"{record['step']} ({error.strerror}); free space or choose "
                                "another --metrics-file, then resume with --resume auto "
                                "from the last checkpoint") from None
        if self.writer:
            for key, value in record.items():
                if key != "step" and isinstance(value, int | float):
                    self.writer.add_scalar(f"train/{key}", value, record["step"])

    def close(self) -> None:
        if self.file:
            self.file.close()
        if self.writer:
            self.writer.close()


def moe_step_metrics(model: torch.nn.Module, groups: ParallelGroups | None,
                     cfg: ModelConfig) -> dict[str, Any]:
    """A mixture of experts' step figures, the same on every layout (empty for a dense model):
    `expert_tokens`, the (token, expert) assignments each expert of each MoE block received
    this step over the whole global batch, one list per block in model order; `aux_loss`, the
    load-balancing loss (coef included, summed over blocks, averaged over microbatches); under
    a capacity factor `dropped_tokens`, the assignments each block dropped over capacity (each
    rank's capacity holds its own tokens, as in Switch Transformer and Megatron-LM, so a
    layout with dp x cp > 1 drops other tokens than one device, and trains other numbers).
    Counted as the microbatches' backward passes each block (`MoE.take_step`). Collective:
    every rank calls it (blocks of other pipeline stages arrive over the pp group, each
    rank's share of the aux loss is averaged over the dp x cp ranks, and over the tp ranks
    where each routes its own sequence shard)."""
    if not cfg.n_experts:
        return {}
    counts = torch.zeros(cfg.n_layers, cfg.n_experts, dtype=torch.float64)
    dropped = torch.zeros(cfg.n_layers, dtype=torch.float64)
    losses = torch.zeros(2, dtype=torch.float64)  # aux loss, z-loss: coefficients included
    shards = None  # the tp group where each tp rank routes its own sequence shard
    for name, module in model.named_modules():
        if isinstance(module, MoE):
            if module.shard_group is not None:
                shards = module.shard_group
            block = int(name.split("blocks.")[1].split(".")[0])
            step = module.take_step()
            dropped[block] = step.dropped
            if step.counts is not None:
                counts[block] = step.counts.double().cpu()
            if step.aux:
                losses[0] += cfg.aux_loss_coef * float(sum(step.aux)) / len(step.aux)
                losses[1] += cfg.z_loss_coef * float(sum(step.z)) / len(step.z)
    if groups is not None and dist.is_initialized():
        device = "cuda" if dist.get_backend() == "nccl" else "cpu"
        counts, dropped, losses = counts.to(device), dropped.to(device), losses.to(device)
        if groups.replica_group is not None:  # the losses: averaged over the replicas
            with WATCH.waiting("all_reduce", groups.replica_group):
                dist.all_reduce(losses, group=groups.replica_group)
            losses /= dist.get_world_size(groups.replica_group)
            if cfg.capacity_factor:  # each dp x cp rank drops from its own tokens
                with WATCH.waiting("all_reduce", groups.replica_group):
                    dist.all_reduce(dropped, group=groups.replica_group)
        if shards is not None:  # and over the tp ranks' sequence shards
            with WATCH.waiting("all_reduce", shards):
                dist.all_reduce(losses, group=shards)
            losses /= dist.get_world_size(shards)
        if groups.pp_group is not None:
            for figure in (counts, losses, dropped) if cfg.capacity_factor else (counts, losses):
                with WATCH.waiting("all_reduce", groups.pp_group):
                    dist.all_reduce(figure, group=groups.pp_group)
    rows = [i for i in range(cfg.n_layers) if cfg.is_moe_layer(i)]
    figures = {"expert_tokens": [[int(n) for n in counts[i].tolist()] for i in rows],
               "aux_loss": float(losses[0])}
    if cfg.z_loss_coef:
        figures["z_loss"] = float(losses[1])
    if cfg.capacity_factor:
        figures["dropped_tokens"] = [int(dropped[i]) for i in rows]
    return figures
