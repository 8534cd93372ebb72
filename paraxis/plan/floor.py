"""Floors under a layout's step time, for the search to skip layouts on (`prune.py`).

`evaluate` prices a layout whole; a floor costs a fraction of that and is never above it:
the pipeline without recomputation (which only adds), as fast as any cp variant runs it
(no K/V exchange exposed, the attention core at the fastest variant's kernel rate), plus
the recomputed forward's compute, the optimizer step and the step's small calls; the
gradient sync and the experts' gradient sum over tp, which only add, are left out.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from paraxis.plan.bubble import bubble_floor, bubble_holds
from paraxis.plan.compute import PARAXIS_KERNELS
from paraxis.plan.cost import (
    EXPOSED_COMM,
    Estimate,
    calls_time,
    optimizer_seconds,
    pipeline_time,
    rerun_floors,
)
from paraxis.plan.experts import DEFAULT_IMBALANCE
from paraxis.plan.hardware import Cluster
from paraxis.plan.layer_cost import block_times, core_share_of_fastest
from paraxis.plan.memory import check_interleaving
from paraxis.plan.rates import DEFAULT_OVERLAP, Overlap, overlap_on
from paraxis.plan.stages import stage_kinds
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import RECOMPUTE, Layout
from paraxis.spec.model_config import ModelConfig
from paraxis.spec.precision import MIXED_ADAM, Precision
from paraxis.spec.schedules import placement_of


def step_lower_bound(cfg: ModelConfig, layout: Layout, cluster: Cluster, seq_len: int,
                     global_batch: int, precision: Precision = MIXED_ADAM,
                     overlap: Overlap = DEFAULT_OVERLAP,
                     expert_imbalance: float = DEFAULT_IMBALANCE,
                     memo: dict | None = None) -> float:
    """A floor under `evaluate(...).step_time_s` for `layout` at any recomputation and any
    cp variant (`pipeline_floors`), plus its optimizer step and the step's own small calls;
    the gradient sync and the experts' gradient sum over tp, which only add, are left out.
    The search skips a layout whose floor is above all its answer shows (`prune.py`)."""
    memo = {} if memo is None else memo
    return (pipeline_floors(cfg, layout, cluster, seq_len, global_batch, precision,
                            overlap, expert_imbalance, memo)[floor_recompute(layout)]
            + fixed_floor(cfg, layout, cluster, seq_len, precision, memo))


def floor_recompute(layout: Layout) -> str:
    """The recomputation whose floor holds under `layout` (`holding_floor`)."""
    return holding_floor(layout.recompute, layout.recompute_method)


def holding_floor(recompute: str, method: str) -> str:
    """The recomputation whose floor holds under `recompute` by `method`: its own, but no
    recomputation under the block method, which reruns only some blocks (its time is no
    less)."""
    return "none" if method == "block" else recompute


def variants_floor(cfg: ModelConfig, estimate: Estimate, cluster: Cluster, seq_len: int,
                   global_batch: int, precision: Precision, overlap: Overlap,
                   expert_imbalance: float, memo: dict) -> float:
    """A floor under the step time of every cp variant of `estimate`'s layout (its K/V
    exchange done another way, `cp_variants.py`), from the layout's own price. The variants
    hold the same parameters, so they differ only in their pipeline, whose floor holds for
    all of them (`pipeline_floors`), and in how much of the gradient sync that pipeline's
    compute hides, which grows no faster than the pipeline does: each variant's step is at
    least that floor plus the layout's own time outside its pipeline. Above
    `step_lower_bound`, which leaves the gradient sync out."""
    time = estimate.time
    outside = time["dp"] + time["tp_grads"] + time["optimizer"] + time["step_calls"]
    return outside + pipeline_floors(cfg, estimate.layout, cluster, seq_len, global_batch,
                                     precision, overlap, expert_imbalance,
                                     memo)[floor_recompute(estimate.layout)]


def _without_recompute(layout: Layout) -> Layout:
    """`layout` with no recomputation: the floors add each recomputation's own part."""
    if layout.recompute == "none":
        return layout
    return layout.replace(recompute="none", recompute_layers=1, recompute_method="uniform")


def pipeline_floors(cfg: ModelConfig, layout: Layout, cluster: Cluster, seq_len: int,
                    global_batch: int, precision: Precision, overlap: Overlap,
                    expert_imbalance: float, memo: dict) -> dict[str, float]:
    """A floor under `pipeline_time` of `layout` for every cp variant, by recomputation:
    without it, its pipeline (its busy time where the bubble moves with the work); with it,
    the recomputed forward's compute added and the least any stage communicates (the rerun's
    collectives left out). It reads neither the ZeRO stage nor its shard group, but where
    FP8 weights are cast on ZeRO-3's shards."""
    micro_batch = global_batch // (layout.dp * layout.microbatches)
    pipe = pipeline_time(cfg, _without_recompute(layout), cluster, seq_len, micro_batch, precision,
                         overlap_on(cluster, overlap), expert_imbalance, memo, floor=True)
    return {"none": pipe.pipeline, "selective": pipe.pipeline + pipe.reruns[0],
            "full": pipe.pipeline + pipe.reruns[1]}


def block_floors(cfg: ModelConfig, layout: Layout, cluster: Cluster, seq_len: int,
                 micro_batch: int, precision: Precision, overlap: Overlap,
                 expert_imbalance: float, memo: dict
                 ) -> tuple[float, float, float, dict[str, tuple[float, float]]]:
    """What `pipeline_floors` of `layout` at this microbatch size is at least, for every
    schedule, interleaving depth and recomputation, per microbatch: (the stages' mean
    compute, a dense block's and an MoE block's exposed TP and EP communication, and by
    recomputation what it adds to a dense and an MoE block at the least, from it on: that
    or any heavier one). The mean is every block's GPU time with its attention core at the
    fastest cp variant's rate: a stage's share of the model is its blocks' in any split, and
    the busiest stage computes at least the mean; the host's launches, which only add, are
    left out."""
    layer, moe_layer, head = block_times(cfg, _without_recompute(layout), cluster, seq_len,
                                         micro_batch, precision, overlap_on(cluster, overlap),
                                         expert_imbalance, memo)
    faster = 1 - core_share_of_fastest(cfg, layout, cluster, seq_len, memo)
    blocks = ((cfg.n_layers - cfg.n_moe_layers, layer), (cfg.n_moe_layers, moe_layer))
    whole = [count * (block["forward"] + block["backward"]) for count, block in blocks]
    lean = [count * (block["gpu_forward"] + block["gpu_backward"] - faster * (
        block["core_forward"] + block["core_backward"])) for count, block in blocks]
    # the busiest stage is the busiest by its whole time: its lean time is at least the
    # leanest block kind's share of that
    share = min((l / w for l, w in zip(lean, whole, strict=True) if w > 0), default=1.0)
    total = sum(whole) + head["forward"] + head["backward"]
    comm = [sum(block[k] for k in EXPOSED_COMM) for _, block in blocks]
    # by recomputation (none adds nothing), per block kind: the least from it on (RECOMPUTE)
    dense, moe = ((0.0, *rerun_floors(block, faster)) for block in (layer, moe_layer))
    reruns = {r: (min(dense[i:]), min(moe[i:])) for i, r in enumerate(RECOMPUTE)}
    return share * total / layout.pp, comm[0], comm[1], reruns


def fixed_floor(cfg: ModelConfig, layout: Layout, cluster: Cluster, seq_len: int,
                precision: Precision, memo: dict) -> float:
    """The optimizer step and the step's small calls of `layout`: alike for every
    recomputation, and for every microbatch size but where paraxis's kernels add each later
    microbatch's gradients (`compute.optimizer_time`)."""
    return (optimizer_seconds(cfg, layout, cluster, seq_len, precision)
            + calls_time(cfg, layout, cluster, memo))


def _least_work(stages: tuple[tuple[int, int], ...], part: tuple, recompute: str) -> float:
    """Per microbatch, from `block_floors`' `part`: the stages' mean compute, plus the least
    any of `stages` (dense and MoE blocks each) communicates and recomputes from
    `recompute` on."""
    compute, dense_comm, moe_comm, reruns = part
    dense_rerun, moe_rerun = reruns[recompute]
    return compute + min(dense * dense_comm + moe * moe_comm for dense, moe in stages) + min(
        dense * dense_rerun + moe * moe_rerun for dense, moe in stages)


class Floors:
    """`step_lower_bound` of a search's layouts before they are built: the pipeline's
    part once per (shape, microbatches, schedule, depth, SP), shared by its ZeRO stages and
    shard groups (but where FP8 weights are cast on ZeRO-3's shards), the optimizer's and
    small calls' once per (shape, ZeRO, shard group, SP, schedule, depth), and per
    microbatch count with paraxis's kernels."""

    def __init__(self, cfg: ModelConfig, cluster: Cluster, seq_len: int, global_batch: int,
                 precision: Precision, overlap: Overlap, expert_imbalance: float,
                 memo: dict) -> None:
        self.args = cfg, cluster, seq_len, global_batch, precision, overlap, expert_imbalance
        self.memo = memo
        self.pipelines: dict[tuple, dict[str, float]] = {}
        self.fixed: dict[tuple, float] = {}
        self.computes: dict[tuple, float] = {}
        self.coarse_parts: dict[tuple, tuple[list, list]] = {}
        self.whole_batch: dict[tuple, float] = {}
        self.whole_batch_parts: dict[tuple, tuple[set, list]] = {}
        self.casts = precision.fp8_recipe is not None and precision.fp8_weight_gather
        self.fused_loss = cluster.gpu.loss_kernel == "fused-linear"
        self.accumulates = cluster.gpu.kernels in PARAXIS_KERNELS  # `compute.optimizer_time`

    def of(self, shape: Layout, base: Layout, microbatches: int, kind: str, virtual: int,
           sp: bool, recompute: str) -> float:
        """The floor of `base` (`shape`, which lives as long as the search, with its ZeRO
        settings) at these settings under `recompute` or any heavier recomputation (a heavier
        one can be priced faster: another stage may then be the busiest); 0 where they do
        not make a layout (the search then says why)."""
        cfg, cluster, seq_len, global_batch, precision, overlap, imbalance = self.args
        key = (id(shape), self._zero_read(base), microbatches, kind, virtual, sp)
        # the stage holding the most parameters, which the schedule and depth place; with
        # paraxis's kernels the microbatches too, whose gradients their optimizer step adds
        fixed_key = (id(shape), base.zero, base.zero3_reshard, base.dp_shard, sp, kind, virtual,
                     microbatches if self.accumulates else 0)
        if key not in self.pipelines or fixed_key not in self.fixed:
            try:
                probe = base.replace(microbatches=microbatches, schedule=kind,
                                     virtual_stages=virtual, sequence_parallel=sp)
                if key not in self.pipelines:
                    floors = pipeline_floors(cfg, probe, cluster, seq_len, global_batch,
                                             precision, overlap, imbalance, self.memo)
                    # the least from each recomputation on, lightest first (RECOMPUTE)
                    self.pipelines[key] = {r: min(floors[h] for h in RECOMPUTE[i:])
                                           for i, r in enumerate(RECOMPUTE)}
            except ParaxisError:  # e.g. more model chunks than layers
                return 0.0
            if fixed_key not in self.fixed:
                self.fixed[fixed_key] = fixed_floor(cfg, probe, cluster, seq_len, precision,
                                                    self.memo)
        return self.pipelines[key][recompute] + self.fixed[fixed_key]

    def _zero_read(self, base: Layout) -> tuple[int, bool]:
        """What the pipeline's floor reads of `base`'s ZeRO setting: the group ZeRO-3 casts
        FP8 weights on the shards of, where it does (else 0), and whether ZeRO-3 keeps the
        asked-for fused head and loss from running (`layer_cost.block_key`)."""
        return (base.zero_ranks if self.casts and base.zero == 3 else 0,
                self.fused_loss and base.zero == 3)

    def coarse(self, shape: Layout, base: Layout, micro_batch: int, microbatches: int,
               sps: tuple[bool, ...], variants: tuple[tuple[str, int], ...],
               recompute: str = "none") -> float:
        """A floor under `of` for every (schedule, depth) of `variants`, SP setting of `sps`
        and recomputation of `base` from `recompute` on at this microbatch size, cheaper than
        any of them: the stages' mean compute (`block_floors`), the least any stage
        communicates and the least any stage's blocks recompute, over one minus the
        schedule's least bubble where that holds whatever the work (as `pipeline_time`'s
        floor has it); 0 where any of them breaks a rule, whose layout the search must build
        to say why (`SearchResult.rule_breakers`)."""
        key = (id(shape), self._zero_read(base), micro_batch, sps, recompute)
        if key not in self.computes:
            splits, parts = self._coarse_parts(shape, base, micro_batch, microbatches, sps,
                                               variants)
            self.computes[key] = min((microbatches * _least_work(stages, part, recompute)
                                      / (1 - bubble)
                                      for bubble, stages in splits for part in parts),
                                     default=0.0)
        return self.computes[key]

    def tail(self, shape: Layout, base: Layout, microbatches: int, sps: tuple[bool, ...],
             variants: tuple[tuple[str, int], ...], recompute: str = "none") -> float:
        """A floor under `coarse` at the size of `microbatches` and every larger size, from
        the replica's whole batch as one microbatch (a larger microbatch costs no more per
        sequence): its stages' mean compute, least communication and least recomputation
        from `recompute` on, over every schedule and depth of `variants` (all a larger size
        may take), over one minus their least bubble at `microbatches` (fewer microbatches
        only idle more)."""
        key = (id(shape), self._zero_read(base), sps, recompute)
        if key not in self.whole_batch:
            splits, parts = self._whole_batch_parts(shape, base, sps, variants)
            self.whole_batch[key] = min((_least_work(stages, part, recompute)
                                         for stages in splits for part in parts), default=0.0)
        if not bubble_holds(self.args[1], shape.pp):
            return self.whole_batch[key]
        bubble = min((bubble_floor(kind, shape.pp, microbatches, virtual)
                      for kind, virtual in variants), default=0.0)
        return self.whole_batch[key] / (1 - bubble)

    def _whole_batch_parts(self, shape: Layout, base: Layout, sps: tuple[bool, ...],
                           variants: tuple[tuple[str, int], ...]) -> tuple[set, list]:
        """`tail`'s stages' blocks of each of `variants` and `block_floors` of each SP
        setting at the replica's whole batch as one microbatch; none where a setting breaks
        a rule."""
        cfg, seq_len, global_batch = self.args[0], self.args[2], self.args[3]
        key = (id(shape), self._zero_read(base), sps)
        if key not in self.whole_batch_parts:
            try:
                self.whole_batch_parts[key] = (
                    {stage_kinds(cfg, shape.pp, virtual, seq_len, placement_of(kind))
                     for kind, virtual in variants},
                    self._block_parts(base, 1, global_batch // shape.dp, sps))
            except ParaxisError:
                self.whole_batch_parts[key] = set(), []
        return self.whole_batch_parts[key]

    def _coarse_parts(self, shape: Layout, base: Layout, micro_batch: int,
                      microbatches: int, sps: tuple[bool, ...],
                      variants: tuple[tuple[str, int], ...]) -> tuple[list, list]:
        """`coarse`'s (bubble, stages' blocks) of each variant and `block_floors` of each SP
        setting; none where a setting breaks a rule."""
        cfg, cluster, seq_len, global_batch, precision, overlap, imbalance = self.args
        key = (id(shape), self._zero_read(base), micro_batch, sps)
        if key in self.coarse_parts:
            return self.coarse_parts[key]
        alike = bubble_holds(cluster, shape.pp)
        splits: list[tuple[float, tuple[tuple[int, int], ...]]] = []
        try:  # a setting that breaks a rule: 0, the search builds it to say which
            parts = self._block_parts(base, microbatches, micro_batch, sps)
            for kind, virtual in variants:
                check_interleaving(base.replace(microbatches=microbatches, schedule=kind,
                                                virtual_stages=virtual), cfg)
                splits.append((bubble_floor(kind, shape.pp, microbatches, virtual)
                               if alike else 0.0,
                               stage_kinds(cfg, shape.pp, virtual, seq_len,
                                           placement_of(kind))))
        except ParaxisError:
            splits, parts = [], []
        self.coarse_parts[key] = splits, parts
        return splits, parts

    def _block_parts(self, base: Layout, microbatches: int, micro_batch: int,
                     sps: tuple[bool, ...]) -> list[tuple]:
        """`block_floors` of `base` at `microbatches` of `micro_batch` sequences under each
        SP setting of `sps` (`ParaxisError` where one breaks a rule); a block's times read
        no schedule (`layer_cost.block_key`)."""
        cfg, cluster, seq_len, global_batch, precision, overlap, imbalance = self.args
        probes = [base.replace(microbatches=microbatches, schedule="1f1b", virtual_stages=1,
                               sequence_parallel=sp)
                  .validate(cluster.world_size, cfg, global_batch, seq_len) for sp in sps]
        return [block_floors(cfg, probe, cluster, seq_len, micro_batch, precision, overlap,
                             imbalance, self.memo) for probe in probes]

    def best_first(self, shapes: list[Layout], micro_batch: int,
                   settings: Callable[[Layout, int], tuple[tuple[bool, ...], tuple]],
                   group: Callable[[Layout], tuple],
                   lightest: Callable[..., tuple[str, Layout] | None] | None = None
                   ) -> list[Layout]:
        """`shapes` fastest first at `micro_batch` (`settings(shape, microbatches)`: its SP
        choices and schedule variants), so the bound tightens sooner. The shapes of one
        `group` go together, in their order (the search reads a group's smaller
        expert-parallel degrees first).

        Two floors order the groups. The coarse floor reads no memory: at long sequences the
        shapes that need recomputation to fit sort early. With `lightest` (the lightest
        recomputation at which a shape's first schedule fits, and that layout), the floor of
        that layout, recomputation and optimizer step included, of each group's shape with
        the most expert parallelism (a group without one that fits goes last). The groups are
        taken from each order in turn: Mixtral 8x22B at 128K tokens on 1024 A100s (its
        fastest group the 26th of 232 by the first order, the 2nd by the second) prices
        2,918 layouts by the first alone, 2,150 by the second, 1,693 by the two
        (`python -m tools.probes.search_order`)."""
        members, orders = self.group_orders(shapes, micro_batch, settings, group, lightest)
        taken: dict[tuple, None] = {}
        for keys in zip(*orders, strict=True):
            taken.update(dict.fromkeys(keys))
        return [shape for key in taken for shape in members[key]]

    def group_orders(self, shapes: list[Layout], micro_batch: int,
                     settings: Callable[[Layout, int], tuple[tuple[bool, ...], tuple]],
                     group: Callable[[Layout], tuple],
                     lightest: Callable[..., tuple[str, Layout] | None] | None = None
                     ) -> tuple[dict[tuple, list[Layout]], list[list[tuple]]]:
        """`best_first`'s groups (key -> its shapes, in their order) and the orders it takes
        them from: by the coarse floor, and with `lightest` by the fitting one."""
        coarse: dict[tuple, float] = {}
        members: dict[tuple, list[Layout]] = {}
        for shape in shapes:
            microbatches = max(1, self.args[3] // shape.dp // micro_batch)
            floor = self.coarse(shape, shape, micro_batch, microbatches,
                                *settings(shape, microbatches))
            coarse[group(shape)] = min(coarse.get(group(shape), math.inf), floor)
            members.setdefault(group(shape), []).append(shape)
        orders = [sorted(members, key=coarse.__getitem__)]
        if lightest is not None:
            fitted = {key: self._fit_floor(max(group_shapes, key=lambda s: (s.ep, s.etp)),
                                           micro_batch, settings, lightest)
                      for key, group_shapes in members.items()}
            orders.append(sorted(members, key=fitted.__getitem__))
        return members, orders

    def _fit_floor(self, shape: Layout, micro_batch: int,
                   settings: Callable[[Layout, int], tuple[tuple[bool, ...], tuple]],
                   lightest: Callable[..., tuple[str, Layout] | None]) -> float:
        """`best_first`'s second floor of `shape`: its fastest schedule's at the lightest
        recomputation that fits its first; inf where none does."""
        microbatches = max(1, self.args[3] // shape.dp // micro_batch)
        sps, variants = settings(shape, microbatches)
        fit = lightest(shape, microbatches, *variants[0], sps[-1]) if variants else None
        if fit is None:
            return math.inf
        recompute, layout = fit
        return min(self.of(shape, layout, microbatches, kind, virtual, sps[-1], recompute)
                   or math.inf for kind, virtual in variants)
