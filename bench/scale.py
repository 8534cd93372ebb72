"""Training a model no rank can hold: the 0.8B Llama on this machine's 8 ranks.

A Llama-style model of 0.82B parameters (d_model 1536, 24 layers, 12 heads, 4 KV heads,
d_ff 5120, vocab 32000) is 3.26 GB in fp32 weights alone, 13 GB with its gradients and
AdamW's moments. `paraxis train --nproc 8` trains it for a few steps (sequence 128,
microbatch 1, fp32) with dp=8 ZeRO-3 and with tp=2 x pp=4, and again with dp=8 ZeRO-3
starting from a Hugging Face directory of it that `write_hf` wrote one tensor at a time.
Every rank's resident peak (`peak_mem_bytes_by_rank` in the metrics file) is set next to
the planner's forecast for that layout (`plan.memory.layout_memory` with this machine's
process baseline from `calibrate.baseline`). Runs only with at least 21 GiB free;
`--quick` does the same with a small model on 2 ranks.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from paraxis.model.hf import write_hf
from paraxis.model.init_weights import initial_value
from paraxis.model.transformer import parameter_shapes
from paraxis.plan.memory import layout_memory
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import ModelConfig
from paraxis.spec.precision import PRECISIONS
from paraxis.train.calibrate.baseline import process_baseline_bytes

MODEL = ModelConfig("llama-0.8b", "llama", 32000, 24, 1536, 12, 4, 5120, 128)
QUICK_MODEL = ModelConfig("llama-tiny-scale", "llama", 256, 4, 128, 4, 2, 384, 64)
# recompute=full: fp32 activations of 24 layers at sequence 128 are 390 MB a rank, which 8
# ranks cannot add to what they hold on a 24 GB machine (docs/memory.md)
RUNS = [("dp=8,zero=3,recompute=full", None),
        ("tp=2,pp=4,microbatches=4,recompute=full", None),
        ("dp=8,zero=3,recompute=full", "hf")]
QUICK_RUNS = [("dp=2,zero=3", None), ("tp=2", None), ("dp=2,zero=3", "hf")]
FREE_NEEDED = 21 * 2**30


def free_bytes() -> int:
    with open("/proc/meminfo") as info:
        fields = dict(line.split(":", 1) for line in info)
    return int(fields["MemAvailable"].split()[0]) * 1024


def forecast(cfg: ModelConfig, layout: Layout, seq_len: int, micro_batch: int,
             baseline: float) -> float:
    """The planner's per-rank peak for the run (fp32, this machine's process baseline)."""
    return layout_memory(cfg, layout, seq_len, micro_batch, PRECISIONS["fp32"],
                         reserved=baseline)["total"]


def write_model_hf(cfg: ModelConfig, directory: Path, seed: int = 0) -> float:
    """A Hugging Face directory of the model's seed weights, made one tensor at a time."""
    shapes = parameter_shapes(cfg)
    started = time.perf_counter()
    write_hf(directory, cfg, lambda name: initial_value(name, shapes[name], cfg, seed))
    return time.perf_counter() - started


def train(cfg: ModelConfig, layout: str, steps: int, work: Path, nproc: int,
          init_from: Path | None) -> dict:
    model_file = work / "model.json"
    model_file.write_text(json.dumps(cfg.to_dict()))
    metrics = work / f"metrics-{len(list(work.glob('metrics-*')))}.jsonl"
    parsed = Layout.parse(layout)
    command = [sys.executable, "-m", "paraxis", "train", "--model", str(model_file),
               "--nproc", str(nproc), "--layout", layout, "--steps", str(steps),
               "--global-batch", str(parsed.dp * parsed.microbatches),
               "--seq-len", str(cfg.max_seq_len), "--metrics-file", str(metrics), "--quiet"]
    if init_from is not None:
        command += ["--init-from", str(init_from)]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    peaks = [r["peak_mem_bytes_by_rank"] for r in records if "peak_mem_bytes_by_rank" in r]
    return {"losses": [r["loss"] for r in records], "peaks": peaks[-1],
            "seconds": time.perf_counter() - started}


def run(quick: bool) -> dict:
    cfg, runs, nproc = (QUICK_MODEL, QUICK_RUNS, 2) if quick else (MODEL, RUNS, 8)
    if not quick and free_bytes() < FREE_NEEDED:
        return {"skipped": f"{free_bytes() / 2**30:.1f} GiB free, {FREE_NEEDED / 2**30:.0f} "
                           "GiB needed"}
    baseline = float(process_baseline_bytes())
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        hf_dir, hf_seconds = work / "hf", None
        for layout, start in runs:
            if start == "hf" and hf_seconds is None:
                print(f"  writing {cfg.name} as a Hugging Face directory ...", flush=True)
                hf_seconds = write_model_hf(cfg, hf_dir)
            print(f"  training {cfg.name} on {layout}{' from HF' if start else ''} ...",
                  flush=True)
            result = train(cfg, layout, 2, work, nproc, hf_dir if start else None)
            parsed = Layout.parse(layout)
            predicted = forecast(cfg, parsed, cfg.max_seq_len, 1, baseline)
            rows.append({"layout": layout, "start": "Hugging Face" if start else "seed",
                         **result, "forecast": predicted,
                         "error": max(result["peaks"]) / predicted - 1})
    return {"model": cfg.to_dict(), "params": cfg.num_params(), "nproc": nproc,
            "baseline": baseline, "hf_write_seconds": hf_seconds, "rows": rows}


def render(section: dict) -> str:
    if "skipped" in section:
        return f"## A model no rank can hold\n\nNot run: {section['skipped']}.\n"
    cfg = section["model"]
    full = 4 * section["params"]
    lines = ["## A model no rank can hold\n",
             f"{cfg['name']}: {section['params'] / 1e9:.2f}B parameters ({full / 1e9:.2f} GB "
             f"of fp32 weights, {4 * full / 1e9:.1f} GB with gradients and AdamW), "
             f"{section['nproc']} ranks, sequence {cfg['max_seq_len']}, microbatch 1, fp32, "
             "2 steps. Peak: each rank's resident peak (ru_maxrss); forecast: the planner's "
             "per-rank memory for the layout with this machine's process baseline "
             f"({section['baseline'] / 2**20:,.0f} MiB, `calibrate.baseline`).\n",
             "| layout | weights from | losses | largest rank peak | sum of rank peaks | "
             "forecast | error | time |", "|---|---|---|---|---|---|---|---|"]
    for r in section["rows"]:
        losses = ", ".join(f"{x:.3f}" for x in r["losses"])
        lines.append(f"| {r['layout']} | {r['start']} | {losses} | "
                     f"{max(r['peaks']) / 2**30:.2f} GiB | {sum(r['peaks']) / 2**30:.1f} GiB | "
                     f"{r['forecast'] / 2**30:.2f} GiB | {r['error']:+.0%} | "
                     f"{r['seconds']:.0f} s |")
    if section.get("hf_write_seconds") is not None:
        lines.append(f"\nThe Hugging Face directory was written in "
                     f"{section['hf_write_seconds']:.0f} s, one tensor at a time.")
    return "\n".join(lines) + "\n"
