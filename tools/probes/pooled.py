"""The predicted-vs-measured groups of several bench runs, run by run and pooled.

    python -m tools.probes.pooled [--before KEY] DIR [DIR ...]

Each DIR holds a `benchmarks.json` that `python -m bench --only calibrate,predicted --out
DIR/benchmarks.md` wrote. Per run and over all the runs' rows together: each group's mean
|error| and mean signed error (`bench.predicted_vs_measured.groups`), and with `--before KEY`
(one of `bench.befores.BEFORES`) the same figures priced that way on the same measurements,
and how far the model moved each row from it (points, the rows it moved).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.predicted_vs_measured import groups


def _line(name: str, figures: dict, before: str) -> str:
    text = (f"  {name}: {figures['layouts']} rows, {figures['mean_abs_error']:.1%} / "
            f"{figures['mean_signed_error']:+.1%}")
    if before in figures["before"]:
        was = figures["before"][before]
        text += f" (as before: {was['mean_abs_error']:.1%} / {was['mean_signed_error']:+.1%})"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dirs", nargs="+")
    parser.add_argument("--before", default="", help="a BEFORES key to compare with")
    args = parser.parse_args()
    runs = {d: json.loads((Path(d) / "benchmarks.json").read_text())["sections"]["predicted"]
            ["rows"] for d in args.dirs}
    for name, rows in [*runs.items(), ("pooled", [r for run in runs.values() for r in run])]:
        print(f"{name} (mean |error| / mean signed error):")
        for group, figures in groups(rows).items():
            print(_line(group, figures, args.before))
        shifts = [100 * (r["error"] - r["before"][args.before]["error"])
                  for r in rows if args.before in r.get("before", {})]
        if shifts:
            moved = [s for s in shifts if abs(s) >= 0.05]
            print(f"  rows moved from '{args.before}': {len(moved)} of {len(shifts)}, by "
                  f"{min(shifts):+.1f} to {max(shifts):+.1f} points")


if __name__ == "__main__":
    main()
