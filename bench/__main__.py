"""`python -m bench` (or `make bench`): every benchmark in one run.

Writes docs/benchmarks.md and docs/benchmarks.json: the paraxis-vs-peer rows (overhead, dp,
tp, pp; cp: context-parallel attention next to PyTorch's private ring attention template;
compile: `--compile` next to eager paraxis), then the calibrated hardware profile
(calibrate, also written as docs/hardware-profile.json), the planner's predicted step time
next to the measured one (predicted), the scaling picture (scaling, docs/img/scaling.png)
and, on a CUDA machine, paraxis's bf16 step on one GPU with its MFU (gpu; not run without
CUDA); each precision policy next to fp32 (precision); a 0.8B model no rank can hold, on 8
ranks, each rank's peak next to the planner's forecast (scale; needs 21 GiB free); the
planner's top 5 layouts trained side by side, auto's pick against the fastest (auto).
`--quick` runs each part at a tiny size (the smoke test uses it); `--only dp,predicted` picks
parts, keeping the other parts' last results from the JSON; predicted and scaling always
calibrate first, in the same run.
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

# short name -> module; row suites return paraxis-vs-peer Rows, sections their own document.
SUITES = {"overhead": "bench.bench_overhead", "dp": "bench.bench_dp", "tp": "bench.bench_tp",
          "pp": "bench.bench_pp", "cp": "bench.bench_cp", "compile": "bench.bench_compile"}
SECTIONS = ("calibrate", "predicted", "scaling", "gpu", "precision", "scale", "faults",
            "auto")
CALIBRATED = {"calibrate", "predicted", "scaling"}  # sections that need this run's profile


def machine() -> dict:
    from paraxis.train.calibrate.measure import cpu_model_name

    return {"cpu": cpu_model_name(), "cores": os.cpu_count(),
            "python": platform.python_version(), "torch": torch.__version__,
            "backend": "gloo (CPU), one thread per rank",
            "date": time.strftime("%Y-%m-%d", time.gmtime()),
            "load_average": [round(x, 1) for x in os.getloadavg()]}


def table(rows: list[dict]) -> str:
    lines = ["| work | ranks | paraxis | tokens/s | peer | tokens/s | ratio | 95% interval | "
             "steps | peak RSS/rank paraxis | peer |", "|---" * 11 + "|"]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['ranks']} | {r['paraxis']} | {r['paraxis_tokens_per_s']:,.0f} "
            f"| {r['peer']} | {r['peer_tokens_per_s']:,.0f} | {r['ratio']:.2f} | "
            f"{_interval(r)} | {r.get('steps_timed', '')} | "
            f"{r['paraxis_peak_rss_bytes'] / 2**20:,.0f} MiB | "
            f"{r['peer_peak_rss_bytes'] / 2**20:,.0f} MiB |")
    return "\n".join(lines)


def _measured_on(info: dict) -> str:
    """Where and when a row was measured, from `machine()`'s fields."""
    return f"{info['cpu']}, {info['date']}"


def _elsewhere(rows: list[dict], info: dict) -> str:
    """Which suites' rows an earlier run measured (`--only` keeps them), on what machine."""
    here = _measured_on(info)
    others: dict[str, list[str]] = {}
    for r in rows:
        where = r.get("measured_on", "an earlier run (machine not recorded)")
        if where != here and r.get("suite") not in others.get(where, []):
            others.setdefault(where, []).append(r.get("suite", "?"))
    return "".join(f"\nRows of {', '.join(suites)}: measured on {where}.\n"
                   for where, suites in others.items())


def _below_one(rows: list[dict]) -> str:
    """One line per row under 1.0: a tie when its interval reaches 1.0, else a loss."""
    lines = []
    for r in rows:
        low, high = r.get("ratio_interval") or (0.0, 0.0)
        if r["ratio"] >= 1.0 or not high:
            continue
        verdict = ("a tie at this machine's noise: the interval reaches 1.0" if high >= 1.0
                   else f"paraxis slower by {1 - r['ratio']:.0%}: the interval stays below 1.0")
        lines.append(f"- {r['name']}: ratio {r['ratio']:.3f} ({low:.2f}-{high:.2f}), {verdict}.")
    return ("\nRows under 1.0:\n\n" + "\n".join(lines) + "\n") if lines else ""


def _interval(row: dict) -> str:
    low, high = row.get("ratio_interval") or (0.0, 0.0)
    return f"{low:.2f}-{high:.2f}" if high else "-"


def _previous(json_path: Path, quick: bool) -> dict:
    """The last run's document, when it was run at the same size (else nothing to keep)."""
    try:
        doc = json.loads(json_path.read_text())
    except (OSError, ValueError):
        return {}
    return doc if doc.get("quick") == quick else {}


def _run_sections(wanted: set[str], quick: bool, out: Path,
                  layouts: list[str] | None = None) -> dict:
    from bench import calibration, gpu, precision, predicted_vs_measured, scale, scaling
    from paraxis.files.host import write_whole

    sections: dict[str, dict] = {}
    if "scale" in wanted:
        print("running a model no rank can hold (0.8B on 8 ranks) ...", flush=True)
        sections["scale"] = scale.run(quick)
    if "precision" in wanted:
        print("running precision policies ...", flush=True)
        sections["precision"] = precision.run(quick)
    if "gpu" in wanted:
        print("running one GPU (bf16 steps, GPT-2 124M to 1.5B) ...", flush=True)
        sections["gpu"] = gpu.run(quick)
    if "faults" in wanted:
        from bench import faults

        print("running the fault matrix (kills and SIGTERMs, resumed exactly) ...", flush=True)
        sections["faults"] = faults.run(quick)
    if "auto" in wanted:
        from bench import auto

        print("running --layout auto's top 5 side by side ...", flush=True)
        sections["auto"] = auto.run(quick, log=lambda line: print(f"  {line}", flush=True))
    if not wanted & CALIBRATED:
        return sections
    # predictions need this machine's profile from this same run
    print("running paraxis calibrate ...", flush=True)
    profile = calibration.run(quick, log=lambda line: print(f"  {line}", flush=True))
    sections["calibrate"] = profile
    # whole or not at all: a profile already there survives a failed write
    write_whole(out.parent / calibration.PROFILE_NAME, json.dumps(profile, indent=2) + "\n")
    if "predicted" in wanted:
        print("running predicted vs measured ...", flush=True)
        sections["predicted"] = predicted_vs_measured.run(quick, profile, layouts)
    if "scaling" in wanted:
        print("running scaling ...", flush=True)
        sections["scaling"] = scaling.run(quick, profile, out.parent)
    return sections


def render(doc: dict) -> str:
    from bench import calibration, gpu, precision, predicted_vs_measured, scale, scaling

    info = doc["machine"]
    parts = [
        "# Benchmarks\n\nEvery number below comes from one command: `make bench` "
        f"(`python -m bench{' --quick' if doc['quick'] else ''}`).\n\n"
        f"Machine: {info['cpu']}, {info['cores']} cores, Python {info['python']}, torch "
        f"{info['torch']}, {info['backend']}; run on {info['date']}"
        + (f"; load average {', '.join(map(str, info['load_average']))} (1, 5, 15 min) at "
           "the end (the benchmark's own ranks included)" if
           "load_average" in info else "") + ".\n"]
    if doc["rows"]:
        parts.append(
            "## paraxis next to PyTorch's own implementations\n\n"
            "Ratio = paraxis tokens/s / peer tokens/s (>= 1.0: paraxis is as fast or faster). "
            "Both sides are built in the same processes and their steps alternate, so a slow "
            "spell of the machine lands on both; a step counts at its slowest rank, a side's "
            "step time is the median over all its timed steps (`steps`, over the repeats), and "
            "the 95% interval of the ratio comes from a two-stage bootstrap: the runs (process "
            "launches), then the step pairs within each. Peak RSS is measured with each side "
            "alone in its processes.\n\n"
            + table(doc["rows"]) + "\n" + _elsewhere(doc["rows"], info)
            + _below_one(doc["rows"]))
    from bench import auto, faults

    renderers = {"calibrate": calibration.render, "predicted": predicted_vs_measured.render,
                 "scaling": scaling.render, "gpu": gpu.render, "precision": precision.render,
                 "scale": scale.render, "faults": faults.render, "auto": auto.render}
    for name in SECTIONS:
        if name in doc["sections"]:
            parts.append(renderers[name](doc["sections"][name]))
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (smoke test)")
    parser.add_argument("--only", default="",
                        help=f"comma list of parts: {', '.join([*SUITES, *SECTIONS])}")
    parser.add_argument("--out", default="docs/benchmarks.md")
    parser.add_argument("--layouts", default="",
                        help="predicted: comma list of layout groups (first, after_fix, ..., "
                             "after_mean; default all)")
    args = parser.parse_args(argv)
    wanted = {w.strip() for w in args.only.split(",") if w.strip()} or {*SUITES, *SECTIONS}
    unknown = wanted - {*SUITES, *SECTIONS}
    if unknown:
        parser.error(f"unknown part(s) {', '.join(sorted(unknown))}; choose from "
                     f"{', '.join([*SUITES, *SECTIONS])}")
    from bench.predicted_vs_measured import GROUP_LAYOUTS

    groups = [g.strip() for g in args.layouts.split(",") if g.strip()]
    unknown_groups = sorted(set(groups) - set(GROUP_LAYOUTS))
    if unknown_groups:
        parser.error(f"unknown layout group(s) {', '.join(unknown_groups)}; choose from "
                     f"{', '.join(GROUP_LAYOUTS)}")
    layouts = [t for g in groups for t in GROUP_LAYOUTS[g]] or None
    out = Path(args.out)
    # asked before any part runs (they take minutes), so nothing is measured for nothing
    if out.is_dir():
        parser.error(f"--out {out} is a folder; give the report's file, e.g. "
                     f"{out / 'benchmarks.md'} (its .json is written beside it)")
    if any(parent.is_file() for parent in out.parents):
        parser.error(f"--out {out}: a folder on its path is a file; give a path in a folder")
    if out.suffix == ".json" or out.with_suffix(".json").is_dir():
        parser.error(f"--out {out}: its figures go to {out.with_suffix('.json')} beside it; "
                     "give a .md path whose .json is free, e.g. benchmarks.md")
    out.parent.mkdir(parents=True, exist_ok=True)
    previous = _previous(out.with_suffix(".json"), args.quick)
    ran = [short for short in SUITES if short in wanted]
    # Rows of suites not run this time stay; rows from before suites were recorded are
    # kept only when no suite runs.
    results = [row for row in previous.get("rows", [])
               if (row["suite"] not in ran if "suite" in row else not ran)]
    here = _measured_on(machine())
    for short in ran:
        print(f"running {SUITES[short]} ...", flush=True)
        for row in importlib.import_module(SUITES[short]).rows(quick=args.quick):
            results.append({**row.to_dict(), "suite": short,
                            "measured_on": here})
            low, high = row.ratio_interval
            print(f"  {row.name}: ratio {row.ratio:.2f} ({low:.2f}-{high:.2f})", flush=True)
    order = list(SUITES)
    results.sort(key=lambda row: order.index(row["suite"]) if row.get("suite") in order else 0)
    sections = {**previous.get("sections", {}),
                **_run_sections(wanted, args.quick, out, layouts)}
    # The machine line describes the CPU rows: a GPU-only run (often on another machine)
    # keeps the line of the run that produced them; its own section names its device.
    cpu_parts_ran = bool(ran) or bool(wanted & CALIBRATED)
    host = machine() if cpu_parts_ran or "machine" not in previous else previous["machine"]
    doc = {"machine": host, "quick": args.quick, "rows": results, "sections": sections}
    out.with_suffix(".json").write_text(json.dumps(doc, indent=2) + "\n")
    out.write_text(render(doc))
    print(f"wrote {out} and {out.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
