"""One GPU: paraxis's single-device step on a GPT-2 124M in bf16, and its MFU.

The step is the one `paraxis train` runs on one device (the engine `build_engine` makes:
forward, backward, clip, AdamW), under bf16 autocast; attention goes through
`scaled_dot_product_attention`, which on a CUDA GPU with bf16 inputs picks the flash kernel.
MFU is `plan.compute.mfu` (the planner's FLOP formula, the one the runtime logs) over the
device's peak, found from its name (`paraxis.metrics.device_peak_flops`).

On a machine without CUDA the full-size part is not run (a CPU tells nothing about a GPU);
`--quick` still runs the same code on the CPU at a tiny size, so it cannot rot.
"""

from __future__ import annotations

import torch

from bench.common import engine_step, measure_steps, token_batch
from paraxis.layout import Layout
from paraxis.metrics import device_peak_flops
from paraxis.model_config import PRESETS
from paraxis.plan.compute import mfu
from paraxis.runtime.distributed import build_groups
from paraxis.runtime.parallelize import build_engine

FULL = {"model": "gpt2-124m", "batch": 8, "seq": 1024, "steps": 20, "warmup": 5}
QUICK = {"model": "tiny", "batch": 2, "seq": 64, "steps": 2, "warmup": 1}


def run(quick: bool) -> dict:
    if not torch.cuda.is_available():
        if not quick:
            return {"skipped": "no CUDA device on this machine (torch.cuda.is_available() is "
                               "False); run `python -m bench --only gpu` on a GPU machine"}
        return measure(torch.device("cpu"), QUICK)
    return measure(torch.device("cuda", torch.cuda.current_device()), QUICK if quick else FULL)


def measure(device: torch.device, setting: dict) -> dict:
    cfg = PRESETS[setting["model"]]
    batch, seq = setting["batch"], setting["seq"]
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    layout = Layout()
    engine = build_engine(cfg, layout, build_groups(layout), device, seed=0, precision="bf16")
    x, y = token_batch(cfg.vocab_size, batch, seq, device)
    step = engine_step(engine, x, y, clip=1.0)
    measured = measure_steps(step, setting["steps"], setting["warmup"], device)
    step_time = measured["step_time_s"]
    tokens_per_s = batch * seq / step_time
    peak = device_peak_flops(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {"device": name, "model": cfg.name, "params": cfg.num_params(),
            "precision": "bf16 autocast, fp32 master weights and AdamW",
            "batch": batch, "seq": seq, "steps": setting["steps"], "step_time_s": step_time,
            "tokens_per_s": tokens_per_s, "peak_flops": peak,
            "mfu": mfu(cfg, seq, tokens_per_s, 1, peak) if peak else None,
            "flash_sdp_enabled": (torch.backends.cuda.flash_sdp_enabled()
                                  if device.type == "cuda" else False),
            "peak_memory_bytes": (measured["peak_memory_bytes"] if device.type == "cuda"
                                  else None),
            "torch": torch.__version__,
            "cuda": torch.version.cuda if device.type == "cuda" else None}


def render(section: dict) -> str:
    head = "## One GPU: a bf16 training step and its MFU\n\n"
    if "skipped" in section:
        return head + f"Not run: {section['skipped']}.\n"
    mfu_text = f"{section['mfu']:.1%}" if section["mfu"] is not None else "- (no peak known)"
    memory = section["peak_memory_bytes"]
    return head + (
        "paraxis's one-device engine (`build_engine`: forward, backward, clip, AdamW) under bf16 "
        "autocast; MFU is "
        "the planner's model FLOPs (`plan.compute.mfu`) over the device's peak dense bf16 "
        "FLOP/s. The FLOPs count half of the causal attention square (Megatron-LM's "
        "convention since 2025, see docs/planner.md).\n\n"
        "| device | model | batch x seq | step time | tokens/s | peak | MFU | peak memory |\n"
        "|---|---|---|---|---|---|---|---|\n"
        f"| {section['device']} | {section['model']} ({section['params'] / 1e6:,.0f}M) | "
        f"{section['batch']} x {section['seq']} | {section['step_time_s'] * 1e3:,.1f} ms | "
        f"{section['tokens_per_s']:,.0f} | "
        + (f"{section['peak_flops'] / 1e12:,.0f} TFLOP/s" if section["peak_flops"] else "-")
        + f" | {mfu_text} | "
        + (f"{memory / 2**30:,.1f} GiB" if memory else "-")
        + f" |\n\ntorch {section['torch']}, CUDA {section['cuda']}, flash SDP enabled: "
        f"{section['flash_sdp_enabled']}.\n")


if __name__ == "__main__":
    import json
    import sys

    result = run("--quick" in sys.argv)
    print(json.dumps(result, indent=2))
