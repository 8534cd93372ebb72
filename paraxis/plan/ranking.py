"""How the search orders the layouts it priced: fastest first, where times within 0.5% of
each other count as equal and the simpler layout goes first (fewer model-parallel ranks, a
lower ZeRO stage, less recomputation...); the defence names what made one simpler."""

from __future__ import annotations

from paraxis.plan.cost import Estimate
from paraxis.spec.layout import RECOMPUTE

EQUAL_TIMES = 0.005  # the ranking counts times within 0.5% of each other as equal


def _simplicity(estimate: Estimate) -> tuple:
    """Simpler first: fewer model- and context-parallel ranks, lower ZeRO stage, less
    recomputation, shallower interleaving, then the smaller footprint."""
    layout = estimate.layout
    return (layout.tp * layout.pp * layout.cp, layout.ep, layout.zero,
            RECOMPUTE.index(layout.recompute), layout.virtual_stages, estimate.memory["total"])


def equal_groups(estimates: list[Estimate]) -> list[list[Estimate]]:
    """The ranking's groups in order: from the fastest layout not yet placed, every layout
    within 0.5% of its time is one group, simplest first; the next group starts at the first
    layout beyond."""
    by_time = sorted(estimates, key=lambda e: (e.step_time_s, _simplicity(e)))
    groups: list[list[Estimate]] = []
    start = 0
    while start < len(by_time):
        limit = by_time[start].step_time_s * (1 + EQUAL_TIMES)
        end = start + 1  # at least the one that starts the group
        while end < len(by_time) and by_time[end].step_time_s <= limit:
            end += 1
        groups.append(sorted(by_time[start:end], key=_simplicity))
        start = end
    return groups


def rank(estimates: list[Estimate]) -> list[Estimate]:
    """Fastest first, where times within 0.5% count as equal and the simpler layout goes
    first (`equal_groups`)."""
    return [estimate for group in equal_groups(estimates) for estimate in group]


SIMPLICITY_TERMS = ("model-parallel ranks, tp x pp x cp", "expert-parallel ranks",
                    "ZeRO stage", "recomputation", "interleaving depth", "memory per GPU")


def simpler_by(first: Estimate, second: Estimate) -> str:
    """What makes `first` simpler than `second` in the ranking's order (its first differing
    term), e.g. "model-parallel ranks, tp x pp x cp: 1 vs 2"; "" where neither is."""
    for term, a, b in zip(SIMPLICITY_TERMS, _simplicity(first), _simplicity(second),
                          strict=True):
        if a < b:
            if term == "recomputation":
                return f"{term}: {RECOMPUTE[a]} vs {RECOMPUTE[b]}"
            if term == "memory per GPU":
                return f"{term}: {a / 1e9:.1f} vs {b / 1e9:.1f} GB"
            return f"{term}: {a} vs {b}"
        if a > b:
            return ""
    return ""


def group_numbers(estimates: list[Estimate]) -> dict[int, int]:
    """Each ranked layout's group of equal times (`equal_groups`), by id(estimate): two
    layouts of one group were placed by simplicity, not by time."""
    return {id(e): number for number, group in enumerate(equal_groups(estimates))
            for e in group}
