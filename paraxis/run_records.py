"""A run's metrics file read back: the records `paraxis train --metrics-file` wrote, and their
steady value (the median after the warm-up steps). The report, `--layout auto`'s closing line
and `paraxis plan --verify` all measure a run this one way. Imports neither torch nor
matplotlib: the planner's `--verify` reads runs too.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from paraxis.errors import ParaxisError

WARMUP_STEPS = 3  # first steps pay for allocation and autotuning: left out of medians


def load_metrics(path: str | Path) -> list[dict]:
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except OSError as error:
        raise ParaxisError(f"cannot read metrics {path}: {error}; give the folder that "
                           "`paraxis train --metrics-file DIR/metrics.jsonl` wrote") from None
    records = []
    for number, line in enumerate(lines, start=1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except ValueError:
                raise ParaxisError(f"{path}:{number} is not a JSON line") from None
    if not records:
        raise ParaxisError(f"{path} holds no steps; did the run finish its first step?")
    return records


def steady_records(records: list[dict]) -> list[dict]:
    """The records after the warm-up steps (all of them when the run is that short)."""
    return records[WARMUP_STEPS:] if len(records) > 2 * WARMUP_STEPS else records


def steady(records: list[dict], key: str) -> float:
    """Median of `key` after the warm-up steps (`steady_records`)."""
    return statistics.median(r[key] for r in steady_records(records))
