"""tools.probes.cpu_call_timeline: a call's time split into its ranks' skew, exchange, exit lag."""

from __future__ import annotations

import pytest

from paraxis.spec.layout import Layout
from tools.probes.cpu_call_timeline import split_call, split_groups, split_step


def test_a_call_splits_into_skew_exchange_and_exit_lag():
    # rank 0 enters at 1.0 s, rank 1 at 1.5; rank 1 leaves at 3.0, rank 0 at 3.25
    split = split_call([(1.0, 3.25, 8), (1.5, 3.0, 8)])
    assert split.skew == pytest.approx(0.5)  # rank 0 waited for rank 1
    assert split.exchange == pytest.approx(1.5)  # both inside: 1.5 -> 3.0
    assert split.exit_lag == pytest.approx(0.25)  # rank 0 still finishing
    assert split.mean_call == pytest.approx((2.25 + 1.5) / 2)
    assert split.skew + split.exchange + split.exit_lag == pytest.approx(3.25 - 1.0)


def test_a_step_pairs_the_ranks_calls_in_order_and_refuses_unequal_counts():
    calls = split_step([[(0.0, 1.0, 4), (2.0, 3.0, 16)], [(0.5, 1.0, 4), (2.0, 3.5, 16)]])
    assert [c.bytes for c in calls] == [4, 16]
    assert [c.skew for c in calls] == [0.5, 0.0]
    with pytest.raises(ValueError, match="different numbers"):
        split_step([[(0.0, 1.0, 4)], []])


def test_each_tp_group_of_a_pipeline_is_paired_on_its_own():
    # dp=1,tp=2,pp=2: ranks 0-1 one stage, 2-3 the other; the stages make different numbers
    # of calls (the last stage's loss calls), which pairing all four ranks would refuse
    layout = Layout.parse("dp=1,tp=2,pp=2")
    first, last = [(0.0, 1.0, 4)], [(0.0, 1.0, 4), (2.0, 3.0, 4)]
    ranks = [[first], [[(0.25, 1.0, 4)]], [last], [[(0.0, 1.5, 4), (2.5, 3.0, 4)]]]
    groups = split_groups(layout, ranks)
    assert sorted(groups) == sorted(tuple(g) for g in layout.groups("tp"))
    by_size = {len(steps[0]): (members, steps[0]) for members, steps in groups.items()}
    assert set(by_size) == {1, 2}  # one group of one call a step, one of two
    assert by_size[1][1][0].skew == pytest.approx(0.25)
    assert [c.skew for c in by_size[2][1]] == pytest.approx([0.0, 0.5])
