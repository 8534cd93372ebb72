"""The settings a search tries for one shape and ZeRO setting at each microbatch size, and
what it knows of the smaller sizes it tried.

A setting is (schedule, interleaving depth, SP, recomputation `Step`): `schedule_variants`
and `recompute_steps` give them lightest first, `build_setting` the layout. The search stops
trying larger sizes at the first where nothing fits (fewer microbatches than stages are
priced like any other: where a step's fixed costs outweigh the bubble they can be the
fastest); where it skipped a size's settings on their floor
(`prune.py`) `SmallerSizes` finds their fit from memory alone, where a larger size needs it
(`fits_at_some_setting`), as the exhaustive search knows it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import NamedTuple

from paraxis.plan.constraints import Constraints
from paraxis.plan.floor import holding_floor
from paraxis.plan.memory import check_interleaving
from paraxis.plan.prune import Fits
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import RECOMPUTE, Layout
from paraxis.spec.model_config import ModelConfig
from paraxis.spec.model_splits import etp_splits
from paraxis.spec.schedules import FIXED_VIRTUAL


def _interleaving_depths(n_layers: int, pp: int, constraints: Constraints) -> tuple[int, ...]:
    if constraints.virtual_stages is not None:
        return constraints.virtual_stages  # given: a depth that does not split is refused
    # every depth that splits the layers evenly: the best is often deeper than 2 or 4 (NVIDIA
    # runs Llama 3 405B at 8 on pp = 16... whatever the layers allow)
    return tuple(v for v in range(2, n_layers // pp + 1) if n_layers % (pp * v) == 0)


@functools.lru_cache(maxsize=4096)  # asked once per microbatch size a search visits
def schedule_variants(pp: int, microbatches: int, constraints: Constraints,
                      n_layers: int) -> tuple[tuple[str, int], ...]:
    """(schedule, interleaving depth) to try with `microbatches` on `pp` stages."""
    if pp == 1:  # no stages to chunk: none where only chunked schedules are asked for
        return () if chunked_only(constraints) else (("1f1b", 1),)
    variants: list[tuple[str, int]] = []
    for kind in constraints.schedules:
        if kind == "interleaved":
            variants += [(kind, v) for v in _interleaving_depths(n_layers, pp, constraints)
                         if v > 1 and microbatches % pp == 0]
        else:  # zb-v folds the model twice over the stages (as its layout says)
            variants.append((kind, FIXED_VIRTUAL.get(kind, 1)))
    return tuple(variants)


def every_variant(pp: int, constraints: Constraints,
                  n_layers: int) -> tuple[tuple[str, int], ...]:
    """Every (schedule, interleaving depth) `schedule_variants` tries on `pp` stages at some
    microbatch count (a multiple of pp allows them all)."""
    return schedule_variants(pp, pp, constraints, n_layers)


def chunked_only(c: Constraints) -> bool:
    """Whether only schedules that chunk pipeline stages (need pp > 1) are asked for: zb-v's
    V, and interleaving (at depth 2 and more: depth 1 is 1F1B)."""
    return all(kind in FIXED_VIRTUAL or kind == "interleaved" for kind in c.schedules) or (
        c.virtual_stages is not None and min(c.virtual_stages) > 1)


class SmallerSizes:
    """What the search knows of the smaller microbatch sizes of one shape and ZeRO setting,
    for its rule on larger sizes: the smallest at which nothing fits and a setting was too
    big (larger sizes hold more activations: not tried). A size whose settings the search
    skipped on their floor has a fit it does not know, where the exhaustive search, which
    priced them, does: `ask(size, settings)` finds it, memory only, where a larger size
    needs the answer before a layout of it is priced or checked."""

    def __init__(self, ask: Callable[[int, list[tuple] | None], bool]) -> None:
        self.ask = ask
        self.too_big_at: int | None = None
        # sizes at which a setting was too big and others were skipped on their floor
        self.pending: list[tuple[int, list[tuple]]] = []

    def add(self, size: int, fits: bool, too_big: bool, skipped: list[tuple]) -> None:
        """The search's findings at `size`: whether a setting fit, whether one was too big
        (where a larger size holds more), and the settings from whose recomputation on it
        skipped on their floor (their fit unknown)."""
        if fits or not too_big:
            return
        if skipped:
            self.pending.append((size, skipped))
        else:
            self.too_big_at = size  # nothing at this size fits, at any recomputation

    def outgrows(self, size: int, grows: bool, ask: bool = False) -> bool:
        """Whether `size` holds more than a smaller size at which nothing fits; `ask`: find
        the fits not known of smaller sizes that had a setting too big first."""
        if ask:
            self._ask_pending()
        return self.too_big_at is not None and size > self.too_big_at and grows

    def _ask_pending(self) -> None:
        """The fits of the sizes that had a setting too big, smallest first, up to the first
        at which nothing fits."""
        while self.pending and self.too_big_at is None:
            at, settings = self.pending.pop(0)
            if not self.ask(at, settings):
                self.too_big_at = at


class Step(NamedTuple):
    """A recomputation the search tries: `Layout.recompute`, `recompute_layers` (uniform full
    recompute's blocks per checkpoint; the block method's blocks of a chunk recomputed) and
    `recompute_method`."""

    recompute: str
    layers: int = 1
    method: str = "uniform"

    @property
    def floor(self) -> str:
        """The recomputation whose floors hold for it (`floor.holding_floor`)."""
        return holding_floor(self.recompute, self.method)


def build_setting(cfg: ModelConfig, world: int, global_batch: int, seq_len: int,
                  base: Layout, microbatches: int, kind: str, virtual: int, sp: bool,
                  step: Step) -> Layout:
    """`base` (a shape with its ZeRO settings) at one setting of the search, checked as the
    search needs it (`ParaxisError` where the setting breaks a rule)."""
    layout = base.replace(microbatches=microbatches, schedule=kind, virtual_stages=virtual,
                          recompute=step.recompute, recompute_layers=step.layers,
                          recompute_method=step.method, sequence_parallel=sp)
    layout.validate(world, cfg, global_batch, seq_len)
    check_interleaving(layout, cfg)
    return layout


def lightest_left(outgrown: set[tuple], variants: tuple[tuple[str, int], ...],
                  c: Constraints, cfg: ModelConfig, shape: Layout) -> str:
    """The lightest recomputation a setting of a size may still take: each setting's lightest
    not too big at a smaller size (`outgrown`, which a larger size does not try), the
    lightest of them; "none" where every one is outgrown (the search then finds the size too
    big as it is)."""
    if not outgrown:
        return "none"
    lightest = None
    for kind, virtual, sp in size_settings(shape, variants, c, cfg):
        for step in recompute_steps(c, cfg.n_layers, shape.pp, virtual):
            if (kind, virtual, sp, step) not in outgrown:
                index = RECOMPUTE.index(step.floor)
                lightest = index if lightest is None else min(lightest, index)
                break
        if lightest == 0:
            return "none"
    return "none" if lightest is None else RECOMPUTE[lightest]


def fits_at_some_setting(fits: Fits, build: Callable[..., Layout], shape: Layout,
                         base: Layout, per_replica: int, c: Constraints, cfg: ModelConfig,
                         micro_batch: int, skipped: list[tuple] | None = None) -> bool:
    """Whether `base` (of `shape`, `per_replica` sequences a step on each replica) at
    `micro_batch` sequences a microbatch fits at some setting the search tries
    (schedule, depth, SP, recomputation), its time unpriced: what the search learns of a size
    whose settings it skipped on their floor, where the exhaustive search would have priced
    them. `skipped`: the (schedule, depth, SP, recomputation, blocks per checkpoint) from
    which each setting's recomputations were skipped; None: every setting. Heaviest first,
    which fit most often."""
    microbatches = per_replica // micro_batch
    if skipped is None:
        variants = schedule_variants(shape.pp, microbatches, c, cfg.n_layers)
        skipped = [(kind, virtual, sp, recompute_steps(c, cfg.n_layers, shape.pp, virtual)[0])
                   for kind, virtual, sp in size_settings(shape, variants, c, cfg)]
    for kind, virtual, sp, first in skipped:
        steps = recompute_steps(c, cfg.n_layers, shape.pp, virtual)
        for step in reversed(steps[steps.index(first):]):
            try:
                layout = build(base, microbatches, kind, virtual, sp, step)
            except ParaxisError:
                break  # the setting breaks a rule at every recomputation
            if fits(shape, layout):
                return True
    return False


@functools.lru_cache(maxsize=1024)  # asked once per setting a search visits
def recompute_steps(c: Constraints, n_layers: int, pp: int,
                    virtual: int) -> tuple[Step, ...]:
    """The recomputations to try, lightest first: the constraints' recomputations and
    blocks per checkpoint; under the block method the blocks of a chunk recomputed, fewest
    first where they are left free (recompute just enough to fit); else, after full
    recompute of every block where they are left free, checkpoints of 2 and of about
    sqrt(a chunk's blocks) blocks (the course's sqrt(L) rule: the same FLOPs, fewer stored
    inputs, and a group rebuilt at once in backward), for the layouts nothing lighter
    fits."""
    steps = []
    blocks = math.ceil(n_layers / (pp * virtual))  # of a chunk
    for recompute in sorted(c.recompute, key=RECOMPUTE.index):  # lightest first
        if recompute != "full":
            steps.append(Step(recompute))
        elif c.recompute_method == "block":
            # up to every block of the model: a chunk of the FLOP-balanced partition may
            # hold more than the mean (`stages.recomputed_kinds` counts each as it is)
            counts = block_counts(n_layers) if c.recompute_layers is None else [
                c.recompute_layers]
            steps += [Step("full", n, "block") for n in counts]
        elif c.recompute_layers is not None:
            steps.append(Step("full", c.recompute_layers))
        else:
            steps += [Step("full", g) for g in sorted({1, 2, math.isqrt(blocks)})
                      if g <= blocks]
    return tuple(steps)


def block_counts(blocks: int) -> list[int]:
    """How many of a chunk's `blocks` the block method's search tries to recompute, fewest
    first: 1, 2, 3, then about a third more each time, and all of them (a dozen or so where
    a chunk holds a hundred blocks)."""
    counts, n = [], 1
    while n < blocks:
        counts.append(n)
        n = max(n + 1, round(n * 4 / 3))
    return [*counts, blocks]


def sp_choices(c: Constraints, tp: int) -> tuple[bool, ...]:
    """Sequence parallelism's settings to try: the constraints' where tp > 1, else off."""
    return c.sequence_parallel if tp > 1 else (False,)


def size_settings(shape: Layout, variants: tuple[tuple[str, int], ...], c: Constraints,
                  cfg: ModelConfig) -> list[tuple[str, int, bool]]:
    """(schedule, depth, SP) of a microbatch size of `shape`, each variant of `variants`
    with every SP setting, but whole experts without SP where the search chose them
    (`_repeats_experts`); each takes its recomputations (`recompute_steps`) in turn."""
    return [(kind, virtual, sp) for kind, virtual in variants for sp in sp_choices(c, shape.tp)
            if sp or not _repeats_experts(cfg, shape, c)]


def _repeats_experts(cfg: ModelConfig, shape: Layout, c: Constraints) -> bool:
    """Whole experts without SP, which every tp rank runs on the whole sequence, where the
    search chose them itself (for their shards under SP: `search._expert_splits`)."""
    return (c.split_experts is None and shape.etp == 1 and shape.tp > 1 and cfg.is_moe
            and etp_splits(cfg, shape.tp))
