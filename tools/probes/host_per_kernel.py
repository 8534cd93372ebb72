"""The host's seconds per kernel of a one-GPU step, eager and compiled: what the planner's
`GPU.kernel_launch_s` stands for, measured on a step too small for the GPU to matter.

    python -m tools.probes.host_per_kernel [--width 64 --seq 64 --batch 1]   # CUDA

`bench.gpu`'s GPT-2 124M and Llama 3 8B slice keep their layers and vocabulary-free shapes
but are cut to `--width` (heads and the MLP with it) and a small vocabulary, so that each
kernel runs in microseconds and the step's wall time is the host's: dispatch, autograd and
launches. For each of paraxis's sides (eager, `--compile`) and the compiled reference: the
median step, the kernels a step (torch.profiler's device events), their quotient, and the
GPU's busy time, which must stay well under the step for the quotient to be the host's.
The planner prices a pass at the longer of its GPU time and its kernels x kernel_launch_s
(`plan.cost.layer_times`, kernels per layer from `plan.compute.LAYER_KERNELS`); one
constant, `plan.hardware.HOST_SECONDS_PER_KERNEL`, serves eager and compiled steps.

Each model also runs at half its layers: the difference is what one block adds, kernels and
host time apart from the embedding, head, loss and optimizer, which is what LAYER_KERNELS
and the constant stand for (a whole step's quotient mixes the two).
"""

from __future__ import annotations

import argparse

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from bench import gpu
from bench.common import measure_steps, token_batch
from paraxis.plan.compute import layer_kernels
from paraxis.spec.model_config import ModelConfig

SIDES = ("paraxis", "paraxis --compile", "reference")


def cut(cfg: ModelConfig, width: int, vocab: int) -> ModelConfig:
    """`cfg` with its layers kept and its width, heads (64 wide), kv heads (in the same
    ratio), MLP (in the same ratio to the width) and vocabulary cut."""
    heads = max(1, width // 64)
    return cfg.replace(d_model=width, n_heads=heads,
                       n_kv_heads=max(1, heads * cfg.n_kv_heads // cfg.n_heads),
                       d_ff=width * cfg.d_ff // cfg.d_model, vocab_size=vocab)


def busy_seconds(step, steps: int = 3) -> tuple[float, float]:
    """(GPU busy seconds, kernels) a step, over `steps` profiled steps."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    return sum(e.device_time for e in kernels) / 1e6 / steps, len(kernels) / steps


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--vocab", type=int, default=512)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU: the host's time per kernel is a GPU step's")
    device = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = True
    for name in ("gpt2-124m", "llama3-8b/8"):
        cfg = cut(gpu.model(name), args.width, args.vocab)
        x, y = token_batch(cfg.vocab_size, args.batch, args.seq, device)
        priced = {kind: layer_kernels(cfg, kind) * cfg.n_layers
                  for kind in ("eager", "compiled")}
        print(f"{name} cut to width {args.width}, vocabulary {args.vocab}, {args.batch} x "
              f"{args.seq} tokens; the planner counts {priced['eager']} (eager) and "
              f"{priced['compiled']} (compiled) kernels in its layers", flush=True)
        half = cfg.replace(n_layers=cfg.n_layers // 2)
        for side in SIDES:
            runs = [measured(side, c, x, y, device) for c in (cfg, half)]
            (wall, busy, kernels), (half_wall, _, half_kernels) = runs
            blocks = cfg.n_layers - half.n_layers
            block_kernels = (kernels - half_kernels) / blocks
            block_wall = (wall - half_wall) / blocks
            print(f"  {side}: {wall * 1e3:.2f} ms a step, {kernels:.0f} kernels, "
                  f"{wall / kernels * 1e6:.1f} us a kernel, GPU busy {busy * 1e3:.2f} ms "
                  f"({busy / wall:.0%}); a block: {block_kernels:.1f} kernels, "
                  f"{block_wall * 1e3:.3f} ms, {block_wall / block_kernels * 1e6:.1f} us a "
                  f"kernel; the rest: {kernels - cfg.n_layers * block_kernels:.0f} kernels",
                  flush=True)


def measured(side: str, cfg: ModelConfig, x: torch.Tensor, y: torch.Tensor,
             device: torch.device) -> tuple[float, float, float]:
    """(median step seconds, GPU busy seconds, kernels) a step of `side` on `cfg`."""
    torch._dynamo.reset()
    step = gpu.build_side(side, cfg, x, y, True, device)
    wall = measure_steps(step, steps=30, warmup=5, device=device)["step_time_s"]
    busy, kernels = busy_seconds(step)
    del step
    torch.cuda.empty_cache()
    return wall, busy, kernels


if __name__ == "__main__":
    main()
