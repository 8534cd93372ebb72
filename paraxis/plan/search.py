"""Search every layout for a world size and global batch; rank the ones that fit by step time.

Enumerates (tp, pp, cp, dp, zero, microbatch size, recompute, schedule, sequence parallelism),
drops rule-breakers (Layout.validate, with its message) and layouts that do not fit (with their
memory), and returns the fastest. Dominated variants are skipped without pricing: more
recomputation only adds FLOPs, so it is tried only when the lighter setting does not fit.
Context parallelism is tried for long sequences only (`context.MIN_CP_TOKENS` per rank), or
at the degree asked for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from paraxis.context_parallel.balance import check_split
from paraxis.errors import ParaxisError
from paraxis.layout import Layout
from paraxis.model_config import ModelConfig
from paraxis.plan.context import MIN_CP_TOKENS
from paraxis.plan.cost import DEFAULT_OVERLAP, Estimate, Overlap, evaluate
from paraxis.plan.hardware import Cluster
from paraxis.plan.precision import MIXED_ADAM, Precision

MICRO_BATCH_SIZES = (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class Constraints:
    """Limits the user puts on the search (None: free)."""

    max_tp: int | None = None
    max_pp: int | None = None  # --no-pp is max_pp=1
    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    cp: int | None = None
    cp_attention: str = "ring"
    zero: int | None = None
    recompute: tuple[str, ...] = ("none", "selective", "full")
    # GPipe has 1F1B's bubble but holds every microbatch, and SP has the same traffic as TP
    # without it but less memory: both are dominated, so they are left out unless asked for.
    schedules: tuple[str, ...] = ("1f1b", "interleaved")
    sequence_parallel: tuple[bool, ...] = (True,)
    tp_within_node: bool = False  # forbid TP groups that cross nodes
    # model chunks per device tried for interleaved (None: 2 and 4 where the layers split
    # evenly into them, else the smallest depth that splits them)
    virtual_stages: tuple[int, ...] | None = None
    micro_batch: int | None = None  # sequences per microbatch (None: try MICRO_BATCH_SIZES)


@dataclass(frozen=True)
class Rejection:
    layout: Layout
    reason: str
    estimate: Estimate | None = None  # priced, but did not fit


@dataclass
class SearchResult:
    ranked: list[Estimate]  # every fitting layout, fastest first
    rule_breakers: list[Rejection] = field(default_factory=list)
    too_big: list[Rejection] = field(default_factory=list)  # fastest first
    considered: int = 0

    def top(self, k: int) -> list[Estimate]:
        return self.ranked[:k]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def check_interleaving(layout: Layout, cfg: ModelConfig) -> None:
    """Interleaving prices equal model chunks: the layers must split evenly into pp x v
    chunks (Megatron-LM refuses other depths; Narayanan et al. 2021 Sec. 2.2 assumes it)."""
    chunks = layout.pp * layout.virtual_stages
    if layout.virtual_stages > 1 and cfg.n_layers % chunks:
        fits = [v for v in range(2, cfg.n_layers // layout.pp + 1)
                if cfg.n_layers % (layout.pp * v) == 0]
        raise ParaxisError(
            f"{cfg.n_layers} layers do not split into pp*virtual_stages = {chunks} equal "
            f"chunks ({cfg.n_layers / chunks:g} layers each); use virtual_stages among "
            f"{fits[:6] or 'none: no interleaving at this pp'}")


def _interleaving_depths(n_layers: int, pp: int, constraints: Constraints) -> tuple[int, ...]:
    if constraints.virtual_stages is not None:
        return constraints.virtual_stages  # given: a depth that does not split is refused
    even = [v for v in range(2, n_layers // pp + 1) if n_layers % (pp * v) == 0]
    return tuple(v for v in even if v in (2, 4)) or tuple(even[:1])


def _schedule_variants(pp: int, microbatches: int, constraints: Constraints,
                       n_layers: int) -> list[tuple[str, int]]:
    if pp == 1:
        return [("1f1b", 1)]
    variants = []
    for kind in constraints.schedules:
        if kind == "interleaved":
            variants += [(kind, v) for v in _interleaving_depths(n_layers, pp, constraints)
                         if v > 1 and microbatches % pp == 0]
        else:
            variants.append((kind, 1))
    return variants


def _constraints_text(c: Constraints) -> str:
    given = [f"{name}={getattr(c, name)}" for name in ("tp", "pp", "dp", "cp", "max_tp",
                                                        "max_pp")
             if getattr(c, name) is not None]
    return ", ".join(given + (["tp_within_node"] if c.tp_within_node else [])) or "none"


def search(cfg: ModelConfig, cluster: Cluster, seq_len: int, global_batch: int,
           constraints: Constraints = Constraints(), precision: Precision = MIXED_ADAM,
           overlap: Overlap = DEFAULT_OVERLAP) -> SearchResult:
    world = cluster.world_size
    if global_batch < 1:
        raise ParaxisError(f"global batch {global_batch} must be at least 1")
    if seq_len < 1:
        raise ParaxisError(f"sequence length {seq_len} must be at least 1")
    c = constraints
    if c.cp is not None:
        check_split(seq_len, c.cp)  # a cp that cannot split the sequence: say that, first
    result = SearchResult([])
    axis_shapes = []
    for tp in _divisors(world):
        if (c.max_tp and tp > c.max_tp) or (c.tp and tp != c.tp):
            continue
        if c.tp_within_node and tp > cluster.gpus_per_node:
            continue
        for pp in _divisors(world // tp):
            if (c.max_pp and pp > c.max_pp) or (c.pp and pp != c.pp):
                continue
            for cp in _cp_degrees(world // (tp * pp), seq_len, c):
                dp = world // (tp * pp * cp)
                if c.dp and dp != c.dp:
                    continue
                shape = Layout(dp=dp, tp=tp, pp=pp, cp=cp, cp_attention=c.cp_attention)
                try:
                    shape.validate(world, cfg)
                except ParaxisError as error:
                    result.rule_breakers.append(Rejection(shape, str(error)))
                    continue
                if global_batch % dp:
                    result.rule_breakers.append(Rejection(
                        shape, f"global batch {global_batch} does not split over dp={dp}"))
                    continue
                axis_shapes.append(shape)
    if not axis_shapes:
        reasons = "; ".join(sorted({r.reason for r in result.rule_breakers})[:3])
        if not reasons:  # nothing broke a rule: the constraints left no shape to try
            raise ParaxisError(f"no (dp, cp, tp, pp) for {world} GPUs is allowed by the "
                               f"constraints ({_constraints_text(c)}); relax them")
        raise ParaxisError(f"no (dp, cp, tp, pp) for {world} GPUs satisfies the rules: "
                           f"{reasons}")

    zeros = (c.zero,) if c.zero is not None else (0, 1, 2, 3)
    for shape in axis_shapes:
        dp, tp, pp = shape.dp, shape.tp, shape.pp
        per_replica = global_batch // dp
        for zero, reshard in _zero_choices(zeros, pp):
            if zero > 0 and dp * shape.cp == 1 and c.zero is None:
                continue  # sharding over one rank changes nothing
            for micro_batch in (c.micro_batch,) if c.micro_batch else MICRO_BATCH_SIZES:
                if per_replica % micro_batch:
                    continue
                microbatches = per_replica // micro_batch
                for kind, virtual in _schedule_variants(pp, microbatches, c,
                                                         cfg.n_layers):
                    for sp in c.sequence_parallel if tp > 1 else (False,):
                        for recompute in c.recompute:
                            try:
                                layout = shape.replace(
                                    zero=zero, zero3_reshard=reshard,
                                    microbatches=microbatches, schedule=kind,
                                    virtual_stages=virtual, recompute=recompute,
                                    sequence_parallel=sp)
                                layout.validate(world, cfg, global_batch, seq_len)
                                check_interleaving(layout, cfg)
                            except ParaxisError as error:
                                result.rule_breakers.append(Rejection(shape, str(error)))
                                break
                            result.considered += 1
                            estimate = evaluate(cfg, layout, cluster, seq_len, global_batch,
                                                precision, overlap)
                            if estimate.fits:
                                result.ranked.append(estimate)
                                break  # heavier recomputation would only be slower
                            result.too_big.append(Rejection(
                                layout, too_big_reason(estimate), estimate))
    result.ranked.sort(key=_rank_key)
    result.too_big.sort(key=lambda r: r.estimate.step_time_s if r.estimate else 0.0)
    return result


def _zero_choices(zeros: tuple[int, ...], pp: int) -> list[tuple[int, str]]:
    """(ZeRO stage, zero3_reshard) pairs to try: under a pipeline ZeRO-3 either gathers a
    chunk per microbatch or keeps it for the step (`pipeline_parallel/zero3.py`)."""
    return [(zero, reshard) for zero in zeros
            for reshard in (("forward", "step") if zero == 3 and pp > 1 else ("forward",))]


def _cp_degrees(ranks: int, seq_len: int, c: Constraints) -> list[int]:
    """Context-parallel degrees to try with `ranks` left for dp x cp: the one asked for, else
    1 and every divisor that splits the sequence into 2*cp equal chunks of at least
    `MIN_CP_TOKENS` / 2 tokens (each rank keeping `MIN_CP_TOKENS` or more)."""
    if c.cp is not None:
        return [c.cp] if ranks % c.cp == 0 else []
    return [cp for cp in _divisors(ranks) if cp == 1 or (
        seq_len % (2 * cp) == 0 and seq_len // cp >= MIN_CP_TOKENS)]


def too_big_reason(estimate: Estimate) -> str:
    """Why a layout does not fit, naming what takes the memory: the model states, or the
    activations of how many sequences per microbatch."""
    memory, layout = estimate.memory, estimate.layout
    states = memory["params"] + memory["grads"] + memory["optimizer"]
    if memory["activations"] >= states:
        what = (f"{memory['activations'] / 1e9:.1f} GB of it activations of "
                f"{estimate.micro_batch}-sequence microbatches of {estimate.seq_len} tokens "
                f"(recompute={layout.recompute})")
    else:
        what = f"{states / 1e9:.1f} GB of it model states (ZeRO-{layout.zero})"
    return (f"needs {memory['total'] / 1e9:.1f} GB per GPU > "
            f"{estimate.memory_limit_bytes / 1e9:.0f} GB, {what}")


RECOMPUTE_ORDER = {"none": 0, "selective": 1, "full": 2}


def _rank_key(estimate: Estimate) -> tuple:
    """Fastest first; times within 0.5% count as equal and the simpler layout wins (fewer
    model- and context-parallel ranks, lower ZeRO stage, less recomputation), then the
    smaller footprint."""
    layout = estimate.layout
    bucket = round(math.log(estimate.step_time_s) / math.log(1.005))
    return (bucket, layout.tp * layout.pp * layout.cp, layout.zero,
            RECOMPUTE_ORDER[layout.recompute], layout.virtual_stages, estimate.memory["total"])
