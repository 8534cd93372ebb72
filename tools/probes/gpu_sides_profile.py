"""Where paraxis's compiled step and the compiled reference differ, kernel by kernel.

    python -m tools.probes.gpu_sides_profile [--run N] [--sides A,B] [--out DIR]  # CUDA

For one run of `bench.gpu` (default GPT-2 124M at 16 x 1024), each of the sides (default
"paraxis --compile", "reference" and eager "paraxis"; any of bench.gpu's) after warm-up:
wall time per step, GPU busy time, and the kernels that take the most time per step (name,
count and milliseconds per step),
from `torch.profiler` over three steps. Writes DIR/gpu-sides-profile.json, which also holds
every kernel by name (`every`) and the kernels a step by where the host launched them
(`origins`: the outermost CPU event above the launch, such as the optimizer's step, an
autograd node or the compiled graph's call, then the op that launched them), so that two
sides' counts can be told apart without another run.
"""

from __future__ import annotations

import argparse
import json
import re
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
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(STEPS):
            step()
        torch.cuda.synchronize()
    times, counts = defaultdict(float), defaultdict(int)
    events = prof.events()
    for event in events:
        if event.device_type == DeviceType.CUDA:
            times[event.name] += event.device_time / 1e3 / STEPS  # ms per step
            counts[event.name] += 1
    by_time = sorted(times, key=times.get, reverse=True)
    return {"wall_ms": wall * 1e3, "busy_ms": sum(times.values()),
            "kernels": sum(counts.values()) / STEPS,
            "top": [(name[:140], counts[name] / STEPS, times[name]) for name in by_time[:40]],
            "every": [(name[:140], counts[name] / STEPS, times[name]) for name in by_time],
            "origins": origins(events)}


def origins(events) -> list[tuple[str, str, float]]:
    """(outermost CPU event, the op that launched, kernels a step) of the kernels the host
    launched, most first: torch.profiler links each kernel to the CPU event that launched it
    (`FunctionEvent.kernels`), whose parents say which part of the step it belongs to."""
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for event in events:
        if event.device_type != DeviceType.CPU or not event.kernels:
            continue
        top = event
        while top.cpu_parent is not None:
            top = top.cpu_parent
        counts[(_short(top.name), _short(event.name))] += len(event.kernels)
    return [(top, op, n / STEPS) for (top, op), n in
            sorted(counts.items(), key=lambda item: item[1], reverse=True)]


def _short(name: str) -> str:
    """An event's name without the hashes and counters that differ between runs."""
    return re.sub(r"[0-9a-f]{12,}|#\d+", "", name)[:100]


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
        print("  kernels a step by where the host launched them:")
        for top, op, count in r["origins"][:25]:
            print(f"  {count:7.1f}  {top[:60]}  >  {op[:60]}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu-sides-profile.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
