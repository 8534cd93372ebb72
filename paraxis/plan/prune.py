"""What a search must price, and which layouts it may skip unpriced (branch and bound).

A search of 1024 GPUs for a long-context mixture of experts has some 56,000 layouts; most are
far slower than the best. A layout's step has a floor that costs a fraction of pricing it
(`cost.step_lower_bound`: its pipeline without recomputation and the step's small calls,
the sync and optimizer left out). Where that floor is above every time the answer can show,
the layout is skipped, with the heavier recomputations of its setting, which are slower still.

What the answer shows, and so what is kept exact (every consumer of `SearchResult`):

- the fastest layout, the `keep` fastest, and every layout within the error band of the
  fastest (the ties a defence names: `uncertainty.ties`);
- the fastest layout of every (dp, cp, ep, etp, tp, pp, zero, hybrid) shape and those within
  the ranking's equal-times margin of it: the nearest rivals of other shapes, the best of
  each family (ZeRO-3, no PP, no TP...), the hybrid-sharded twin, the best layout with EP,
  the cp-exchange variants re-priced per shape (`cp_variants.py`), all draw from these;
- the `TOO_BIG_SHOWN` fastest layouts that do not fit (the report's "faster, but too big").

A shape none of whose layouts fits yet is never skipped: its closest-to-fitting layout is
what a defence names for a family with no fit. Every limit is the search's running best,
never below the final one, so a skipped layout is slower than the final limit too. The
counts change: `SearchResult.skipped` says how many were not priced.
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


def families(node: int) -> list[tuple[str, Callable[[Layout], bool]]]:
    """The families a defence names the best of (`rivals.family_rivals`), or, where none of
    a family fits, its layout closest to fitting."""
    return [("ZeRO-3", lambda layout: layout.zero == 3),
            ("without ZeRO-3", lambda layout: layout.zero < 3),
            ("without PP", lambda layout: layout.pp == 1),
            ("without TP", lambda layout: layout.tp == 1),
            ("without CP", lambda layout: layout.cp == 1),
            ("without EP", lambda layout: layout.ep == 1),
            (f"with TP = {node}", lambda layout: layout.tp == node)]


def shape_of(layout: Layout) -> tuple:
    """The shape whose fastest layout a defence may name (and the cp variants re-price)."""
    return (layout.dp, layout.cp, layout.ep, layout.etp, layout.tp, layout.pp, layout.zero,
            layout.hybrid)


class Bound:
    """The running limits: a layout whose floor is above `limit(layout)` cannot change
    what the search's answer shows."""

    def __init__(self, band: float, keep: int, node: int) -> None:
        self.band = band  # the ties' relative margin (`uncertainty.error_band(...).rms`)
        self.keep = keep
        self.families = families(node)
        self.unfitted = {name for name, _ in self.families}  # families with no fit yet
        self.fastest: list[float] = []  # the `keep` fastest fitting steps, negated (a heap)
        self.too_big: list[float] = []  # the TOO_BIG_SHOWN fastest too-big steps, negated
        self.best = math.inf
        self.by_shape: dict[tuple, float] = {}

    def limit(self, layout: Layout) -> float:
        """Above this floor, `layout` is slower than all the answer shows."""
        shape = self.by_shape.get(shape_of(layout), math.inf) * (1 + EQUAL_TIMES)
        return max(shape, self.shown())

    def shown(self) -> float:
        """Above this floor, a layout is none of the fastest, the ties or the fastest too
        big: only as its shape's fastest could it show."""
        kept = -self.fastest[0] if len(self.fastest) == self.keep else math.inf
        shown = -self.too_big[0] if len(self.too_big) == TOO_BIG_SHOWN else math.inf
        return max(self.best * (1 + self.band), kept, shown)

    def families_fit(self, layout: Layout) -> bool:
        """Whether every family `layout` belongs to has a layout that fits: its own
        closest-to-fitting is then never named."""
        return not any(name in self.unfitted and member(layout)
                       for name, member in self.families)

    def add(self, estimate: Estimate) -> None:
        step = estimate.step_time_s
        if not estimate.fits:
            _push(self.too_big, step, TOO_BIG_SHOWN)
            return
        self.best = min(self.best, step)
        _push(self.fastest, step, self.keep)
        if self.unfitted:
            self.unfitted -= {name for name, member in self.families
                              if member(estimate.layout)}
        shape = shape_of(estimate.layout)
        self.by_shape[shape] = min(self.by_shape.get(shape, math.inf), step)


def _push(heap: list[float], step: float, size: int) -> None:
    """Keep the `size` smallest steps seen in `heap` (negated: its top is the largest)."""
    if len(heap) < size:
        heapq.heappush(heap, -step)
    elif step < -heap[0]:
        heapq.heapreplace(heap, -step)


def fits(cfg: ModelConfig, layout: Layout, cluster: Cluster, seq_len: int, global_batch: int,
         precision: Precision, expert_imbalance: float) -> bool:
    """Whether `layout` fits in memory, its time left unpriced."""
    micro_batch = global_batch // (layout.dp * layout.microbatches)
    memory = memory_on(cfg, layout, cluster, seq_len, micro_batch, precision, expert_imbalance)
    return memory["total"] <= cluster.gpu.memory_bytes
