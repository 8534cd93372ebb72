"""The parallel layout: one immutable object shared by the planner, the runtime and the pictures.

A layout says how `world = dp * tp * pp` ranks split the work:

- `tp` ranks split every layer's matrices (Megatron tensor parallelism),
- `pp` ranks split the stack of layers into pipeline stages,
- `dp` ranks each see a different slice of the batch (with `zero` sharding on top).

Rank order. TP is the fastest-varying axis, then DP, then PP:

    rank = pp_rank * (dp * tp) + dp_rank * tp + tp_rank

so a TP group is `tp` neighbouring ranks, which torchrun places on one node, where the fast
links are (TP talks inside every layer); PP is the slowest axis, so stages may sit on
different nodes (PP only sends activations at stage boundaries). This module is pure Python:
`paraxis plan` imports it without torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from paraxis.errors import ParaxisError

if TYPE_CHECKING:
    from paraxis.model_config import ModelConfig

SCHEDULES = ("gpipe", "1f1b", "interleaved")
RECOMPUTE = ("none", "selective", "full")
AXES = ("dp", "tp", "pp")


class Coords(NamedTuple):
    """Where one rank sits in the grid."""

    dp_rank: int
    tp_rank: int
    pp_rank: int


@dataclass(frozen=True)
class Layout:
    dp: int = 1
    tp: int = 1
    pp: int = 1
    zero: int = 0
    # Microbatches per step per data-parallel replica. With pp > 1 they fill the pipeline;
    # with pp == 1 they are gradient-accumulation microsteps (Megatron uses one number for both).
    microbatches: int = 1
    schedule: str = "1f1b"
    virtual_stages: int = 1
    recompute: str = "none"
    sequence_parallel: bool = False

    def __post_init__(self) -> None:
        self._check_own_rules()

    # ----------------------------------------------------------------- grid arithmetic

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    def coords(self, rank: int) -> Coords:
        """Global rank -> (dp_rank, tp_rank, pp_rank)."""
        if not 0 <= rank < self.world_size:
            raise ParaxisError(f"rank {rank} is outside a world of {self.world_size} ranks")
        tp_rank = rank % self.tp
        dp_rank = (rank // self.tp) % self.dp
        pp_rank = rank // (self.tp * self.dp)
        return Coords(dp_rank, tp_rank, pp_rank)

    def rank(self, dp_rank: int, tp_rank: int, pp_rank: int) -> int:
        """(dp_rank, tp_rank, pp_rank) -> global rank; the inverse of `coords`."""
        for name, value, size in (("dp", dp_rank, self.dp), ("tp", tp_rank, self.tp),
                                  ("pp", pp_rank, self.pp)):
            if not 0 <= value < size:
                raise ParaxisError(f"{name}_rank {value} is outside 0..{size - 1}")
        return pp_rank * (self.dp * self.tp) + dp_rank * self.tp + tp_rank

    def groups(self, axis: str) -> list[list[int]]:
        """Every group along one axis ("dp", "tp", "pp" or "dp_tp"), each sorted by its
        coordinate on that axis. The groups of one axis partition the world."""
        if axis == "tp":
            return [[self.rank(d, t, p) for t in range(self.tp)]
                    for p in range(self.pp) for d in range(self.dp)]
        if axis == "dp":
            return [[self.rank(d, t, p) for d in range(self.dp)]
                    for p in range(self.pp) for t in range(self.tp)]
        if axis == "pp":
            return [[self.rank(d, t, p) for p in range(self.pp)]
                    for d in range(self.dp) for t in range(self.tp)]
        if axis == "dp_tp":  # every rank of one pipeline stage (ZeRO over dp x tp, loss sums)
            return [[self.rank(d, t, p) for d in range(self.dp) for t in range(self.tp)]
                    for p in range(self.pp)]
        raise ParaxisError(f"unknown axis {axis!r}; use one of dp, tp, pp, dp_tp")

    def group_of(self, rank: int, axis: str) -> list[int]:
        """The group along `axis` that contains `rank`."""
        for group in self.groups(axis):
            if rank in group:
                return group
        raise ParaxisError(f"rank {rank} is outside a world of {self.world_size} ranks")

    @property
    def num_chunks(self) -> int:
        """Model chunks per pipeline stage (>1 only for the interleaved schedule)."""
        return self.virtual_stages

    # ----------------------------------------------------------------------- checking

    def _check_own_rules(self) -> None:
        for name in ("dp", "tp", "pp", "microbatches", "virtual_stages"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ParaxisError(f"layout {name}={value!r} must be a positive integer")
        if self.zero not in (0, 1, 2, 3):
            raise ParaxisError(f"layout zero={self.zero!r} must be one of 0, 1, 2, 3")
        if self.schedule not in SCHEDULES:
            raise ParaxisError(f"unknown schedule {self.schedule!r}; use one of "
                               f"{', '.join(SCHEDULES)}")
        if self.recompute not in RECOMPUTE:
            raise ParaxisError(f"unknown recompute {self.recompute!r}; use one of "
                               f"{', '.join(RECOMPUTE)}")
        if self.virtual_stages > 1 and self.schedule != "interleaved":
            raise ParaxisError(f"virtual_stages={self.virtual_stages} needs "
                               "schedule=interleaved; set the schedule or virtual_stages=1")
        if self.schedule == "interleaved" and self.pp > 1:
            if self.microbatches % self.pp:
                raise ParaxisError(
                    f"interleaved schedule needs microbatches ({self.microbatches}) to be a "
                    f"multiple of pp ({self.pp}); use microbatches="
                    f"{-(-self.microbatches // self.pp) * self.pp}")
        if self.sequence_parallel and self.tp == 1:
            raise ParaxisError("sequence_parallel needs tp > 1; raise tp or drop "
                               "sequence_parallel")
        if self.zero == 3 and self.pp > 1:
            raise ParaxisError("ZeRO-3 with pipeline parallelism is not supported (every "
                               "microbatch would re-gather the stage's weights); use zero<=2 "
                               "with pp>1, or pp=1 with zero=3")

    def validate(self, world_size: int | None = None, model: ModelConfig | None = None,
                 global_batch: int | None = None, seq_len: int | None = None) -> Layout:
        """Check this layout against a world size, a model and a batch; return it unchanged.

        Raises `ParaxisError` with a one-line message naming the rule broken and a fix.
        """
        if world_size is not None and world_size != self.world_size:
            raise ParaxisError(
                f"dp*tp*pp = {self.dp}*{self.tp}*{self.pp} = {self.world_size} but the world "
                f"has {world_size} ranks; choose degrees whose product is {world_size}")
        if model is not None:
            self._check_model(model)
        if global_batch is not None:
            per_step = self.dp * self.microbatches
            if global_batch < 1 or global_batch % per_step:
                raise ParaxisError(
                    f"global batch {global_batch} is not divisible by dp*microbatches = "
                    f"{self.dp}*{self.microbatches} = {per_step}; use a global batch that is "
                    f"a multiple of {per_step}")
        if seq_len is not None and self.sequence_parallel and seq_len % self.tp:
            raise ParaxisError(f"sequence parallelism needs seq_len ({seq_len}) divisible by "
                               f"tp ({self.tp}); change seq_len or tp")
        return self

    def _check_model(self, model: ModelConfig) -> None:
        if model.n_heads % self.tp:
            raise ParaxisError(f"{model.n_heads} attention heads are not divisible by tp="
                               f"{self.tp}; choose tp among {_divisors(model.n_heads)}")
        if model.n_kv_heads % self.tp:
            raise ParaxisError(f"{model.n_kv_heads} kv heads are not divisible by tp={self.tp}; "
                               f"choose tp among {_divisors(model.n_kv_heads)}")
        # Padding the vocabulary would change the model's loss normalisation and its shapes
        # in checkpoints; an error keeps every layout's model identical.
        if model.vocab_size % self.tp:
            raise ParaxisError(f"vocab size {model.vocab_size} is not divisible by tp={self.tp}; "
                               "pad the vocabulary to a multiple of tp")
        if model.d_ff % self.tp:
            raise ParaxisError(f"MLP width {model.d_ff} is not divisible by tp={self.tp}")
        chunks = self.pp * self.virtual_stages
        if model.n_layers < chunks:
            raise ParaxisError(
                f"{model.n_layers} layers cannot fill pp*virtual_stages = {chunks} model "
                f"chunks (each needs at least one layer); use pp*virtual_stages <= "
                f"{model.n_layers}")

    # ------------------------------------------------------------------ text in / out

    @classmethod
    def parse(cls, text: str) -> Layout:
        """Read "dp=2,tp=2,pp=2,zero=1,schedule=1f1b" (any subset of the fields)."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        values: dict[str, object] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            key, sep, raw = item.partition("=")
            key = key.strip().replace("-", "_")
            if key == "sp":
                key = "sequence_parallel"
            if not sep or key not in fields:
                raise ParaxisError(f"cannot read layout item {item!r}; write key=value with keys "
                                   f"{', '.join(fields)}")
            raw = raw.strip()
            if fields[key].type in ("int", int):
                try:
                    values[key] = int(raw)
                except ValueError:
                    raise ParaxisError(f"layout {key}={raw!r} must be an integer") from None
            elif fields[key].type in ("bool", bool):
                if raw.lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
                    raise ParaxisError(f"layout {key}={raw!r} must be true or false")
                values[key] = raw.lower() in ("1", "true", "yes", "on")
            else:
                values[key] = raw
        return cls(**values)

    def __str__(self) -> str:
        parts = [f"dp={self.dp}", f"tp={self.tp}", f"pp={self.pp}", f"zero={self.zero}"]
        if self.pp > 1 or self.microbatches > 1:
            parts.append(f"microbatches={self.microbatches}")
        if self.pp > 1:
            parts.append(f"schedule={self.schedule}")
        if self.virtual_stages > 1:
            parts.append(f"virtual_stages={self.virtual_stages}")
        if self.recompute != "none":
            parts.append(f"recompute={self.recompute}")
        if self.sequence_parallel:
            parts.append("sequence_parallel=true")
        return ",".join(parts)

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)

    def replace(self, **changes: object) -> Layout:
        return dataclasses.replace(self, **changes)


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)
