"""What a rank holds of the training state, described in single-device coordinates.

Every tensor a checkpoint stores is a piece of one *full* tensor of the single-device model:
a parameter or one of AdamW's moments, named as on one device (`blocks.3.mlp.up.weight`).
A rank's piece is located by two cuts, whatever the layout:

1. tensor parallelism: slice `tp_index` of `tp_count` equal slices along `tp_dim`
   (`tp_count = 1` when the tensor is replicated over the TP group);
2. ZeRO: the flat range `[lo, hi)` of that slice (the whole slice without ZeRO).

Pipeline stages hold different tensors, so they need no coordinate; neither do the experts
of an expert-parallel group (each rank holds its experts whole, under their single-device
names `blocks.N.moe.experts.E...`). Because pieces are
described this way, a checkpoint written by one layout loads into any other: the loader
(`load.CheckpointReader`) asks for the pieces its own entries cover, never for the writer's
files or ranks. Megatron's distributed checkpoints rest on the same idea
(sharded tensors with global offsets).

An `Entry` is also the tensor itself, live on this rank: saving reads it, loading writes into
it, so what is restored is exactly what the engine trains with. Each engine lists its own
(`Engine.checkpoint_entries`, built with `whole_entries` / `shard_entries` below), so nothing
here needs to know which engine it is talking to.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from paraxis.dist.params import is_ep_sharded, is_pp_duplicate, is_tp_sharded
from paraxis.spec.layout import Layout

KINDS = ("param", "exp_avg", "exp_avg_sq")  # the parameter, then AdamW's two moments


@dataclass
class Entry:
    kind: str  # one of KINDS
    name: str  # single-device parameter name
    tensor: torch.Tensor  # this rank's live piece (the slice's shape, or 1-D for a ZeRO range)
    full_shape: tuple[int, ...]
    tp_dim: int | None
    tp_index: int
    tp_count: int
    lo: int  # flat range within the TP slice
    hi: int
    owner: bool  # this rank writes it (one writer per piece: replicas stay silent)

    @property
    def key(self) -> str:
        return f"{self.kind}/{self.name}"

    def describe(self) -> dict:
        """The piece's coordinates, as the manifest records them."""
        return {"kind": self.kind, "name": self.name, "shape": list(self.full_shape),
                "tp_dim": self.tp_dim, "tp_index": self.tp_index, "tp_count": self.tp_count,
                "lo": self.lo, "hi": self.hi}


class ShardPiece(Protocol):
    """Where a parameter meets a rank's ZeRO shard (`data_parallel.flat.Piece`): the flat
    range [lo, hi) of the parameter."""

    @property
    def param(self) -> nn.Parameter: ...

    @property
    def lo(self) -> int: ...

    @property
    def hi(self) -> int: ...


@dataclass(frozen=True)
class Place:
    """Where a rank sits on the axes that cut a tensor: its TP slice and its dp replica
    (for experts under expert parallelism, its index among the ranks holding the same
    experts: `expert_dp_rank`), and under hybrid sharding which copy of its ZeRO shards it
    holds."""

    tp_rank: int = 0
    tp_size: int = 1
    dp_rank: int = 0
    expert_dp_rank: int | None = None  # None: dp_rank
    copy: int = 0  # hybrid sharding: which copy of its shards the rank holds (0 writes)

    def cut(self, param: nn.Parameter) -> tuple[tuple[int, ...], int | None, int, int]:
        """(full shape, tp dim, tp index, tp count) of the tensor `param` is a piece of."""
        shape = tuple(param.shape)
        if is_tp_sharded(param) and self.tp_size > 1:
            dim = param.tp_shard_dim
            full = shape[:dim] + (shape[dim] * self.tp_size,) + shape[dim + 1:]
            return full, dim, self.tp_rank, self.tp_size
        return shape, None, 0, 1

    def writes(self, param: nn.Parameter, whole_on_every_dp_rank: bool) -> bool:
        """One writer per piece. The tied head copy on the last stage equals the first
        stage's embedding; a TP-replicated tensor is written by TP rank 0, a dp-replicated
        one by dp rank 0."""
        if is_pp_duplicate(param):
            return False
        if not (is_tp_sharded(param) and self.tp_size > 1) and self.tp_rank != 0:
            return False
        replica = self.dp_rank
        if is_ep_sharded(param) and self.expert_dp_rank is not None:
            replica = self.expert_dp_rank
        if whole_on_every_dp_rank:
            return replica == 0
        return self.copy == 0


def whole_entries(named: list[tuple[str, nn.Parameter]], state: Mapping[torch.Tensor, dict],
                  place: Place, kinds: tuple[str, ...] = KINDS) -> list[Entry]:
    """Entries of whole (maybe TP-sliced) parameters, the same on every dp rank, and of their
    AdamW moments in `state` (kinds other than "param")."""
    entries = []
    for name, param in named:
        full, dim, index, count = place.cut(param)
        owner = place.writes(param, whole_on_every_dp_rank=True)
        for kind in kinds:
            tensor = param.data if kind == "param" else state[param][kind]
            entries.append(Entry(kind, name, tensor, full, dim, index, count, 0, param.numel(),
                                 owner))
    return entries


def buffer_entries(named: list[tuple[str, torch.Tensor]], place: Place) -> list[Entry]:
    """Entries of training state kept in buffers (`model.single_device_buffers`): whole
    tensors, the same on every rank of their stage, written by its first TP rank of its
    first replica; no optimizer moments."""
    owner = place.tp_rank == 0 and place.dp_rank == 0
    return [Entry("param", name, buffer, tuple(buffer.shape), None, 0, 1, 0, buffer.numel(),
                  owner) for name, buffer in named]


def shard_entries(pieces: list[tuple[ShardPiece, torch.Tensor]], names: Mapping[int, str],
                  state: Mapping[torch.Tensor, dict], place: Place, kinds: tuple[str, ...],
                  whole_on_every_dp_rank: bool = False) -> list[Entry]:
    """Entries of ZeRO's pieces: (piece of a parameter, its flat master view), each the flat
    range [lo, hi) of its TP slice; `names`: id(parameter) -> single-device name.
    whole_on_every_dp_rank: the pieces are whole and replicated (ZeRO-0's fp32 masters)."""
    entries = []
    for piece, master in pieces:
        full, dim, index, count = place.cut(piece.param)
        owner = place.writes(piece.param, whole_on_every_dp_rank)
        for kind in kinds:
            tensor = master if kind == "param" else state[master][kind]
            entries.append(Entry(kind, names[id(piece.param)], tensor, full, dim, index, count,
                                 piece.lo, piece.hi, owner))
    return entries


def optimizer_steps(optimizer: torch.optim.Optimizer) -> int:
    """AdamW's step count (the same for every tensor; 0 before the first step)."""
    for per_tensor in optimizer.state.values():
        if "step" in per_tensor:
            return int(per_tensor["step"])
    return 0


def step_count(steps: int, device: torch.device) -> torch.Tensor:
    """AdamW's step count as its state holds it: on the parameter's device, which the fused
    kernel requires (torch keeps it there too for fused and capturable AdamW)."""
    return torch.tensor(float(steps), device=device)


def set_optimizer_steps(optimizer: torch.optim.Optimizer, steps: int) -> None:
    for param, per_tensor in optimizer.state.items():
        per_tensor["step"] = step_count(steps, param.device)


class LossScale(Protocol):
    """fp16's dynamic loss scale as checkpoints see it (`engine/data_parallel/loss_scale.py`)."""

    def state_dict(self) -> dict[str, float]: ...

    def load_state_dict(self, state: dict[str, float]) -> None: ...


class Checkpointable(Protocol):
    """What saving and loading a checkpoint ask of an engine (`paraxis.engine.contract.Engine`
    has these names among its others)."""

    layout: Layout
    optimizer: torch.optim.Optimizer
    loss_scaler: LossScale | None  # fp16's dynamic loss scale, checkpointed; else None

    @property
    def device(self) -> torch.device: ...

    def checkpoint_entries(self) -> list[Entry]:
        """Every piece of training state this rank holds, in single-device coordinates."""
        ...
