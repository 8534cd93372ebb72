"""Every axis's CUDA code on a machine with fewer GPUs than ranks (`--share-gpu`).

    python -m tools.probes.shared_gpu [--steps 3] [--only NAME ...]

Trains tiny models for a few steps on 4 (or 2) CUDA ranks sharing the machine's GPUs, their
collectives staged through gloo (paraxis/dist/shared_gpu.py), one layout per axis and
schedule, and prints each run's losses beside the same model on one GPU alone (fp32, TF32
off as paraxis sets it for fp32). A layout whose CUDA path breaks fails here, not first on an
8-GPU machine; the largest relative loss difference says whether it trains the same numbers.
Run it on a lent GPU (docs/gpu/README.md, "On the next lent GPU").
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

# name -> (model, ranks, layout, precision): one run per axis and schedule (context
# parallelism runs FlashAttention on a GPU, which has no fp32 kernel: bf16 there)
RUNS = {
    "dp zero=1": ("tiny-llama", 2, "dp=2,zero=1", "fp32"),
    "dp zero=3": ("tiny-llama", 2, "dp=2,zero=3", "fp32"),
    "tp sp": ("tiny-llama", 2, "tp=2,sequence_parallel=true", "fp32"),
    "pp 1f1b": ("tiny-llama", 2, "pp=2,microbatches=4", "fp32"),
    "pp interleaved": ("tiny-llama", 2, "pp=2,microbatches=4,schedule=interleaved,"
                                        "virtual_stages=2", "fp32"),
    "pp zero-bubble": ("tiny-llama", 2, "pp=2,microbatches=4,schedule=zb-h1", "fp32"),
    "cp ring": ("tiny-llama", 2, "cp=2", "bf16"),
    "ep": ("tiny-moe", 2, "dp=2,ep=2", "fp32"),
    "tp x pp": ("tiny-llama", 4, "tp=2,pp=2,microbatches=4", "fp32"),
    "dp x cp zero=2": ("tiny-llama", 4, "dp=2,cp=2,zero=2", "bf16"),
    "dp x tp x pp": ("tiny-llama", 8, "dp=2,tp=2,pp=2,zero=1,microbatches=4", "fp32"),
    # compiled whole, as CUDA runs of layouts that communicate nothing inside the model are
    # by default (the others run uncompiled under --share-gpu: paraxis/train/loop.py)
    "dp compiled": ("tiny-llama", 2, "dp=2,zero=1", "fp32"),
}


def losses(model: str, ranks: int, layout: str, precision: str, steps: int, device: str,
           compiled: bool = False) -> list[float]:
    with tempfile.TemporaryDirectory() as folder:
        metrics = Path(folder) / "metrics.jsonl"
        command = [sys.executable, "-m", "paraxis", "train", "--model", model, "--device",
                   device, "--precision", precision, "--steps", str(steps), "--global-batch",
                   "8", "--seq-len", "64", "--log-every", "1",
                   "--compile" if compiled else "--no-compile",
                   "--metrics-file", str(metrics), "--nproc", str(ranks)]
        if ranks > 1:
            command += ["--layout", layout, "--share-gpu"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        if done.returncode:
            raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr else
                               f"exit {done.returncode}")
        return [json.loads(line)["loss"] for line in metrics.read_text().splitlines()
                if '"loss"' in line]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--only", nargs="*", choices=sorted(RUNS))
    parser.add_argument("--device", default="cuda",
                        help="cpu runs the same staged group on CPU ranks (a check of this probe)")
    args = parser.parse_args()
    alone: dict[tuple[str, str], list[float]] = {}
    print("| run | layout | ranks | losses on shared GPUs | one GPU | largest rel. diff |")
    print("|---|---|---|---|---|---|")
    failed = 0
    for name in args.only or RUNS:
        model, ranks, layout, precision = RUNS[name]
        if (model, precision) not in alone:
            alone[model, precision] = losses(model, 1, "", precision, args.steps, args.device)
        single = alone[model, precision]
        try:
            shared = losses(model, ranks, layout, precision, args.steps, args.device,
                            compiled=name.endswith("compiled"))
        except (RuntimeError, subprocess.TimeoutExpired) as error:
            failed += 1
            print(f"| {name} | {layout} | {ranks} | failed: {error} | | |", flush=True)
            continue
        diff = max(abs(a - b) / abs(b) for a, b in zip(shared, single, strict=True))
        print(f"| {name} | {layout} {precision} | {ranks} | "
              f"{', '.join(f'{x:.6f}' for x in shared)} | "
              f"{', '.join(f'{x:.6f}' for x in single)} | {diff:.1e} |", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
