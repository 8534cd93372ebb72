"""The parallel layout: one immutable object shared by the planner, the runtime and the pictures.

A layout says how `world = pp * dp * cp * tp` ranks split the work:

- `tp` ranks split every layer's matrices (Megatron tensor parallelism),
- `cp` ranks split every sequence (context parallelism; K/V travel every layer),
- `dp` ranks each see a different slice of the batch (with `zero` sharding on top),
- `pp` ranks split the stack of layers into pipeline stages.

Rank order. The grid is one ordered list of named axes, outermost first (`AXES`):

    pp, dp, cp, tp        rank = ((pp_rank * dp + dp_rank) * cp + cp_rank) * tp + tp_rank

TP varies fastest, so a TP group is `tp` neighbouring ranks, which torchrun places on one
node, where the fast links are (TP talks inside every layer). CP comes next (it exchanges K/V
every layer, less than TP), then DP (once per step), and PP is outermost, so stages may sit
on different nodes (PP only sends activations at stage boundaries). Coordinates and every
group (one axis, or several joined by "_", such as "dp_tp") are computed from that list and
nothing else, so adding an axis is adding a name to `AXES` (and its degree to the Layout).

Hybrid sharding (`dp_shard`, PyTorch's HYBRID_SHARD, torchtitan's dp_replicate x dp_shard)
splits the dp axis once more: dp_rank = replica * dp_shard + shard_index, so a shard group is
dp_shard consecutive dp ranks (times cp and tp, the inner axes: dp_shard*cp*tp consecutive
ranks, one node when that is the node's size). ZeRO shards within it; its dp/dp_shard
copies all-reduce their shards' gradients across nodes.

Expert parallelism (`ep`) is not a factor of the world: its groups are carved out of the
dp x cp ranks of one (pp, tp) position, as in Megatron, so `ep` must divide `dp * cp`.
Nor is expert tensor parallelism (`etp`, 1 or tp): with etp = tp each expert's matrices are
split over the tp ranks like the dense MLP's (Megatron-Core's expert tensor parallel size),
with 1 every tp rank holds and runs its experts whole.
Pure Python: `paraxis plan` imports it without torch.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import NamedTuple

from paraxis.spec.cp_balance import VARIANTS as CP_ATTENTION
from paraxis.spec.errors import ParaxisError
from paraxis.spec.grid import (
    AXES,
    axis_degrees,
    axis_pairs,
    divisors_text,
    expert_dp_groups,
    expert_groups,
    grid_groups,
    grid_index,
    grid_rank,
)
from paraxis.spec.model_config import ModelConfig
from paraxis.spec.model_splits import check_model
from paraxis.spec.options import option
from paraxis.spec.schedules import FIXED_VIRTUAL, KINDS, placement_of

SCHEDULES = KINDS  # the pipeline schedules `paraxis.spec.schedules` generates
RECOMPUTE = ("none", "selective", "full")
# Which blocks full recompute checkpoints (Megatron-LM's --recompute-method): "uniform",
# every block, in checkpoints of recompute_layers blocks; "block", only the first
# recompute_layers blocks of each model chunk, the rest keeping their activations.
RECOMPUTE_METHODS = ("uniform", "block")
ZERO3_RESHARD = ("forward", "step")  # ZeRO-3, pp > 1: when gathered chunks are freed (zero3.py)
ZERO_STAGES = (0, 1, 2, 3)  # ZeRO (Rajbhandari et al. 2020): none, +optimizer, +grads, +params


class Coords(NamedTuple):
    """Where one rank sits in the grid: its index along every axis, in `AXES` order (a new
    axis adds its `<name>_rank` field here; tests/test_layout.py checks the two agree)."""

    pp_rank: int
    dp_rank: int
    cp_rank: int
    tp_rank: int


@dataclass(frozen=True)
class Layout:
    """The degrees of every axis plus the options that say how each axis runs."""

    dp: int = option(1, "data-parallel replicas (each sees its own slice of the batch)")
    tp: int = option(1, "tensor-parallel ranks splitting every layer's matrices")
    pp: int = option(1, "pipeline stages splitting the stack of layers")
    cp: int = option(1, "context-parallel ranks splitting every sequence (each holds 2 of its "
                        "2*cp chunks)")
    ep: int = option(1, "expert-parallel ranks splitting the experts, carved out of dp*cp "
                        "(the world size does not change)")
    etp: int = option(1, "expert tensor parallelism: 1 keeps every expert whole on each tp "
                         "rank, tp splits each expert over the tp ranks like the dense MLP")
    zero: int = option(0, "ZeRO stage over dp: 0 none, 1 optimizer state, 2 +gradients, "
                        "3 +parameters", choices=ZERO_STAGES)
    dp_shard: int = option(0, "hybrid sharding: ZeRO shards within groups of dp_shard "
                           "consecutive dp ranks (one node by default placement) and the "
                           "dp/dp_shard groups are replicas of each other; 0: over every dp "
                           "rank")
    # Microbatches per step per data-parallel replica. With pp > 1 they fill the pipeline;
    # with pp == 1 they are gradient-accumulation microsteps (Megatron uses one number for both).
    microbatches: int = option(1, "microbatches per step per replica (pipeline fill or "
                                "accumulation)")
    schedule: str = option("1f1b", "pipeline schedule: " + ", ".join(SCHEDULES))
    virtual_stages: int = option(1, "model chunks per pipeline stage (interleaved; zb-v: 2)")
    recompute: str = option("none", "activation recomputation: " + ", ".join(RECOMPUTE))
    recompute_layers: int = option(1, "full recompute: blocks per checkpoint (Megatron-LM's "
                                   "--recompute-num-layers, uniform): 1 keeps every block's "
                                   "input, N every N-th (the course's sqrt(L) rule); with "
                                   "recompute_method=block, the blocks of each model chunk "
                                   "recomputed")
    recompute_method: str = option("uniform", "full recompute: uniform (every block) or block "
                                   "(only the first recompute_layers blocks of each model "
                                   "chunk: recompute just enough to fit; Megatron-LM's "
                                   "--recompute-method)", choices=RECOMPUTE_METHODS)
    sequence_parallel: bool = option(False, "shard layer norms and dropout over tp along the "
                                          "sequence (needs tp > 1)")
    cp_attention: str = option("ring", "how K/V reach the queries with cp > 1: ring "
                               "(passed rank to rank), all_gather (gathered once a layer) or "
                               "all_to_all (heads split around attention: DeepSpeed-Ulysses)",
                               choices=CP_ATTENTION)
    cp_a2a: int = option(1, "two-level cp: an all-to-all of heads inside groups of cp_a2a "
                         "consecutive cp ranks (a node), cp_attention (ring or all_gather) "
                         "across the groups (Megatron-LM's a2a+p2p); 1: one level")
    zero3_reshard: str = option("forward", "ZeRO-3 with pp>1: forward frees a chunk's gathered "
                                "weights after every forward and backward (gathers per "
                                "microbatch); step keeps them until the chunk's last backward "
                                "(one gather per step, the stage's weights held whole)",
                                choices=ZERO3_RESHARD)

    def __post_init__(self) -> None:
        if self.dp_shard == self.dp and not isinstance(self.dp_shard, bool):
            object.__setattr__(self, "dp_shard", 0)  # shards over every dp rank: plain ZeRO
        if self.schedule in FIXED_VIRTUAL and self.virtual_stages == 1:
            # zb-v always folds the model twice over the stages: say so in the layout itself
            object.__setattr__(self, "virtual_stages", FIXED_VIRTUAL[self.schedule])
        self._check_own_rules()

    @property
    def shard_size(self) -> int:
        """dp ranks in one ZeRO shard group: dp_shard under hybrid sharding, else dp."""
        return self.dp_shard or self.dp

    @property
    def replicas(self) -> int:
        """Copies of the sharded states: dp / dp_shard under hybrid sharding, else 1."""
        return self.dp // self.shard_size

    @property
    def zero_ranks(self) -> int:
        """Ranks ZeRO shards a replicated parameter's states over: the dp x cp ranks holding
        it, or under hybrid sharding the dp_shard x cp of them in one shard group."""
        return self.shard_size * self.cp

    @property
    def hybrid(self) -> bool:
        """Whether ZeRO shards within groups of dp ranks and replicates across them."""
        return self.replicas > 1

    @property
    def placement(self) -> str:
        """How model chunks sit on stages: "v" for zb-v, else "loop" (`schedules.core`)."""
        return placement_of(self.schedule)

    @property
    def checkpoint_group(self) -> int:
        """Blocks per checkpoint of full recompute: a run of them keeps only its input and
        is rebuilt at once in its backward (1 under the block method, or without it)."""
        if self.recompute == "full" and self.recompute_method == "uniform":
            return self.recompute_layers
        return 1

    # ----------------------------------------------------------------- grid arithmetic

    @property
    def degrees(self) -> dict[str, int]:
        """Axis -> degree for every axis of the rank grid, in `AXES` order."""
        return dict(self.grid)

    @property
    def grid(self) -> tuple[tuple[str, int], ...]:
        """`degrees` as (axis, degree) pairs: a key for what the grid alone decides."""
        return axis_pairs(axis_degrees(self))

    @property
    def world_size(self) -> int:
        return math.prod(self.degrees.values())

    def coords(self, rank: int) -> Coords:
        """Global rank -> its index along every axis."""
        return Coords(*grid_index(self.degrees, rank).values())

    def rank(self, **index: int) -> int:
        """Coordinates by name (`dp_rank=1, tp_rank=0`; a missing axis is 0) -> global rank,
        the inverse of `coords`; keywords only, so no call depends on the axes' order."""
        by_axis = {name.removesuffix("_rank"): value for name, value in index.items()}
        unknown = set(by_axis) - set(AXES)
        if unknown:
            raise ParaxisError(f"unknown coordinate {', '.join(sorted(unknown))}; use "
                               f"{', '.join(f'{axis}_rank' for axis in AXES)}")
        return grid_rank(self.degrees, by_axis)

    def groups(self, axis: str) -> list[list[int]]:
        """Every group along one axis ("dp", "tp", "pp", "cp", "ep", "expert_dp": the ranks
        holding the same experts; "cp_a2a", "cp_across": two-level cp's all-to-all groups
        and the groups across them) or several joined by "_" ("dp_tp": every rank of one
        pipeline stage, for ZeRO over dp x tp and loss sums). Each group is in rank order;
        the groups of one axis partition the world."""
        if axis == "ep":
            return expert_groups(self.degrees, self.ep)
        if axis == "expert_dp":
            return expert_dp_groups(self.degrees, self.ep)
        if axis in ("dp_shard", "dp_replicate", "expert_shard"):
            return self._hybrid_groups(axis)
        if axis in ("cp_a2a", "cp_across"):  # two-level cp: each cp group cut both ways
            a, cp_groups = self.cp_a2a, grid_groups(self.degrees, ("cp",))
            if axis == "cp_a2a":  # consecutive cp ranks
                return [group[i:i + a] for group in cp_groups for i in range(0, self.cp, a)]
            return [group[j::a] for group in cp_groups for j in range(a)]
        return grid_groups(self.degrees, tuple(axis.split("_")))

    def _hybrid_groups(self, axis: str) -> list[list[int]]:
        """Hybrid sharding cuts each dp x cp group (dp outer, cp inner) into blocks of
        dp_shard*cp consecutive ranks: "dp_shard" is a block (ZeRO's group), "dp_replicate"
        the ranks at the same place in every block (the replicas of one shard), and
        "expert_shard" the ranks of a block holding the same experts (every ep-th, as
        "expert_dp" is of the whole dp x cp group). Without hybrid sharding a block is the
        whole dp x cp group and every replicate group a single rank."""
        size = self.shard_size * self.cp
        dp_cp = grid_groups(self.degrees, ("dp", "cp"))
        if axis == "dp_replicate":
            return [group[j::size] for group in dp_cp for j in range(size)]
        blocks = [group[i:i + size] for group in dp_cp for i in range(0, len(group), size)]
        if axis == "dp_shard":
            return blocks
        expert_groups(self.degrees, self.ep)  # ep divides dp*cp
        return [block[j::self.ep] for block in blocks for j in range(self.ep)]

    def group_of(self, rank: int, axis: str) -> list[int]:
        """The group along `axis` that contains `rank`."""
        for group in self.groups(axis):
            if rank in group:
                return group
        raise ParaxisError(f"rank {rank} is outside a world of {self.world_size} ranks")

    # ----------------------------------------------------------------------- checking

    def _check_own_rules(self) -> None:
        fields = self.__dict__
        for name in _COUNTS:
            value = fields[name]
            if type(value) is not int or value < 1:  # a bool is no count
                raise ParaxisError(f"layout {name}={value!r} must be a positive integer")
        if (self.dp * self.cp) % self.ep:  # experts are carved out of the dp x cp ranks
            raise ParaxisError(f"ep={self.ep} must divide dp*cp = {self.dp * self.cp}; choose "
                               f"ep among {divisors_text(self.dp * self.cp)}")
        if isinstance(self.dp_shard, bool) or not isinstance(self.dp_shard, int) \
                or self.dp_shard < 0 or (self.dp_shard and self.dp % self.dp_shard):
            raise ParaxisError(f"layout dp_shard={self.dp_shard!r} must divide dp={self.dp} "
                               f"(0: shard over every dp rank); choose dp_shard among "
                               f"{divisors_text(self.dp)}")
        if self.hybrid and self.zero == 0:
            raise ParaxisError(f"dp_shard={self.dp_shard} is the group ZeRO shards within, "
                               "and zero=0 shards nothing; set zero=1, 2 or 3, or drop "
                               "dp_shard")
        if self.hybrid and (self.shard_size * self.cp) % self.ep:
            raise ParaxisError(f"ep={self.ep} must divide dp_shard*cp = "
                               f"{self.shard_size * self.cp} (expert groups sit inside a "
                               f"shard group); choose ep among "
                               f"{divisors_text(self.shard_size * self.cp)}, or a larger "
                               "dp_shard")
        if self.etp not in (1, self.tp):
            raise ParaxisError(f"etp={self.etp} must be 1 (experts whole on every tp rank) or "
                               f"tp={self.tp} (each expert split over the tp ranks); leave etp "
                               f"out, or give tp={self.etp} too to split each expert "
                               f"{self.etp} ways")
        if self.zero not in ZERO_STAGES:
            raise ParaxisError(f"layout zero={self.zero!r} must be one of "
                               f"{', '.join(map(str, ZERO_STAGES))}")
        if self.schedule not in SCHEDULES:
            raise ParaxisError(f"unknown schedule {self.schedule!r}; use one of "
                               f"{', '.join(SCHEDULES)}")
        if self.cp_attention not in CP_ATTENTION:
            raise ParaxisError(f"unknown cp_attention {self.cp_attention!r}; use one of "
                               f"{', '.join(CP_ATTENTION)}")
        inner = [a for a in range(2, self.cp) if self.cp % a == 0] if self.cp_a2a > 1 else ()
        if self.cp_a2a > 1 and not inner:
            raise ParaxisError(f"cp_a2a={self.cp_a2a} needs a cp of 4 or more (a divisor of cp "
                               f"between 1 and cp; cp={self.cp} has none): raise cp, or leave "
                               "cp_a2a out")
        if self.cp_a2a > 1 and self.cp_a2a not in inner:
            raise ParaxisError(f"cp_a2a={self.cp_a2a} must divide cp={self.cp} and be smaller "
                               f"(cp_a2a=cp is cp_attention=all_to_all); choose cp_a2a among "
                               f"{', '.join(map(str, inner))}")
        if self.cp_a2a > 1 and self.cp_attention == "all_to_all":
            raise ParaxisError("cp_attention=all_to_all already splits heads over every cp "
                               "rank; drop cp_a2a, or set cp_attention=ring with it")
        if self.recompute not in RECOMPUTE:
            raise ParaxisError(f"unknown recompute {self.recompute!r}; use one of "
                               f"{', '.join(RECOMPUTE)}")
        if self.recompute_method not in RECOMPUTE_METHODS:
            raise ParaxisError(f"unknown recompute_method {self.recompute_method!r}; use one "
                               f"of {', '.join(RECOMPUTE_METHODS)}")
        if self.recompute_method == "block" and self.recompute != "full":
            raise ParaxisError("recompute_method=block picks the blocks full recompute "
                               "checkpoints; add recompute=full or drop recompute_method")
        if self.recompute_layers > 1 and self.recompute != "full":
            raise ParaxisError(f"recompute_layers={self.recompute_layers} groups the blocks of "
                               "full recompute; add recompute=full or drop recompute_layers")
        if self.schedule in FIXED_VIRTUAL:
            if self.virtual_stages != FIXED_VIRTUAL[self.schedule]:
                raise ParaxisError(f"schedule={self.schedule} runs {FIXED_VIRTUAL[self.schedule]}"
                                   f" chunks per stage, not virtual_stages="
                                   f"{self.virtual_stages}; drop virtual_stages")
        elif self.virtual_stages > 1 and self.schedule != "interleaved":
            raise ParaxisError(f"virtual_stages={self.virtual_stages} needs "
                               "schedule=interleaved; set the schedule or virtual_stages=1")
        if self.virtual_stages > 1 and self.pp == 1:
            # without a pipeline each microbatch runs every layer before its backward: there
            # are no stages to split into chunks, and nothing in flight to interleave
            raise ParaxisError(f"schedule={self.schedule} needs pp > 1 (it runs "
                               f"{self.virtual_stages} model chunks on each pipeline stage); "
                               "raise pp or use schedule=1f1b")
        if self.schedule == "interleaved" and self.pp > 1:
            if self.microbatches % self.pp:
                raise ParaxisError(
                    f"interleaved schedule needs microbatches ({self.microbatches}) to be a "
                    f"multiple of pp ({self.pp}); use microbatches="
                    f"{-(-self.microbatches // self.pp) * self.pp}")
        if self.sequence_parallel and self.tp == 1:
            raise ParaxisError("sequence_parallel needs tp > 1; raise tp or drop "
                               "sequence_parallel")
        if self.zero3_reshard not in ZERO3_RESHARD:
            raise ParaxisError(f"unknown zero3_reshard {self.zero3_reshard!r}; use one of "
                               f"{', '.join(ZERO3_RESHARD)}")

    def validate(self, world_size: int | None = None, model: ModelConfig | None = None,
                 global_batch: int | None = None, seq_len: int | None = None) -> Layout:
        """Check this layout against a world size, a model and a batch; return it unchanged.

        Raises `ParaxisError` with a one-line message naming the rule broken and a fix.
        """
        if world_size is not None and world_size != self.world_size:
            # The grid's degrees (cp only once it is on).
            shown = [axis for axis in ("dp", "cp", "tp", "pp") if axis != "cp" or self.cp > 1]
            raise ParaxisError(
                f"{'*'.join(shown)} = {'*'.join(str(getattr(self, a)) for a in shown)} = "
                f"{self.world_size} but the world has {world_size} ranks; choose degrees "
                f"whose product is {world_size}")
        if model is not None:
            check_model(self, model)  # the shapes each axis splits (`model_splits`)
        if global_batch is not None:
            per_step = self.dp * self.microbatches
            if global_batch < 1 or global_batch % per_step:
                raise ParaxisError(
                    f"global batch {global_batch} is not divisible by dp*microbatches = "
                    f"{self.dp}*{self.microbatches} = {per_step}; use a global batch that is "
                    f"a multiple of {per_step}")
        if seq_len is not None:
            self._check_seq_len(seq_len)
        return self

    def _check_seq_len(self, seq_len: int) -> None:
        """Context parallelism cuts every sequence into 2*cp equal chunks (rank i holds
        chunks i and 2*cp-1-i); sequence parallelism then cuts each rank's seq_len/cp tokens
        into tp contiguous pieces."""
        if self.cp > 1 and self.sequence_parallel and seq_len % (self.cp * self.tp):
            raise ParaxisError(
                f"context parallelism with sequence parallelism needs seq_len ({seq_len}) "
                f"divisible by cp*tp = {self.cp * self.tp}; change seq_len, cp or tp")
        if self.cp > 1 and seq_len % (2 * self.cp):
            raise ParaxisError(f"context parallelism splits each sequence into 2*cp = "
                               f"{2 * self.cp} equal chunks: seq_len {seq_len} is not "
                               f"divisible by {2 * self.cp}; change seq_len or cp")
        if self.sequence_parallel and seq_len % self.tp:
            raise ParaxisError(f"sequence parallelism needs seq_len ({seq_len}) divisible by "
                               f"tp ({self.tp}); change seq_len or tp")

    # ------------------------------------------------------------------ text in / out

    @classmethod
    def parse(cls, text: str) -> Layout:
        """Read "dp=2,tp=2,pp=2,zero=1,schedule=1f1b" (any subset of the fields)."""
        return cls(**cls.parse_fields(text))

    @classmethod
    def parse_fields(cls, text: str) -> dict[str, object]:
        """The fields a layout text sets, read and typed but not yet checked together (a
        partial layout, e.g. schedule=interleaved before the microbatches are chosen)."""
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
            if key in values:
                raise ParaxisError(f"layout {text!r} sets {key} more than once; give each key "
                                   "once")
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
        return values

    def __str__(self) -> str:
        parts = [f"dp={self.dp}", f"tp={self.tp}", f"pp={self.pp}"]
        parts += [f"{axis}={getattr(self, axis)}" for axis in ("cp", "ep", "etp")
                  if getattr(self, axis) > 1]
        if self.cp > 1 and self.cp_attention != "ring":
            parts.append(f"cp_attention={self.cp_attention}")
        if self.cp_a2a > 1:
            parts.append(f"cp_a2a={self.cp_a2a}")
        parts.append(f"zero={self.zero}")
        if self.dp_shard:
            parts.append(f"dp_shard={self.dp_shard}")
        shown = {"zero3_reshard": self.zero3_reshard != "forward",  # the rest: when not default
                 "microbatches": self.pp > 1 or self.microbatches > 1, "schedule": self.pp > 1,
                 "virtual_stages": self.virtual_stages > 1, "recompute": self.recompute != "none",
                 "recompute_method": self.recompute_method != "uniform",
                 "recompute_layers": self.recompute_layers > 1
                 or self.recompute_method != "uniform"}
        parts += [f"{name}={getattr(self, name)}" for name, show in shown.items() if show]
        if self.sequence_parallel:
            parts.append("sequence_parallel=true")
        return ",".join(parts)

    def to_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)

    def replace(self, **changes: object) -> Layout:
        """A copy with `changes`, checked as a new layout is (a search builds 10^4 or more)."""
        if unknown := changes.keys() - _FIELDS:
            raise TypeError(f"Layout has no field {sorted(unknown)[0]!r}")
        new = object.__new__(Layout)
        new.__dict__.update(self.__dict__, **changes)  # frozen: past __setattr__, as __init__
        new.__post_init__()
        return new


_FIELDS = frozenset(f.name for f in dataclasses.fields(Layout))
# the fields that count something: positive integers
_COUNTS = (*AXES, "ep", "etp", "microbatches", "virtual_stages", "recompute_layers", "cp_a2a")
