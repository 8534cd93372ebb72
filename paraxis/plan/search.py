"""Search every layout for a world size and global batch; rank the ones that fit by step time.

Enumerates (tp, pp, cp, dp, ep, zero, microbatch size, recompute, schedule, sequence
parallelism), drops rule-breakers (Layout.validate, with its message) and layouts that do not
fit (with their memory), and returns the fastest. Dominated variants are skipped without
pricing: more recomputation only adds FLOPs, so it is tried only when the lighter setting does
not fit. Context parallelism is tried for long sequences only (`context.MIN_CP_TOKENS` per
rank), or at the degree asked for, its K/V exchange variants compared per shape
(`cp_variants.py`). Expert parallelism (mixtures of experts) is tried at every degree that
divides dp*cp and the experts while its group stays in a node; beyond the node, only until
one fits (a larger group sends more of every all-to-all over the network). A layout whose
floor (`floor.step_lower_bound`) is slower than all the answer shows is skipped (`prune.py`);
a large search is split over processes (`workers.py`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from paraxis.plan.constraints import Constraints, why_no_shape
from paraxis.plan.context import MIN_CP_TOKENS
from paraxis.plan.cost import (
    DEFAULT_OVERLAP,
    Estimate,
    Overlap,
    evaluate,
    too_big_reason,
)
from paraxis.plan.cp_variants import other_variants
from paraxis.plan.experts import DEFAULT_IMBALANCE, check_ep, ep_link
from paraxis.plan.floor import Floors, variants_floor
from paraxis.plan.fp8 import runtime_precision
from paraxis.plan.hardware import Cluster
from paraxis.plan.memory import (
    pipeline_zero2_whole_grads,
    stage_local_params,
    stage_states,
)
from paraxis.plan.prune import Bound, Fits, ep_group
from paraxis.plan.ranking import rank
from paraxis.plan.rates import check_precision, for_precision
from paraxis.plan.settings import (
    SmallerSizes,
    build_setting,
    chunked_only,
    every_variant,
    fits_at_some_setting,
    lightest_left,
    recompute_steps,
    schedule_variants,
    size_settings,
    sp_choices,
)
from paraxis.plan.uncertainty import error_band
from paraxis.plan.workers import LEAD_GROUPS, Tickets, grouped, run_forked, worker_count
from paraxis.spec.cp_balance import check_split
from paraxis.spec.errors import ParaxisError
from paraxis.spec.grid import divisors
from paraxis.spec.kernels import fused_loss_problem
from paraxis.spec.layout import ZERO_STAGES, Layout
from paraxis.spec.model_config import ModelConfig
from paraxis.spec.model_splits import ep_splits, etp_splits
from paraxis.spec.precision import MIXED_ADAM, Precision, fp8_shape_problem


@dataclass(frozen=True)
class Rejection:
    layout: Layout
    reason: str
    estimate: Estimate | None = None  # priced, but did not fit


@dataclass
class SearchResult:
    # the fitting layouts priced, fastest first: every one the answer shows (`prune.py`)
    ranked: list[Estimate]
    rule_breakers: list[Rejection] = field(default_factory=list)
    too_big: list[Rejection] = field(default_factory=list)  # fastest first
    considered: int = 0  # layouts priced
    skipped: int = 0  # not priced: their floor is slower than anything the answer shows
    constraints: Constraints = Constraints()  # what the search was asked

    def top(self, k: int) -> list[Estimate]:
        return self.ranked[:k]


def search(cfg: ModelConfig, cluster: Cluster, seq_len: int, global_batch: int,
           constraints: Constraints = Constraints(), precision: Precision = MIXED_ADAM,
           overlap: Overlap = DEFAULT_OVERLAP,
           expert_imbalance: float = DEFAULT_IMBALANCE, keep: int = 6,
           exhaustive: bool = False, workers: int | None = None) -> SearchResult:
    """Every layout the constraints allow priced, but those whose floor is slower than all
    the answer shows (the `keep` fastest, the ties, rivals: `prune.py`) unless `exhaustive`;
    a large search split over `workers` processes (None: `workers.worker_count`)."""
    check_precision(cluster.gpu, precision)
    cluster = for_precision(cluster, precision)  # its floors too, as `evaluate` prices it
    world = cluster.world_size
    if global_batch < 1:
        raise ParaxisError(f"global batch {global_batch} must be at least 1")
    if seq_len < 1:
        raise ParaxisError(f"sequence length {seq_len} must be at least 1")
    c = constraints
    if c.cp is not None:
        check_split(seq_len, c.cp)  # a cp that cannot split the sequence: say that, first
    if c.ep is not None:
        check_ep(cfg, Layout(dp=c.ep, ep=c.ep))  # a dense model, or experts ep cannot split
    result = SearchResult([], constraints=c)
    axis_shapes = _axis_shapes(cfg, cluster, seq_len, global_batch, c, precision, result)
    # ZeRO-3 settings that fit keeping chunks, by the shape's id (it lives as long as the search)
    kept: set[tuple[int, int, int, tuple]] = set()
    zeros = _zero_stages(c, axis_shapes, cluster)
    memo: dict = {}  # per-layer times, shared by layouts that differ in ZeRO or schedule
    bound = Bound(error_band(cluster).rms, keep, cluster.gpus_per_node)
    floors = Floors(cfg, cluster, seq_len, global_batch, precision, overlap, expert_imbalance,
                    memo)
    fits = Fits(cfg, cluster, seq_len, global_batch, precision, expert_imbalance)
    fitted_across_nodes: set[tuple[int, ...]] = set()  # shapes whose EP group left the node
    crosses: dict[tuple[int, ...], bool] = {}
    build = functools.partial(build_setting, cfg, world, global_batch, seq_len)
    if not exhaustive:  # best first: the bound tightens sooner (its answer is the same)
        axis_shapes = floors.best_first(axis_shapes, c.micro_batch or 1, lambda s, m: (
            sp_choices(c, s.tp), schedule_variants(s.pp, m, c, cfg.n_layers)), ep_group,
            _lightest_fit(fits, build, zeros[-1], c, cluster, cfg.n_layers))

    def visit(shape: Layout) -> None:
        """Price or skip `shape`'s ZeRO settings, microbatch sizes and their settings."""
        dp, tp, pp = shape.dp, shape.tp, shape.pp
        ep_key = ep_group(shape)
        grid = (dp, tp, pp, shape.cp, shape.ep)  # where its EP groups lie, either expert split
        if grid not in crosses:
            crosses[grid] = shape.ep > 1 and ep_link(shape, cluster).crosses_nodes
        across = crosses[grid]
        if across and ep_key in fitted_across_nodes:
            return  # a smaller ep already fits: more only sends more over the network
        if cfg.is_moe and _states_overflow(cfg, shape, cluster, precision, zeros, seq_len):
            return  # its model states alone overflow at the deepest ZeRO: a larger ep
        per_replica = global_batch // dp
        for zero, reshard, dp_shard in _zero_choices(zeros, pp, shape, cluster, c):
            if zero > 0 and dp * shape.cp == 1 and c.zero is None:
                continue  # sharding over one rank changes nothing
            base = shape.replace(zero=zero, zero3_reshard=reshard, dp_shard=dp_shard)
            # every size dividing a replica's batch (not only powers of 2), smallest first
            sizes = (c.micro_batch,) if c.micro_batch else divisors(per_replica)
            smaller = SmallerSizes(functools.partial(fits_at_some_setting, fits, build,
                                                     shape, base, per_replica, c, cfg))
            # Settings (schedule, depth, SP, recompute) too big at a smaller size: not priced
            # again, a larger microbatch holds more. A pipeline's ZeRO-2 that reduces once a
            # step holds the stage's whole gradients beside its shards over two or more
            # microbatches, not over one (`memory.layout_memory`): that size may fit again.
            outgrown: set[tuple] = set()
            whole_grads = functools.partial(pipeline_zero2_whole_grads, cfg, zero, pp,
                                            cluster.gpu.pipeline_zero2_reduce)
            dips = whole_grads(2) and not whole_grads(1)
            every = every_variant(pp, c, cfg.n_layers)  # for the floor of the larger sizes
            for micro_batch in sizes:
                if per_replica % micro_batch:
                    continue
                grows = not dips or per_replica // micro_batch > 1
                if smaller.outgrows(micro_batch, grows):
                    if dips:
                        continue  # but the size of one microbatch a step
                    break  # a larger microbatch holds more activations: it cannot fit either
                too_big_here, fits_here = False, False
                skipped: list[tuple] = []  # settings whose heavier recomputations were skipped
                microbatches = per_replica // micro_batch
                learn = across and ep_key not in fitted_across_nodes
                sps = sp_choices(c, tp)
                if not exhaustive and not learn and bound.hides(floors.tail(
                        shape, base, microbatches, sps, every,
                        "none" if dips else lightest_left(outgrown, every, c, cfg, shape)),
                        base):
                    result.skipped += 1  # every setting of this size and of the larger ones
                    break
                variants = schedule_variants(pp, microbatches, c, cfg.n_layers)
                lightest = lightest_left(outgrown, variants, c, cfg, shape) if grows else "none"
                if not exhaustive and not learn and bound.hides(floors.coarse(
                        shape, base, micro_batch, microbatches, sps, variants, lightest), base):
                    result.skipped += 1  # every setting of this size is slower
                    continue
                abandoned = False  # the first rule's, asked where a layout is about to be priced
                for kind, virtual, sp in size_settings(shape, variants, c, cfg):
                    learn = across and ep_key not in fitted_across_nodes
                    steps = recompute_steps(c, cfg.n_layers, pp, virtual)
                    for step in steps:
                        if grows and (kind, virtual, sp, step) in outgrown:
                            too_big_here = True
                            continue
                        settings = (micro_batch, kind, virtual, sp, step)
                        if reshard == "forward" and (id(shape), zero, dp_shard, settings) in kept:
                            fits_here = True  # kept whole, a variant of this size fits
                            break  # keeping the chunk fit: regathering is only slower
                        floor = 0.0 if exhaustive else floors.of(  # or heavier's
                            shape, base, microbatches, kind, virtual, sp, step.floor)
                        # Its floor above all the answer shows of the layouts that fit
                        # (slow) and too big (slow_if_big): not priced (but across nodes
                        # until one fits, above); above one, priced if its memory says so
                        slow = floor > bound.limit(base)
                        slow_if_big = floor > bound.too_big_limit() and bound.families_fit(base)
                        if slow and slow_if_big and not learn:
                            result.skipped += 1  # and its heavier recomputations, slower
                            skipped.append((kind, virtual, sp, step))
                            break
                        if slow_if_big and fits.known_too_big(shape, base, (
                                microbatches, kind, virtual, sp, step)):
                            result.skipped += 1
                            too_big_here = True
                            outgrown.add((kind, virtual, sp, step))
                            continue
                        if smaller.outgrows(micro_batch, grows, ask=True):
                            abandoned = True
                            break
                        try:
                            layout = build(base, microbatches, kind, virtual, sp, step)
                        except ParaxisError as error:
                            result.rule_breakers.append(Rejection(shape, str(error)))
                            break
                        if slow or slow_if_big:
                            if fits(shape, layout):
                                if slow:  # it fits: heavier recomputation is slower
                                    fits_here = True
                                    if across:
                                        fitted_across_nodes.add(ep_key)
                                    result.skipped += 1
                                    break
                            elif slow_if_big:
                                result.skipped += 1
                                too_big_here = True
                                outgrown.add((kind, virtual, sp, step))
                                continue
                        if step.method == "block" and step != steps[-1] and not fits(shape,
                                                                                    layout):
                            # on the way to the fewest blocks that fit: memory alone
                            too_big_here = True
                            outgrown.add((kind, virtual, sp, step))
                            continue
                        result.considered += 1
                        estimate = evaluate(cfg, layout, cluster, seq_len, global_batch,
                                            runtime_precision(precision, zero), overlap,
                                            expert_imbalance, memo, fits.memory(layout))
                        bound.add(estimate)
                        if estimate.fits:
                            fits_here = True
                            if reshard == "step":
                                kept.add((id(shape), zero, dp_shard, settings))
                            result.ranked.append(estimate)
                            if across:
                                fitted_across_nodes.add(ep_key)
                            break  # heavier recomputation would only be slower
                        result.too_big.append(Rejection(
                            layout, too_big_reason(estimate), estimate))
                        too_big_here = True
                        outgrown.add((kind, virtual, sp, step))
                    if abandoned:
                        break
                if abandoned:
                    if dips:
                        continue
                    break
                smaller.add(micro_batch, fits_here, too_big_here and grows, skipped)
    count = 1 if exhaustive else workers or worker_count(len(axis_shapes))
    if count > 1:
        _visit_split(axis_shapes, visit, result, bound, count)
    else:
        for shape in axis_shapes:
            visit(shape)
    args = (cluster, seq_len, global_batch, precision, overlap, expert_imbalance, memo)
    siblings = other_variants(  # a layout's cp variants share a floor
        result.ranked, c.cp_attention, c.cp_a2a, cfg, world, lambda l: evaluate(
            cfg, l, cluster, seq_len, global_batch, runtime_precision(precision, l.zero),
            *args[4:]),
        lambda e: exhaustive or not bound.hides(variants_floor(cfg, e, *args), e.layout))
    result.considered += len(siblings)
    result.ranked += [e for e in siblings if e.fits]
    result.too_big += [Rejection(e.layout, too_big_reason(e), e) for e in siblings if not e.fits]
    result.ranked = rank(result.ranked)
    result.too_big.sort(key=lambda r: r.estimate.step_time_s if r.estimate else 0.0)
    return result


def _axis_shapes(cfg: ModelConfig, cluster: Cluster, seq_len: int, global_batch: int,
                 c: Constraints, precision: Precision, result: SearchResult) -> list[Layout]:
    """Each (dp, tp, pp, cp, ep, expert split) the constraints allow, as a Layout; those a rule
    forbids go to `result.rule_breakers` (none allowed: one line naming the rules)."""
    world = cluster.world_size
    axis_shapes = []
    for tp in divisors(world):
        if (c.max_tp and tp > c.max_tp) or (c.tp and tp != c.tp) or (c.fused_loss and tp > 1):
            continue
        if c.tp_within_node and tp > cluster.gpus_per_node:
            continue
        for pp in divisors(world // tp):
            if (c.max_pp and pp > c.max_pp) or (c.pp and pp != c.pp):
                continue
            for cp in _cp_degrees(world // (tp * pp), seq_len, c):
                dp = world // (tp * pp * cp)
                if c.dp and dp != c.dp:
                    continue
                variant = c.cp_attention[0] if cp > 1 else "ring"  # the others: cp_variants.py
                shape = Layout(dp=dp, tp=tp, pp=pp, cp=cp, cp_attention=variant)
                try:
                    shape = shape.replace(cp_a2a=c.cp_a2a or 1).validate(world, cfg)
                except ParaxisError as error:
                    result.rule_breakers.append(Rejection(shape, str(error)))
                    continue
                if global_batch % dp:
                    result.rule_breakers.append(Rejection(
                        shape, f"global batch {global_batch} does not split over dp={dp}"))
                    continue
                for ep in _ep_degrees(cfg, dp * cp, c):
                    for split in _expert_splits(cfg, tp, c):
                        split_shape = shape.replace(ep=ep, etp=tp if split else 1)
                        if problem := _fp8_problem(cfg, split_shape, precision):
                            result.rule_breakers.append(Rejection(split_shape, problem))
                        else:
                            axis_shapes.append(split_shape)
    if chunked_only(c) and axis_shapes and all(s.pp == 1 for s in axis_shapes):
        forbids = "--no-pp (or --max-pp 1) forbids" if c.max_pp == 1 else \
            f"{world} GPU(s) here do not allow"
        raise ParaxisError(f"schedule {'/'.join(c.schedules)} needs pp > 1, which {forbids}; "
                           "give more GPUs, allow pp, or 1f1b")
    if not axis_shapes:
        # one of each rule broken (the same rule at other degrees says nothing new)
        kinds: dict[str, str] = {}
        for reason in sorted({r.reason for r in result.rule_breakers}):
            kinds.setdefault(re.sub(r"\d+", "N", reason), reason)
        reasons = "; ".join(list(kinds.values())[:3])
        if not reasons:  # nothing broke a rule: the constraints left no shape to try
            raise ParaxisError(why_no_shape(c, world, cluster.gpus_per_node))
        raise ParaxisError(f"no (dp, cp, tp, pp) for {world} GPUs satisfies the rules: "
                           f"{reasons}")
    return axis_shapes


def _zero_stages(c: Constraints, axis_shapes: list[Layout], cluster: Cluster) -> tuple[int, ...]:
    """The ZeRO stages to try; a dp_shard no shape and stage can make is one line."""
    zeros = (c.zero,) if c.zero is not None else ZERO_STAGES
    if c.fused_loss:  # the runtime's fused loss: tp 1, ZeRO 0-2
        zeros = tuple(z for z in zeros if fused_loss_problem(1, z) is None)
    if not any(_shard_choices(zero, shape, cluster, c) for shape in axis_shapes
               for zero in zeros):  # a shard group no shape can make, or ZeRO ruled out
        dps = ", ".join(map(str, sorted({shape.dp for shape in axis_shapes})))
        allowed = "/".join(map(str, zeros))
        raise ParaxisError(f"dp_shard={c.dp_shard} shards ZeRO's states over groups of that "
                           f"many dp ranks: it needs ZeRO (zero >= 1; zero={allowed} allowed "
                           f"here) and a dp it divides (dp here: {dps}); choose another "
                           "dp_shard or leave it out")
    return zeros


def _visit_split(shapes: list[Layout], visit: Callable[[Layout], None], result: SearchResult,
                 bound: Bound, count: int) -> None:
    """`visit` every shape, the first groups here, then the rest over `count` processes,
    each taking the next group left (`workers.py`); what each priced added to `result` and
    `bound`."""
    groups = grouped(shapes, ep_group)
    for group in groups[:LEAD_GROUPS]:
        for shape in group:
            visit(shape)
    marks = (len(result.ranked), len(result.too_big), len(result.rule_breakers),
             result.considered, result.skipped)
    tickets = Tickets()

    def visit_left() -> tuple:
        while (index := LEAD_GROUPS + tickets.take()) < len(groups):
            for shape in groups[index]:
                visit(shape)
        return (result.ranked[marks[0]:], result.too_big[marks[1]:],
                result.rule_breakers[marks[2]:], result.considered - marks[3],
                result.skipped - marks[4])

    for ranked, too_big, breakers, considered, skipped in run_forked(visit_left, count)[1:]:
        result.ranked += ranked
        result.too_big += too_big
        result.rule_breakers += breakers
        result.considered += considered
        result.skipped += skipped
        for estimate in ranked + [r.estimate for r in too_big if r.estimate is not None]:
            bound.add(estimate)  # for the cp variants priced after (`cp_variants.py`)


def _fp8_problem(cfg: ModelConfig, shape: Layout, precision: Precision) -> str | None:
    """Why the runtime's FP8 GEMMs cannot run `shape`'s tensor-parallel split of `cfg`
    (`spec.precision.fp8_shape_problem`, which `paraxis train` asks too); None when they can
    or no FP8 is priced."""
    if precision.fp8_recipe is None:
        return None
    name = "fp8-rowwise" if precision.fp8_recipe == "rowwise" else "fp8"
    return fp8_shape_problem(cfg, shape.tp, shape.etp, name)


def _lightest_fit(fits: Fits, build: Callable[..., Layout], zero: int, c: Constraints,
                  cluster: Cluster, n_layers: int) -> Callable[..., tuple[str, Layout] | None]:
    """For `Floors.best_first`: the lightest recomputation at which `shape` fits at these
    settings under the deepest ZeRO stage searched, as the search tries it first (none over
    one rank), and that layout; None where none fits or the settings break a rule."""
    def lightest(shape: Layout, microbatches: int, kind: str, virtual: int, sp: bool
                 ) -> tuple[str, Layout] | None:
        sharded = zero if shape.dp * shape.cp > 1 or c.zero is not None else 0
        choices = _zero_choices((sharded,), shape.pp, shape, cluster, c)
        if not choices:
            return None
        _, reshard, dp_shard = choices[0]
        base = shape.replace(zero=sharded, zero3_reshard=reshard, dp_shard=dp_shard)
        for step in recompute_steps(c, n_layers, shape.pp, virtual):
            try:
                layout = build(base, microbatches, kind, virtual, sp, step)
            except ParaxisError:
                return None
            if fits(shape, layout):
                return step.floor, layout
        return None
    return lightest


def _zero_choices(zeros: tuple[int, ...], pp: int, shape: Layout, cluster: Cluster,
                  c: Constraints) -> list[tuple[int, str, int]]:
    """(ZeRO stage, zero3_reshard, dp_shard) to try: under a pipeline ZeRO-3 either keeps a
    chunk gathered for the step or gathers it per microbatch (`pipeline_parallel/zero3.py`).
    Keeping is tried first: where it fits, gathering again would only be slower. Each stage
    shards over every dp rank and, where that spans nodes, within one node (hybrid
    sharding, `_node_shard`)."""
    return [(zero, reshard, dp_shard) for zero in zeros
            for reshard in (("step", "forward") if zero == 3 and pp > 1 else ("forward",))
            for dp_shard in _shard_choices(zero, shape, cluster, c)]


def _shard_choices(zero: int, shape: Layout, cluster: Cluster, c: Constraints
                   ) -> tuple[int, ...]:
    """dp_shard values to try: the one asked for; else every dp rank (0) and, with ZeRO, the
    shard group that fills one node: the most dp ranks whose dp_shard x cp x tp consecutive
    ranks fit in a node, when fewer than dp and holding whole expert groups."""
    if c.dp_shard is not None:
        if c.dp_shard == 0:
            return (0,)
        if not zero or shape.dp % c.dp_shard:  # shard groups of that size need ZeRO
            return ()
        return (0 if c.dp_shard == shape.dp else c.dp_shard,)
    if not zero:
        return (0,)
    per_rank = shape.cp * shape.tp
    # a shard group of one rank (cp = 1) shards nothing: it is ZeRO-0 with extra steps
    fits = [d for d in divisors(shape.dp) if d * per_rank <= cluster.gpus_per_node
            and (d * shape.cp) % shape.ep == 0 and d * shape.cp > 1]
    return (0, max(fits)) if fits and max(fits) < shape.dp else (0,)


def _cp_degrees(ranks: int, seq_len: int, c: Constraints) -> list[int]:
    """Context-parallel degrees to try with `ranks` left for dp x cp: the one asked for, else
    1 and every divisor that splits the sequence into 2*cp equal chunks of at least
    `MIN_CP_TOKENS` / 2 tokens (each rank keeping `MIN_CP_TOKENS` or more)."""
    if c.cp is not None:
        return [c.cp] if ranks % c.cp == 0 else []
    return [cp for cp in divisors(ranks) if cp == 1 or (
        seq_len % (2 * cp) == 0 and seq_len // cp >= MIN_CP_TOKENS)]


def _states_overflow(cfg: ModelConfig, shape: Layout, cluster: Cluster, precision: Precision,
                     zeros: tuple[int, ...], seq_len: int) -> bool:
    """Whether a mixture of experts' model states alone exceed a GPU on some stage at the
    deepest ZeRO stage allowed: no microbatch or recomputation can make the shape fit, so its
    ep is skipped unpriced (a search of 1024 GPUs would otherwise price thousands)."""
    # (ZeRO-3 alone under a pipeline: its states, regathered per microbatch, at the least)
    zero = max((z for z in zeros if z < 3 or shape.pp == 1), default=3)
    worst = max(sum(bytes_ for _, bytes_ in stage_states(
        round(local), round(experts), shape.dp * shape.cp, shape.ep, zero, precision))
        for local, experts in stage_local_params(cfg, shape, seq_len))
    return worst + cluster.gpu.reserved_bytes > cluster.gpu.memory_bytes


def _ep_degrees(cfg: ModelConfig, ranks: int, c: Constraints) -> list[int]:
    """Expert-parallel degrees to try with `ranks` = dp*cp: the one asked for, else every
    divisor of dp*cp that splits the experts evenly (1 alone for a dense model). EP groups
    that leave the node are tried smallest first, and only until one fits (search)."""
    if c.ep is not None:
        return [c.ep] if ranks % c.ep == 0 else []
    return [ep for ep in divisors(ranks) if ep_splits(cfg, ep)]


def _expert_splits(cfg: ModelConfig, tp: int, c: Constraints) -> tuple[bool, ...]:
    """Whether to split the experts over tp (etp = tp), where there are experts, tp > 1 to
    split them over and their width divides by tp (else whole): the choices asked for. By
    default split, and whole too where SP is among the choices and routing is dropless
    (`expert_placement.experts_on_sequence_shards`): each tp rank then routes its own shard, which
    computes 1/tp of the expert work as splitting does, with wider GEMMs and no collective
    around the block, but holds every expert whole and sums their gradients over tp. Without
    SP whole experts repeat the work on every tp rank: left out unless asked for."""
    if tp == 1 or not cfg.is_moe or not etp_splits(cfg, tp):
        return (False,)
    if c.split_experts is not None:
        return c.split_experts
    return (True, False) if True in c.sequence_parallel and not cfg.capacity_factor else (True,)


def closest_to_fitting(result: SearchResult) -> Estimate | None:
    """The priced layout needing the least memory per GPU, where none fits (None: none)."""
    priced = [r.estimate for r in result.too_big if r.estimate is not None]
    return min(priced, key=lambda e: e.memory["total"], default=None)
