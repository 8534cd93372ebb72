"""One GPU: paraxis's single-device step in bf16, its MFU, and the planner's forecast of it.

The step is the one `paraxis train` runs on one device (the engine `build_engine` makes:
forward, backward, clip, AdamW), under bf16 autocast; attention goes through
`scaled_dot_product_attention`, which on a CUDA GPU with bf16 inputs picks the flash kernel.
MFU is `plan.compute.mfu` (the planner's FLOP formula, the one the runtime logs) over the
device's peak, found from its name (`paraxis.train.metrics.device_peak_flops`).

Beside each measured step stands `plan.cost.evaluate` for the same run: the GPU's preset
with `kernels="eager"` (paraxis's elementwise ops run unfused), one device, the bf16 policy.
The runs were listed here before any of them ran on a GPU (validation that counts is
on data the model was not fitted to); nothing in the planner is fitted to them.

On a machine without CUDA the full-size part is not run (a CPU tells nothing about a GPU);
`--quick` still runs the same code on the CPU at a tiny size, so it cannot rot.
"""

from __future__ import annotations

import torch

from bench.common import engine_step, measure_steps, token_batch
from paraxis.dist.groups import build_groups
from paraxis.parallelize import build_engine
from paraxis.plan.compute import mfu
from paraxis.plan.cost import evaluate
from paraxis.plan.hardware import build_cluster, gpu_for_device_name
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import PRESETS
from paraxis.spec.precision import MIXED_ADAM
from paraxis.train.metrics import device_peak_flops

# (model, sequences, tokens each): GPT-2 sizes from 124M to 1.5B, and one Llama-style
# 8-layer slice of Llama 3 8B (GQA, SwiGLU, a 128K vocabulary) at 4K tokens.
FULL = {"runs": [("gpt2-124m", 8, 1024), ("gpt2-124m", 16, 1024), ("gpt2-350m", 8, 1024),
                 ("gpt2-774m", 8, 1024), ("gpt2-1.5b", 4, 1024), ("llama3-8b/8", 2, 4096)],
        "steps": 20, "warmup": 5}
QUICK = {"runs": [("tiny", 2, 64)], "steps": 2, "warmup": 1}


def model(name: str):
    """A preset, or "preset/L": the preset cut to its first L layers."""
    base, _, layers = name.partition("/")
    cfg = PRESETS[base]
    return cfg.replace(name=name, n_layers=int(layers)) if layers else cfg


def run(quick: bool) -> dict:
    if not torch.cuda.is_available():
        if not quick:
            return {"skipped": "no CUDA device on this machine (torch.cuda.is_available() is "
                               "False); run `python -m bench --only gpu` on a GPU machine"}
        return measure_all(torch.device("cpu"), QUICK)
    return measure_all(torch.device("cuda", torch.cuda.current_device()),
                       QUICK if quick else FULL)


def measure_all(device: torch.device, setting: dict) -> dict:
    cuda = device.type == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    preset = gpu_for_device_name(name) if cuda else None
    runs = []
    for model_name, batch, seq in setting["runs"]:
        runs.append(measure(device, model_name, batch, seq, setting, preset))
        if cuda:
            torch.cuda.empty_cache()
    return {"device": name, "preset": preset.name if preset else None,
            "precision": "bf16 autocast, fp32 master weights and AdamW",
            "peak_flops": device_peak_flops(device), "steps": setting["steps"],
            "torch": torch.__version__, "cuda": torch.version.cuda if cuda else None,
            "flash_sdp_enabled": torch.backends.cuda.flash_sdp_enabled() if cuda else False,
            "runs": runs}


def measure(device: torch.device, model_name: str, batch: int, seq: int, setting: dict,
            preset) -> dict:
    cfg = model(model_name)
    layout = Layout()
    engine = build_engine(cfg, layout, build_groups(layout), device, seed=0, precision="bf16")
    x, y = token_batch(cfg.vocab_size, batch, seq, device)
    step = engine_step(engine, x, y, clip=1.0)
    measured = measure_steps(step, setting["steps"], setting["warmup"], device)
    del engine, step, x, y
    step_time = measured["step_time_s"]
    tokens_per_s = batch * seq / step_time
    peak = device_peak_flops(device)
    row = {"model": cfg.name, "params": cfg.num_params(), "batch": batch, "seq": seq,
           "step_time_s": step_time, "tokens_per_s": tokens_per_s,
           "mfu": mfu(cfg, seq, tokens_per_s, 1, peak) if peak else None,
           "peak_memory_bytes": measured["peak_memory_bytes"] if device.type == "cuda" else None,
           "planner_step_time_s": None, "planner_memory_bytes": None}
    if preset is not None:
        cluster = build_cluster(preset.name, 1, 1, {"kernels": "eager"})
        estimate = evaluate(cfg, layout, cluster, seq, batch, MIXED_ADAM)
        row["planner_step_time_s"] = estimate.step_time_s
        row["planner_memory_bytes"] = estimate.memory["total"]
    return row


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value / 2**30:,.1f} GiB"


def _error(measured: float, planned: float | None) -> str:
    return "-" if planned is None else f"{planned / measured - 1:+.0%}"


def render(section: dict) -> str:
    head = "## One GPU: bf16 training steps, their MFU and the planner's forecast\n\n"
    if "skipped" in section:
        return head + f"Not run: {section['skipped']}.\n"
    peak = section["peak_flops"]
    lines = [
        head + "paraxis's one-device engine (`build_engine`: forward, backward, clip, AdamW) under "
        "bf16 autocast on " + section["device"] + "; MFU is the planner's model FLOPs "
        "(`plan.compute.mfu`) over the device's peak dense bf16 FLOP/s"
        + (f" ({peak / 1e12:,.0f} TFLOP/s)" if peak else "") + ". The FLOPs count half of "
        "the causal attention square (Megatron-LM's convention since 2025, see "
        "docs/planner.md). Planner: `plan.cost.evaluate` on the "
        f"{section['preset'] or '(none)'} preset with eager kernels; error = planner / "
        "measured - 1. The runs were listed before any ran on a GPU; nothing is fitted to "
        "them.", "",
        "| model | batch x seq | step | tokens/s | MFU | planner step | error | peak memory "
        "| planner memory |", "|---|---|---|---|---|---|---|---|---|"]
    for r in section["runs"]:
        planned = r["planner_step_time_s"]
        lines.append(
            f"| {r['model']} ({r['params'] / 1e6:,.0f}M) | {r['batch']} x {r['seq']} "
            f"| {r['step_time_s'] * 1e3:,.1f} ms | {r['tokens_per_s']:,.0f} | "
            + ("-" if r["mfu"] is None else f"{r['mfu']:.1%}")
            + " | " + ("-" if planned is None else f"{planned * 1e3:,.1f} ms")
            + f" | {_error(r['step_time_s'], planned)} | {_gib(r['peak_memory_bytes'])} "
            f"| {_gib(r['planner_memory_bytes'])} |")
    lines += ["", f"torch {section['torch']}, CUDA {section['cuda']}, flash SDP enabled: "
              f"{section['flash_sdp_enabled']}; median of {section['steps']} steps after "
              "warm-up."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import argparse
    import json
    from pathlib import Path

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, any device")
    parser.add_argument("--out", type=Path, help="write gpu-step.md and .json here")
    args = parser.parse_args()
    result = run(args.quick)
    print(render(result), end="")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu-step.md").write_text(render(result))
        (args.out / "gpu-step.json").write_text(json.dumps(result, indent=1) + "\n")
