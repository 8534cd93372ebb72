"""The planner's forecast of every paraxis side `bench.gpu` measured on a lent GPU, as the
planner prices it now, beside the measured step and peak memory: each json of docs/gpu/*/
that has runs.

    python -m tools.probes.planner_gpu_runs [--root docs/gpu]

A run is priced on the preset its json names, with the side's kernels, precision and loss
as `bench.gpu.planned` gives them; the runtime changed between lent GPUs, so a row is the
planner now against the runtime of its day. The planner's peak is its bytes less its reserve,
what `max_memory_allocated` counts. Each row also gives the run's compiled
reference's seconds a kernel, which tells a slow host from a slow runtime: the reference's
step is the same code on every run. Not every row is held out: the per-block kernel counts
(`plan.compute.LAYER_KERNELS`) were measured on the host of the fifth H200 run
(docs/gpu/h200-2026-11-28), so that run's rows are in sample for the host's share.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from bench import gpu


def rows(root: Path) -> list[dict]:
    """One row per measured paraxis side of every bench.gpu json under `root`."""
    out = []
    for path in sorted(root.glob("*/*.json")):
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or not data.get("preset"):
            continue
        for run in data.get("runs", []):
            sides = run.get("sides") or {}
            reference = sides.get("reference") or {}
            per_kernel = (reference["step_time_s"] / reference["kernels_per_step"]
                          if reference.get("kernels_per_step") else None)
            priced = gpu.planned(gpu.model(run["model"]), run["batch"], run["seq"],
                                 data["preset"])
            for side, measured in sides.items():
                if side in priced and measured.get("step_time_s"):
                    out.append({"file": f"{path.parent.name}/{path.name}",
                                "run": f"{run['model']} {run['batch']} x {run['seq']}",
                                "side": side, "measured": measured["step_time_s"],
                                "planner": priced[side].step_time_s,
                                "measured_peak": measured.get("peak_memory_bytes"),
                                "planner_peak": gpu.allocated_bytes(priced[side]),
                                "reference_per_kernel": per_kernel})
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("docs/gpu"))
    args = parser.parse_args(argv)
    table = rows(args.root)
    print("| file | run | side | measured | planner | error | measured peak | planner peak "
          "| error | reference's host a kernel |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for row in table:
        error = row["planner"] / row["measured"] - 1
        host = (f"{row['reference_per_kernel'] * 1e6:.1f} us"
                if row["reference_per_kernel"] else "-")
        peak = row["measured_peak"]
        memory = (f"{peak / 2**30:.1f} GiB | {row['planner_peak'] / 2**30:.1f} GiB | "
                  f"{row['planner_peak'] / peak - 1:+.1%}" if peak else "- | - | -")
        print(f"| {row['file']} | {row['run']} | {row['side']} | "
              f"{row['measured'] * 1e3:.1f} ms | {row['planner'] * 1e3:.1f} ms | "
              f"{error:+.0%} | {memory} | {host} |")
    errors = [abs(r["planner"] / r["measured"] - 1) for r in table]
    peaks = [abs(r["planner_peak"] / r["measured_peak"] - 1) for r in table
             if r["measured_peak"]]
    if errors:
        print(f"\n{len(errors)} sides: step mean |error| {statistics.mean(errors):.1%}, "
              f"within 10%: {sum(e <= 0.10 for e in errors)}")
    if peaks:
        print(f"{len(peaks)} sides with a peak: mean |error| {statistics.mean(peaks):.1%}, "
              f"within 5%: {sum(e <= 0.05 for e in peaks)}")


if __name__ == "__main__":
    main()
