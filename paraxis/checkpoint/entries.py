"""What a rank holds of the training state, described in single-device coordinates.

Every tensor a checkpoint stores is a piece of one *full* tensor of the single-device model:
a parameter or one of AdamW's moments, named as on one device (`blocks.3.mlp.up.weight`).
A rank's piece is located by two cuts, whatever the layout:

1. tensor parallelism: slice `tp_index` of `tp_count` equal slices along `tp_dim`
   (`tp_count = 1` when the tensor is replicated over the TP group);
2. ZeRO: the flat range `[lo, hi)` of that slice (the whole slice without ZeRO).

Pipeline stages hold different tensors, so they need no coordinate. Because pieces are
described this way, a checkpoint written by one layout loads into any other: the loader
asks for the pieces its own entries cover (`paraxis.checkpoint.reader`), never for the
writer's files or ranks. Megatron's distributed checkpoints rest on the same idea
(sharded tensors with global offsets).

An `Entry` is also the tensor itself, live on this rank: saving reads it, loading writes into
it, so what is restored is exactly what the engine trains with.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from paraxis.runtime.params import is_pp_duplicate, is_tp_sharded

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


def engine_entries(engine) -> list[Entry]:  # noqa: ANN001 - any LocalEngine subclass
    """Every piece of training state this rank holds, for any engine `build_engine` makes."""
    from paraxis.data_parallel.engine import DataParallelEngine
    from paraxis.data_parallel.zero import init_adam_state

    groups = getattr(engine, "groups", None)
    tp_rank = groups.tp_rank if groups is not None else 0
    dp_rank = groups.dp_rank if groups is not None else 0
    tp_size = engine.layout.tp
    data_parallel = engine if isinstance(engine, DataParallelEngine) else getattr(
        engine, "data_parallel", None)
    zero = data_parallel.zero if data_parallel is not None else 0
    init_adam_state(engine.optimizer)  # moments exist (as zeros) before the first step
    names = _parameter_names(engine)

    def where(param: nn.Parameter) -> tuple[tuple[int, ...], int | None, int, int]:
        shape = tuple(param.shape)
        if is_tp_sharded(param) and tp_size > 1:
            dim = param.tp_shard_dim
            full = shape[:dim] + (shape[dim] * tp_size,) + shape[dim + 1:]
            return full, dim, tp_rank, tp_size
        return shape, None, 0, 1

    def writes(param: nn.Parameter, whole_on_every_dp_rank: bool) -> bool:
        # The tied head copy on the last stage equals the first stage's embedding; a
        # TP-replicated tensor is written by TP rank 0, a dp-replicated one by dp rank 0.
        if is_pp_duplicate(param):
            return False
        if not (is_tp_sharded(param) and tp_size > 1) and tp_rank != 0:
            return False
        return dp_rank == 0 or not whole_on_every_dp_rank

    entries: list[Entry] = []
    state = engine.optimizer.state
    if zero == 0:
        for param in _trainable(engine):
            full, dim, index, count = where(param)
            owner = writes(param, whole_on_every_dp_rank=True)
            numel = param.numel()
            entries.append(Entry("param", names[id(param)], param.data, full, dim, index,
                                 count, 0, numel, owner))
            for kind in KINDS[1:]:
                entries.append(Entry(kind, names[id(param)], state[param][kind], full, dim,
                                     index, count, 0, numel, owner))
        return entries
    for piece, master in data_parallel.pieces:
        param = piece.param
        full, dim, index, count = where(param)
        name = names[id(param)]
        owner = writes(param, whole_on_every_dp_rank=False)
        if zero == 3:  # the parameter exists only as this rank's shard
            entries.append(Entry("param", name, master, full, dim, index, count, piece.lo,
                                 piece.hi, owner))
        for kind in KINDS[1:]:
            entries.append(Entry(kind, name, state[master][kind], full, dim, index, count,
                                 piece.lo, piece.hi, owner))
    if zero in (1, 2):  # whole parameters on every dp rank, sharded optimizer states
        for param in _trainable(engine):
            full, dim, index, count = where(param)
            entries.append(Entry("param", names[id(param)], param.data, full, dim, index,
                                 count, 0, param.numel(), writes(param, True)))
    return entries


def optimizer_steps(engine) -> int:  # noqa: ANN001
    """AdamW's step count (the same for every tensor; 0 before the first step)."""
    for per_tensor in engine.optimizer.state.values():
        if "step" in per_tensor:
            return int(per_tensor["step"])
    return 0


def set_optimizer_steps(engine, steps: int) -> None:  # noqa: ANN001
    for per_tensor in engine.optimizer.state.values():
        per_tensor["step"] = torch.tensor(float(steps))


def _trainable(engine) -> list[nn.Parameter]:  # noqa: ANN001
    return [p for p in engine.model.parameters() if p.requires_grad]


def _parameter_names(engine) -> dict[int, str]:  # noqa: ANN001
    """id(parameter) -> single-device name. Pipeline chunks already use those names; the
    last stage's copy of a tied embedding is `tok_emb.weight` (it is that tensor)."""
    named = engine.named_parameters() if hasattr(engine, "chunks") else list(
        engine.model.named_parameters())
    names = {}
    for name, param in named:
        names[id(param)] = "tok_emb.weight" if is_pp_duplicate(param) else name
    return names


def loss_scaler(engine):  # noqa: ANN001, ANN201 - a LossScaler or None
    """fp16's dynamic loss scaler, wherever the engine keeps it (its data-parallel part)."""
    return getattr(getattr(engine, "data_parallel", None) or engine, "scaler", None)
