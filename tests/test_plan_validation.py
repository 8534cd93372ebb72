"""The planner stays within 20% of every published run in docs/validation.md."""

import pytest

from bench.validate_planner import RUNS, predict


@pytest.mark.parametrize("run", RUNS, ids=[run.name for run in RUNS])
def test_prediction_within_20_percent_of_published(run) -> None:
    value, layout = predict(run)
    assert "does not fit" not in layout
    assert value == pytest.approx(run.published, rel=0.20)


def test_at_least_six_runs_from_two_papers() -> None:
    assert len(RUNS) >= 6 and len({run.source for run in RUNS}) >= 2
