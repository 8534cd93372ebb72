"""tools.probes.pooled: the groups of several committed bench runs, run by run and pooled."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"
RUNS = [RESULTS / "benchmarks-backward", RESULTS / "benchmarks-backward-rerun"]


def test_pooled_groups_are_the_runs_rows_together(monkeypatch, capsys):
    from tools.probes import pooled

    monkeypatch.setattr(sys, "argv", ["pooled", "--before", "forward_segment", *map(str, RUNS)])
    pooled.main()
    out = capsys.readouterr().out.split("pooled (")[1]
    rows = [r for run in RUNS for r in json.loads((run / "benchmarks.json").read_text())
            ["sections"]["predicted"]["rows"]]
    first = [r["error"] for r in rows if not any(
        v is True for k, v in r.items() if k.startswith("after_"))]
    assert len(first) == 24
    assert (f"the fix was found on: 24 rows, {statistics.mean(map(abs, first)):.1%} / "
            f"{statistics.mean(first):+.1%}") in out
    shifts = [r["error"] - r["before"]["forward_segment"]["error"] for r in rows]
    assert f"by {100 * min(shifts):+.1f} to {100 * max(shifts):+.1f} points" in out
    assert max(shifts) > 0 and min(shifts) == pytest.approx(0)  # the change only adds waits
