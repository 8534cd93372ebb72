"""Where one GPU's bf16 step spends its time and memory, for each run of `bench.gpu`.

    python -m tools.probes.gpu_profile [--out DIR]  # on a CUDA machine; writes DIR/gpu-profile.json

For each run: the median wall time of 10 steps; a `torch.profiler` trace of three more,
its CUDA kernels summed by class (GEMM, attention, the loss's softmax, the optimizer's
foreach kernels, reductions, everything else); the kernels launched per step; and memory by
phase: the model states once the engine is built, and the peak inside one
`forward_backward`. GPU busy below wall time is time the GPU waited for the host to launch
its next kernel. docs/gpu/README.md reads these figures against the planner.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from bench import gpu
from bench.common import engine_step, measure_steps, token_batch
from paraxis.dist.groups import build_groups
from paraxis.parallelize import build_engine
from paraxis.spec.layout import Layout
from paraxis.spec.runtime_options import RuntimeOptions

GEMM_MARKERS = ("gemm", "cutlass", "xmma", "nvjet", "cublas", "sm90", "sm80", "splitk")


def kernel_class(name: str) -> str:
    n = name.lower()
    if any(marker in n for marker in ("flash", "fmha", "attention", "sdpa", "cudnn::fusion")):
        return "attention"  # cuDNN's fused attention and its backward's helper kernels
    if any(marker in n for marker in GEMM_MARKERS):
        return "gemm"
    if "multi_tensor" in n or "foreach" in n:
        return "optimizer"
    if "softmax" in n or "nll" in n or "cross_entropy" in n:
        return "loss"
    if "reduce" in n:
        return "reduce"
    return "other"


def kernel_seconds(step, steps: int = 3) -> tuple[dict[str, float], dict[str, float], float]:
    """Seconds per step by kernel class and by kernel name (top 12), and kernels per step."""
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text())["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    by_class: dict[str, float] = {}
    by_name: dict[str, float] = {}
    for event in kernels:
        seconds, kind = event["dur"] / 1e6 / steps, kernel_class(event["name"])
        by_class[kind] = by_class.get(kind, 0) + seconds
        by_name[event["name"][:90]] = by_name.get(event["name"][:90], 0) + seconds
    top = dict(sorted(by_name.items(), key=lambda kv: -kv[1])[:12])
    return by_class, top, len(kernels) / steps


def profile_run(device: torch.device, model_name: str, batch: int, seq: int) -> dict:
    cfg = gpu.model(model_name)
    torch.cuda.empty_cache()
    base = torch.cuda.memory_allocated(device)
    engine = build_engine(cfg, Layout(), build_groups(Layout()), device, seed=0,
                          options=RuntimeOptions(precision="bf16"))
    states = torch.cuda.memory_allocated(device) - base
    x, y = token_batch(cfg.vocab_size, batch, seq, device)
    step = engine_step(engine, x, y, clip=1.0)
    for _ in range(4):
        step()
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    engine.forward_backward(x, y)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    engine.zero_grad()
    wall = measure_steps(step, 10, warmup=0, device=device)["step_time_s"]
    by_class, top, count = kernel_seconds(step)
    return {"model": model_name, "batch": batch, "seq": seq, "wall_s": wall,
            "gpu_busy_s": sum(by_class.values()),
            "kernels_per_step": count, "by_kind_s": by_class, "states_bytes": states,
            "forward_backward_peak_bytes": peak, "top_kernels_s": top}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write gpu-profile.json here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("tools.probes.gpu_profile needs a CUDA GPU (torch.cuda.is_available() is "
                         "False); run it on a GPU machine")
    device = torch.device("cuda", torch.cuda.current_device())
    torch.backends.cuda.matmul.allow_tf32 = True
    result = {}
    for model_name, batch, seq in gpu.FULL["runs"]:
        row = profile_run(device, model_name, batch, seq)
        result[f"{model_name} {batch}x{seq}"] = row
        print(json.dumps({k: v for k, v in row.items() if k != "top_kernels_s"}), flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu-profile.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
