"""bench.cpu_call_timeline: a call's time split into its ranks' skew, exchange and exit lag."""

from __future__ import annotations

import pytest

from bench.cpu_call_timeline import split_call, split_step


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
