"""A run's metrics file read back: the records `paraxis train --metrics-file` wrote, and their
steady value (the median after the warm-up steps). The report, `--layout auto`'s closing line
and `paraxis plan --verify` all measure a run this one way. Imports neither torch nor
matplotlib: the planner's `--verify` reads runs too.
"""

from __future__ import annotations

import json
import math
import statistics
import tomllib
from pathlib import Path

from paraxis.spec.errors import ParaxisError

WARMUP_STEPS = 3  # first steps pay for allocation and autotuning: left out of medians
# A run whose step times spread wider than this (interquartile range over the median) shared
# its machine with other load while it ran: its median is not its layout's alone. On the
# 2-core VM of docs/benchmarks.md, 13 `paraxis demo` runs spread 0.10-0.21; two others,
# 0.29 and 0.39, stepped at up to 2.2x and 3.2x their fastest steps, while the probes of
# the cores and compute rates before and after them read as usual.
DISTURBED_SPREAD = 0.25


def beside(metrics: str | Path, name: str) -> Path:
    """Where a run writes `name` ("config.toml", "trace.json") beside its metrics file: the
    plain name beside a metrics.jsonl (a folder per run), `<stem>.<name>` beside any other
    (runs/a.jsonl: runs/a.config.toml), so runs whose metrics files share a folder keep
    their own."""
    metrics = Path(metrics)
    if metrics.name == "metrics.jsonl":
        return metrics.parent / name
    return metrics.parent / f"{metrics.name.removesuffix('.jsonl')}.{name}"


def found_beside(metrics: Path, name: str) -> Path | None:
    """The `name` file a run wrote beside `metrics` (`beside`), or None. A run made before
    each had its own wrote the plain name, shared by the folder's runs: it is taken only
    where the config.toml there names this metrics file (the last run that wrote it)."""
    own = beside(metrics, name)
    if own.is_file():
        return own
    shared, config = metrics.parent / name, metrics.parent / "config.toml"
    if shared == own or not (shared.is_file() and config.is_file()):
        return None
    try:
        named = tomllib.loads(config.read_text()).get("logging", {}).get("metrics_file")
    except (OSError, ValueError, AttributeError):
        return None
    return shared if isinstance(named, str) and Path(named).name == metrics.name else None


NOT_FINITE_AS_NULL = ("loss", "grad_norm", "val_loss")
# What every step record of `paraxis train` holds, and what readers of a run rely on: numbers
# (a loss written as null was not finite); a step's time and throughput are above zero
STEP_KEYS = ("step", "loss", "tokens_per_s", "step_time_s")
POSITIVE_KEYS = ("tokens_per_s", "step_time_s")
OPTIONAL_KEYS = ("peak_mem_bytes", "cpu_steal", "predicted_step_s")  # numbers, where present
NULL_WHEN_UNMEASURED = ("cpu_steal", "predicted_step_s")  # null: a run did not measure it


def _not_a_step(record: object) -> str | None:
    """Why `record` is not a step record of `paraxis train` (None when it is one)."""
    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__}, not an object"
    missing = [key for key in STEP_KEYS if key not in record]
    if missing:
        return f"missing {', '.join(missing)}"
    for key in (*STEP_KEYS, *(k for k in OPTIONAL_KEYS if k in record)):
        value = record[key]
        if value is None and (key in NOT_FINITE_AS_NULL or key in NULL_WHEN_UNMEASURED):
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"its {key} is {json.dumps(value)}, not a number"
        if key in POSITIVE_KEYS and not value > 0:
            return f"its {key} is {value}, not above zero"
    return None


def load_metrics(path: str | Path) -> list[dict]:
    """The step records of the metrics file at `path`, one per line, each checked to be a
    step record of `paraxis train` (STEP_KEYS are numbers); a loss or norm written as null
    (not finite) is read back as NaN."""
    path = Path(path)
    try:
        lines = path.read_text().splitlines()
    except OSError as error:
        raise ParaxisError(f"cannot read metrics {path}: {error}; give the folder that "
                           "`paraxis train --metrics-file DIR/metrics.jsonl` wrote") from None
    except UnicodeDecodeError:
        raise ParaxisError(f"{path} is not a metrics file (not UTF-8 text); give the metrics "
                           "file `paraxis train --metrics-file` wrote, or its folder") from None
    records = []
    for number, line in enumerate(lines, start=1):
        if line.strip():
            try:
                record = json.loads(line)
            except ValueError:
                raise ParaxisError(f"{path}:{number} is not a JSON line; give the metrics file "
                                   "`paraxis train --metrics-file` wrote, or its folder"
                                   ) from None
            problem = _not_a_step(record)
            if problem:
                raise ParaxisError(f"{path}:{number} is not a step record of `paraxis train` "
                                   f"({problem}); give the metrics file `paraxis train "
                                   "--metrics-file` wrote, or its folder")
            # a non-finite loss or norm is written as null (metrics.strict_json)
            records.append({k: math.nan if v is None and k in NOT_FINITE_AS_NULL else v
                            for k, v in record.items()})
    if not records:
        raise ParaxisError(f"{path} holds no steps; did the run finish its first step?")
    return records


def steady_records(records: list[dict]) -> list[dict]:
    """The records after the warm-up steps (all of them when the run is that short)."""
    return records[WARMUP_STEPS:] if len(records) > 2 * WARMUP_STEPS else records


def steady(records: list[dict], key: str) -> float:
    """Median of `key` after the warm-up steps (`steady_records`)."""
    return statistics.median(r[key] for r in steady_records(records))


def steal(records: list[dict]) -> float | None:
    """The mean share of CPU time a VM's host took during the steps after the warm-up
    (`cpu_steal`, paraxis/files/host_steal.py); None where the run did not record it."""
    shares = [r["cpu_steal"] for r in steady_records(records) if r.get("cpu_steal") is not None]
    return statistics.fmean(shares) if shares else None


def spread(records: list[dict], key: str) -> float:
    """Interquartile range of `key` after the warm-up steps over its median (0 with fewer
    than four steps): above DISTURBED_SPREAD, other load shared the machine."""
    values = [r[key] for r in steady_records(records)]
    if len(values) < 4:
        return 0.0
    low, _, high = statistics.quantiles(values, n=4)
    return (high - low) / statistics.median(values)
