"""Where paraxis's compiled step and the compiled reference differ, kernel by kernel.

    python -m tools.probes.gpu_sides_profile [--run N] [--sides A,B] [--out DIR]  # CUDA

For one run of `bench.gpu` (default GPT-2 124M at 16 x 1024), each of the sides (default
"paraxis --compile", "reference" and eager "paraxis"; any of bench.gpu's) after warm-up:
wall time per step, GPU busy time, and the kernels that take the most time per step (name,
count and milliseconds per step),
from `torch.profiler` over three steps. Writes DIR/gpu-sides-profile.json.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from bench import gpu
from bench.common import token_batch

SIDES = ("paraxis --compile", "reference", "paraxis")
STEPS = 3


def profile_side(side: str, cfg, x, y, device) -> dict:
    step = gpu.build_side(side, cfg, x, y, True, device)
    for _ in range(4):
        step()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - started) / 10
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(STEPS):
            step()
        torch.cuda.synchronize()
    times, counts = defaultdict(float), defaultdict(int)
    for event in prof.events():
        if event.device_type == DeviceType.CUDA:
            times[event.name] += event.device_time / 1e3 / STEPS  # ms per step
            counts[event.name] += 1
    top = sorted(times, key=times.get, reverse=True)[:40]
    return {"wall_ms": wall * 1e3, "busy_ms": sum(times.values()),
            "kernels": sum(counts.values()) / STEPS,
            "top": [(name[:140], counts[name] / STEPS, times[name]) for name in top]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=int, default=0)
    parser.add_argument("--sides", default=",".join(SIDES),
                        help="bench.gpu's side names, comma-separated")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    sides = args.sides.split(",")
    unknown = sorted(set(sides) - set(gpu.SIDES))
    if unknown:
        parser.error(f"unknown side(s) {', '.join(unknown)}; give some of {', '.join(gpu.SIDES)}")
    torch.backends.cuda.matmul.allow_tf32 = True
    device = torch.device("cuda", 0)
    model_name, batch, seq = gpu.FULL["runs"][args.run]
    cfg = gpu.model(model_name)
    x, y = token_batch(cfg.vocab_size, batch, seq, device)
    result = {}
    for side in sides:
        result[side] = profile_side(side, cfg, x, y, device)
        torch._dynamo.reset()
        torch.cuda.empty_cache()
        r = result[side]
        print(f"\n{side}: wall {r['wall_ms']:.1f} ms, GPU busy {r['busy_ms']:.1f} ms, "
              f"{r['kernels']:.0f} kernels a step", flush=True)
        for name, count, ms in r["top"][:25]:
            print(f"  {ms:7.2f} ms {count:5.0f}x  {name[:110]}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu-sides-profile.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
