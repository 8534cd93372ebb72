"""`units.runs_within`: how gradient sums over tp and checkpoint files are grouped."""

from __future__ import annotations

from paraxis.spec.units import runs_within


def test_runs_keep_order_stay_within_the_limit_and_put_a_large_item_alone() -> None:
    sizes = [3, 4, 2, 9, 1, 1, 5]
    runs = runs_within(sizes, lambda n: n, 7)
    assert runs == [[3, 4], [2], [9], [1, 1, 5]]
    assert [n for run in runs for n in run] == sizes
    assert runs_within([], lambda n: n, 7) == [[]]  # nothing to group: one empty run
