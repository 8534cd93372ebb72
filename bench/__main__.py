"""`python -m bench` (or `make bench`): every paraxis-vs-peer row in one run.

Writes docs/benchmarks.md (table and machine description) and docs/benchmarks.json.
`--quick` runs each row at a tiny size (the smoke test uses it); `--only dp,tp` picks rows.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

SUITES = ["bench.bench_overhead", "bench.bench_dp", "bench.bench_tp", "bench.bench_pp"]


def machine() -> dict:
    return {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "python": platform.python_version(), "torch": torch.__version__,
            "backend": "gloo (CPU), one thread per rank",
            "date": time.strftime("%Y-%m-%d", time.gmtime())}


def table(rows: list[dict]) -> str:
    lines = ["| work | ranks | paraxis | tokens/s | peer | tokens/s | ratio | "
             "peak RSS/rank paraxis | peer |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['ranks']} | {r['paraxis']} | {r['paraxis_tokens_per_s']:,.0f} "
            f"| {r['peer']} | {r['peer_tokens_per_s']:,.0f} | {r['ratio']:.2f} | "
            f"{r['paraxis_peak_rss_bytes'] / 2**20:,.0f} MiB | "
            f"{r['peer_peak_rss_bytes'] / 2**20:,.0f} MiB |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    parser.add_argument("--only", default="", help="comma list of suites, e.g. dp,tp")
    parser.add_argument("--out", default="docs/benchmarks.md")
    args = parser.parse_args(argv)
    wanted = {w.strip() for w in args.only.split(",") if w.strip()}
    results: list[dict] = []
    for name in SUITES:
        short = name.rsplit("_", 1)[-1]
        if wanted and short not in wanted:
            continue
        print(f"running {name} ...", flush=True)
        for row in importlib.import_module(name).rows(quick=args.quick):
            results.append(row.to_dict())
            print(f"  {row.name}: ratio {row.ratio:.2f}", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    info = machine()
    out.with_suffix(".json").write_text(json.dumps({"machine": info, "quick": args.quick,
                                                    "rows": results}, indent=2) + "\n")
    out.write_text(
        "# Benchmarks\n\nEvery number below comes from one command: `make bench` "
        f"(`python -m bench{' --quick' if args.quick else ''}`).\n"
        "Ratio = paraxis tokens/s / peer tokens/s (>= 1.0: paraxis is as fast or faster); "
        "step time is the median over timed steps and repeats, taking the slowest rank.\n\n"
        f"Machine: {info['cpu']}, {info['cores']} cores, Python {info['python']}, torch "
        f"{info['torch']}, {info['backend']}; run on {info['date']}.\n\n"
        + table(results) + "\n")
    print(f"wrote {out} and {out.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
