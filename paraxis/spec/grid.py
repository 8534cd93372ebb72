"""The rank grid as pure arithmetic: coordinates, groups and nodes from axis degrees.

`Layout` (paraxis/spec/layout.py) holds the degrees; these functions turn them into ranks
and groups, with no other input, so the runtime's process groups, the planner's links and
the pictures all come from one place. The axes are ordered outermost first (`AXES`): TP
varies fastest. Pure Python.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
from collections.abc import Mapping

from paraxis.spec.errors import ParaxisError

AXES = ("pp", "dp", "cp", "tp")  # the rank grid, outermost (slowest-varying) axis first
axis_degrees = operator.attrgetter(*AXES)  # an object's degree of every axis, in `AXES` order


@functools.lru_cache(maxsize=1024)  # a layout search asks some 10^5 times
def axis_pairs(degrees: tuple[int, ...]) -> tuple[tuple[str, int], ...]:
    """`axis_degrees` as (axis, degree) pairs: one tuple for each grid."""
    return tuple(zip(AXES, degrees, strict=True))


def node_of(rank: int, gpus_per_node: int) -> int:
    return rank // gpus_per_node  # consecutive ranks fill a node (launchers number them so)


def grid_rank(degrees: Mapping[str, int], index: Mapping[str, int]) -> int:
    """Coordinates (axis -> index; a missing axis is 0) -> global rank, `AXES` order."""
    rank = 0
    for axis in AXES:
        value, size = index.get(axis, 0), degrees[axis]
        if not 0 <= value < size:
            raise ParaxisError(f"{axis}_rank {value} is outside 0..{size - 1}")
        rank = rank * size + value
    return rank


def grid_index(degrees: Mapping[str, int], rank: int) -> dict[str, int]:
    """Global rank -> coordinates (axis -> index); the inverse of `grid_rank`."""
    world = math.prod(degrees[axis] for axis in AXES)
    if not 0 <= rank < world:
        raise ParaxisError(f"rank {rank} is outside a world of {world} ranks")
    index: dict[str, int] = {}
    for axis in reversed(AXES):  # the innermost axis is the remainder
        rank, index[axis] = divmod(rank, degrees[axis])
    return {axis: index[axis] for axis in AXES}


def grid_groups(degrees: Mapping[str, int], axes: tuple[str, ...]) -> list[list[int]]:
    """Every group along `axes`: the ranks that agree on all the other axes, each group in
    rank order, groups ordered by the other axes (outermost first). They partition the world."""
    unknown = [axis for axis in axes if axis not in AXES]
    if unknown or not axes:
        raise ParaxisError(f"unknown axis {'_'.join(axes)!r}; use names among "
                           f"{', '.join(AXES)}, ep, joined by '_' (e.g. dp_tp)")
    outside = [axis for axis in AXES if axis not in axes]
    return [_ranks_along(degrees, axes, dict(zip(outside, fixed, strict=True)))
            for fixed in itertools.product(*(range(degrees[a]) for a in outside))]


def first_group(degrees: Mapping[str, int], axes: tuple[str, ...]) -> list[int]:
    """Rank 0's group along `axes` (`grid_groups(degrees, axes)[0]`), without the world's
    others: what a planner's link reads, a search asking for it of thousands of grids."""
    return _ranks_along(degrees, axes, {})


def _ranks_along(degrees: Mapping[str, int], axes: tuple[str, ...],
                 fixed: dict[str, int]) -> list[int]:
    """The group along `axes` whose other axes sit at `fixed` (missing ones at 0): its first
    rank, plus every combination of the moving axes' strides (`grid_rank`'s arithmetic,
    without a call per rank: a planner asks this of groups of thousands)."""
    ranks = [grid_rank(degrees, fixed)]
    stride = 1
    for axis in reversed(AXES):  # innermost first, as `grid_rank` counts
        if axis in axes:
            ranks = [rank + step * stride for step in range(degrees[axis]) for rank in ranks]
        stride *= degrees[axis]
    return sorted(ranks)


def first_expert_groups(degrees: Mapping[str, int], ep: int) -> tuple[list[int], list[int]]:
    """Rank 0's expert-parallel group and its experts' data-parallel group: the first of
    `expert_groups` and of `expert_dp_groups`, from rank 0's dp x cp group alone."""
    replicas = first_group(degrees, ("dp", "cp"))
    if len(replicas) % ep:
        expert_groups(degrees, ep)  # says which ep would divide dp*cp
    return replicas[:ep], replicas[::ep]


def expert_groups(degrees: Mapping[str, int], ep: int) -> list[list[int]]:
    """The expert-parallel groups: each dp x cp group (one (pp, tp) position) cut into
    consecutive blocks of `ep` ranks, so experts never change the world size."""
    groups = grid_groups(degrees, ("dp", "cp"))
    if len(groups[0]) % ep:
        raise ParaxisError(f"ep={ep} must divide dp*cp = {len(groups[0])}; choose ep among "
                           f"{divisors_text(len(groups[0]))}")
    return [group[i:i + ep] for group in groups for i in range(0, len(group), ep)]


def expert_dp_groups(degrees: Mapping[str, int], ep: int) -> list[list[int]]:
    """The experts' data-parallel groups: the dp*cp/ep ranks of one dp x cp group that hold
    the same experts (the same index in their expert-parallel groups). Gradients of experts
    are reduced, and their ZeRO states sharded, over these."""
    expert_groups(degrees, ep)  # the same check: ep divides dp*cp
    return [group[j::ep] for group in grid_groups(degrees, ("dp", "cp")) for j in range(ep)]


def divisors(n: int) -> list[int]:
    """The whole numbers that divide n: the degrees an axis of n ranks (or n heads) can take."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]  # pairs d, n / d
    return small + [n // d for d in reversed(small) if d * d != n]


def divisors_text(n: int) -> str:
    return ", ".join(map(str, divisors(n)))
