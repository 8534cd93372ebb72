"""What a search must price, and which layouts it may skip unpriced (branch and bound).

A search of 1024 GPUs for a long-context mixture of experts has some 56,000 layouts; most are
far slower than the best. A layout's step has a floor that costs a fraction of pricing it
(`floor.step_lower_bound`: its pipeline as fast as any cp variant runs it, with the
recomputed forward, its optimizer step and small calls; the gradient sync left out). Where
the floor of a setting under its recomputation or any heavier one is above every time the
answer can show, they are all skipped; where one floor under every setting of a microbatch
size is (`floor.Floors.coarse`: the stages' mean compute and least communication over the
closed-form bubble), the whole size is, before any of its layouts is built; where one
floor under every larger size is (`floor.Floors.tail`: the replica's whole batch as one
microbatch, which costs no more per sequence than smaller ones, over the least bubble any
schedule takes at this size's microbatch count, which fewer only raise), every larger size
is too.

What the answer shows, and so what is kept exact (every reader of `SearchResult`):

- the fastest layout, the `keep` fastest, and every layout within the error band of the
  fastest (the ties a defence names: `uncertainty.ties`);
- the fastest layout of the `RIVAL_SHAPES` fastest (dp, cp, ep, tp, pp, zero) shapes: the
  nearest rivals of other shapes a defence names (`rivals.nearest_rivals`);
- the fastest layout of each family a defence names (`families`: ZeRO-3, no PP, no TP...);
- the `TOO_BIG_SHOWN` fastest layouts that do not fit (the report's "faster, but too big"
  and the JSON's rejected examples).

Where layouts lie within the ranking's equal-times margin (0.5%) of such a layout, the one
that goes first may differ from an exhaustive search's: the ranking counts them as equal.
A family none of whose layouts fits yet is never skipped: its closest-to-fitting layout is
what a defence names instead. Every limit is the search's running value, never below the
final one, so a skipped layout is slower than the final limit too. The floor holds for
every cp variant of a layout, so the variants priced after the search (`cp_variants.py`)
of a skipped layout would be skipped too.

What differs from an exhaustive search: the counts (`SearchResult.skipped` counts the
settings skipped). The search's own shortcut reads whether a layout fits (stop at the first
microbatch size where none fits); a layout skipped on its floor has a fit the search does
not know, so it finds it from memory alone where a larger size needs the answer
(`settings.SmallerSizes`), and stops where the exhaustive search stops (`python -m
tools.probes.search_fuzz` compares the two on random searches).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

from paraxis.plan.cost import Estimate, memory_on
from paraxis.plan.hardware import Cluster
from paraxis.plan.ranking import EQUAL_TIMES
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import ModelConfig
from paraxis.spec.precision import Precision

TOO_BIG_SHOWN = 4  # the report's table of faster layouts left out for memory
RIVAL_SHAPES = 6  # the pick's shape, the three nearest others a defence names, and more


def families(node: int) -> list[tuple[str, Callable[[Layout], bool]]]:
    """The families a defence names the best of (`rivals.family_rivals`), or, where none of
    a family fits, its layout closest to fitting."""
    return [("ZeRO-3", lambda layout: layout.zero == 3),
            ("without ZeRO-3", lambda layout: layout.zero < 3),
            ("without PP", lambda layout: layout.pp == 1),
            ("without TP", lambda layout: layout.tp == 1),
            ("without CP", lambda layout: layout.cp == 1),
            ("without EP", lambda layout: layout.ep == 1),
            (f"with TP = {node}", lambda layout: layout.tp == node),
            ("with EP", lambda layout: layout.ep > 1)]  # `explain.expert_line`


def ep_group(layout: Layout) -> tuple[int, ...]:
    """A shape but its expert-parallel degree: the search ends a group's larger ep once one
    whose group leaves the node fits, so it reads a group's ep in order."""
    return layout.dp, layout.tp, layout.pp, layout.cp, layout.etp


def rival_shape(layout: Layout) -> tuple[int, ...]:
    """The shape a defence names rivals by (`rivals.nearest_rivals`)."""
    return layout.dp, layout.cp, layout.ep, layout.tp, layout.pp, layout.zero


class Bound:
    """The running limits: a layout whose floor is above `limit(layout)` cannot change
    what the search's answer shows."""

    def __init__(self, band: float, keep: int, node: int) -> None:
        self.band = band  # the ties' relative margin (`uncertainty.error_band(...).rms`)
        self.keep = keep
        self.families = families(node)
        self.family_best: dict[str, float] = {}
        self.fastest: list[float] = []  # the `keep` fastest fitting steps, negated (a heap)
        self.too_big: list[float] = []  # the TOO_BIG_SHOWN fastest too-big steps, negated
        self.best = math.inf
        self.shape_best: dict[tuple, float] = {}  # each rival shape's fastest
        self.leaders: dict[tuple, float] = {}  # the RIVAL_SHAPES fastest of them
        self.limits: dict[tuple, tuple[float, bool]] = {}  # by what families read; reset by add

    def limit(self, layout: Layout) -> float:
        """Above this floor, `layout`, if it fits, is slower than all the answer shows."""
        return self._by_family(layout)[0]

    def _by_family(self, layout: Layout) -> tuple[float, bool]:
        """(`limit`, `families_fit`) of the layouts of `layout`'s families."""
        key = (layout.zero, layout.pp, layout.tp, layout.cp, layout.ep)
        if key not in self.limits:
            self.limits[key] = self._limit(layout), all(
                name in self.family_best for name, member in self.families if member(layout))
        return self.limits[key]

    def _limit(self, layout: Layout) -> float:
        if len(self.leaders) < RIVAL_SHAPES or len(self.fastest) < self.keep:
            return math.inf
        # the ties are within the band of the first ranked, up to 0.5% above the fastest
        limit = max(self.best * (1 + EQUAL_TIMES) * (1 + self.band),
                    -self.fastest[0] * (1 + EQUAL_TIMES),
                    max(self.leaders.values()) * (1 + EQUAL_TIMES))
        for name, member in self.families:
            if member(layout):
                limit = max(limit, self.family_best.get(name, math.inf) * (1 + EQUAL_TIMES))
        return limit

    def hides(self, floor: float, layout: Layout) -> bool:
        """Whether a layout of this floor is slower than all the answer shows, whether or
        not it fits (`layout`: its families)."""
        return floor > self.limit(layout) and floor > self.too_big_limit() and \
            self.families_fit(layout)

    def too_big_limit(self) -> float:
        """Above this floor, a layout that does not fit is none of the fastest too big."""
        return -self.too_big[0] if len(self.too_big) == TOO_BIG_SHOWN else math.inf

    def families_fit(self, layout: Layout) -> bool:
        """Whether every family `layout` belongs to has a layout that fits: its own
        closest-to-fitting is then never named."""
        return self._by_family(layout)[1]

    def add(self, estimate: Estimate) -> None:
        step = estimate.step_time_s
        if not estimate.fits:
            _push(self.too_big, step, TOO_BIG_SHOWN)
            return
        self.limits.clear()
        self.best = min(self.best, step)
        _push(self.fastest, step, self.keep)
        layout = estimate.layout
        for name, member in self.families:
            if member(layout) and step < self.family_best.get(name, math.inf):
                self.family_best[name] = step
        shape = rival_shape(layout)
        if step >= self.shape_best.get(shape, math.inf):
            return
        self.shape_best[shape] = step
        # the RIVAL_SHAPES fastest shapes: a shape's time only falls, so one that falls
        # below the slowest of them takes its place
        if shape in self.leaders or len(self.leaders) < RIVAL_SHAPES:
            self.leaders[shape] = step
        else:
            slowest = max(self.leaders, key=self.leaders.__getitem__)
            if step < self.leaders[slowest]:
                del self.leaders[slowest]
                self.leaders[shape] = step


def _push(heap: list[float], step: float, size: int) -> None:
    """Keep the `size` smallest steps seen in `heap` (negated: its top is the largest)."""
    if len(heap) < size:
        heapq.heappush(heap, -step)
    elif step < -heap[0]:
        heapq.heapreplace(heap, -step)


class Fits:
    """Whether a layout fits in memory, its time left unpriced. A layout whose activations
    alone (and the reserve) overflow the GPU overflows it at every ZeRO stage and shard
    group, which do not change them; one whose model states alone (and the reserve)
    overflow it does at every microbatch size, SP setting and recomputation, which do not
    change those: both are answered without pricing memory again, the search's settings
    without building their layout (`known_too_big`)."""

    def __init__(self, cfg: ModelConfig, cluster: Cluster, seq_len: int, global_batch: int,
                 precision: Precision, expert_imbalance: float) -> None:
        self.args = cfg, cluster, seq_len, global_batch, precision, expert_imbalance
        self.overflow: set[tuple] = set()  # settings whose activations overflow
        self.states: set[tuple] = set()  # ZeRO settings and splits whose states overflow
        self.seen: set[tuple] = set()  # settings priced (so valid) for a shape
        self.last: tuple[Layout, dict[str, float]] | None = None  # the last layout priced

    def _keys(self, shape: Layout, base: Layout, settings: tuple) -> tuple[tuple, tuple]:
        """(the activations' key, the model states' key) of `settings` (microbatches,
        schedule, depth, SP, recomputation: `settings.Step`'s fields) of `base`, of
        `shape`."""
        # (the fused head's logits depend on the ZeRO stage: `spec.kernels.fused_loss_problem`)
        fused = base.zero if self.args[1].gpu.loss_kernel == "fused-linear" else None
        return ((id(shape), *settings, fused),
                (id(shape), base.zero, base.zero3_reshard, base.dp_shard, *settings[1:3]))

    def known_too_big(self, shape: Layout, base: Layout, settings: tuple) -> bool:
        """Whether these settings of `base` (as `_keys`) are known not to fit: their
        activations, or their ZeRO setting's states at their split, overflow (the states'
        only where the settings were priced, so valid, for the shape)."""
        activations, states = self._keys(shape, base, settings)
        return activations in self.overflow or (
            states in self.states and (id(shape), *settings) in self.seen)

    def memory(self, layout: Layout) -> dict[str, float] | None:
        """`memory_on` of `layout` where the last call priced it (the search then prices its
        time with it), else None."""
        return self.last[1] if self.last is not None and self.last[0] is layout else None

    def __call__(self, shape: Layout, layout: Layout) -> bool:
        """Whether `layout`, of `shape` (which lives as long as the search), fits."""
        cfg, cluster, seq_len, global_batch, precision, imbalance = self.args
        settings = (layout.microbatches, layout.schedule, layout.virtual_stages,
                    layout.sequence_parallel, (layout.recompute, layout.recompute_layers,
                                               layout.recompute_method))
        activations, states = self._keys(shape, layout, settings)
        self.seen.add((id(shape), *settings))
        if activations in self.overflow or states in self.states:
            return False
        micro_batch = global_batch // (layout.dp * layout.microbatches)
        memory = memory_on(cfg, layout, cluster, seq_len, micro_batch, precision, imbalance)
        self.last = layout, memory
        limit = cluster.gpu.memory_bytes
        if memory["activations"] + memory["reserved"] > limit:
            self.overflow.add(activations)
        if memory["params"] + memory["grads"] + memory["optimizer"] + memory["reserved"] > limit:
            self.states.add(states)
        return memory["total"] <= limit
