"""The host's share of a training step, phase by phase: paraxis's one-device engine beside
bench/reference.py's compiled loop, on a GPT-2 124M (or the Llama 3 8B slice) cut to a tiny
width.

    python -m tools.probes.host_phases [--precision bf16|fp32] [--steps N]
        [--model gpt2-124m|llama3-8b/8] [--layers L]

A GPU step goes host-bound when the host takes longer to queue the kernels than the GPU
takes to run them (GPT-2 124M at 8 x 1024 on a lent H100: docs/gpu/README.md). Its cost is
the Python and dispatch of each step, which does not depend on the model's width: at width
16, 8 tokens and one thread, a CPU step is mostly that cost. Both sides are compiled whole
and keep GPT-2's 12 blocks and their parameters (paraxis 196, the reference 148: paraxis
keeps q, k and v apart and stacks them in the graph); the reference runs under bf16
autocast with fp32 parameters as on a GPU, paraxis with `--precision`'s parameters (bf16:
fp32 masters, the GPU default). Medians over `--steps` steps after 10, in milliseconds:
forward and backward; the gradient norm and clipping; the optimizer step; zero_grad.
`--layers` keeps the model's first L blocks: two depths' difference is what a block adds.
`--profile N` then prints, for each side, torch.profiler's N ops of most self CPU time over
20 forward+backward passes (the guard check before the compiled graph is `TorchDynamo Cache
Lookup`); `TORCH_LOGS=guards` before the command prints each side's guards, and `--guards`
times their check: microseconds a forward, the check alone, repeated on the step's inputs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from bench import gpu
from bench.common import token_batch
from bench.reference import Reference, reference_adamw
from paraxis.dist.groups import build_groups
from paraxis.parallelize import build_engine
from paraxis.spec.layout import Layout
from paraxis.spec.runtime_options import RuntimeOptions

PHASES = ("forward+backward", "norm+clip", "optimizer", "zero_grad")
WARMUP = 10


def paraxis_phases(cfg, x: torch.Tensor, y: torch.Tensor, precision: str
                   ) -> list[Callable[[], None]]:
    engine = build_engine(cfg, Layout(), build_groups(Layout()), torch.device("cpu"), seed=0,
                          options=RuntimeOptions(precision=precision, compile=True))
    state = {}

    def forward_backward() -> None:
        state["loss"] = engine.forward_backward_on_device(x, y)

    def clip() -> None:  # as `train_step` makes it, with its finite check
        norm = engine.clip_grad_norm_on_device(1.0)
        engine._nonfinite = ~(torch.isfinite(state["loss"]) & torch.isfinite(norm))

    def step() -> None:
        engine.optimizer_step(1e-3)
        engine._nonfinite = None

    forward_backward.guarded = (engine.model, {"self": engine.model, "x": x, "targets": y,
                                               "tokens": None}, precision != "fp32")
    return [forward_backward, clip, step, engine.zero_grad]


def reference_phases(cfg, x: torch.Tensor, y: torch.Tensor) -> list[Callable[[], None]]:
    model = Reference(cfg)
    optimizer = reference_adamw(model)
    forward = torch.compile(model)

    def forward_backward() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = forward(x, y)
        loss.backward()

    def clip() -> None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)

    forward_backward.guarded = (model, {"self": model, "idx": x, "targets": y}, True)
    return [forward_backward, clip, optimizer.step, optimizer.zero_grad]


def guard_microseconds(forward_backward: Callable[[], None], calls: int = 2000) -> float:
    """Microseconds the guard check of the model's compiled forward takes, alone: the
    check torch.compile runs before each call of the graph (under bf16 autocast where the
    forward runs under it), on the step's own inputs."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    model, frame_locals, autocast = forward_backward.guarded
    (entry,) = _debug_get_cache_entry_list(type(model).forward.__code__)
    check = entry.guard_manager.check
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        if not check(frame_locals):
            raise RuntimeError(f"{type(model).__name__}'s guards fail on the step's inputs")
        started = time.perf_counter()
        for _ in range(calls):
            check(frame_locals)
    return (time.perf_counter() - started) / calls * 1e6


def timed(phases: list[Callable[[], None]], steps: int) -> list[float]:
    times: list[list[float]] = [[] for _ in phases]
    for index in range(WARMUP + steps):
        for phase, kept in zip(phases, times, strict=True):
            started = time.perf_counter()
            phase()
            if index >= WARMUP:
                kept.append((time.perf_counter() - started) * 1e3)
    return [statistics.median(kept) for kept in times]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--model", choices=("gpt2-124m", "llama3-8b/8"), default="gpt2-124m")
    parser.add_argument("--layers", type=int, default=0, help="blocks kept (0: all)")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="print the N ops of most self CPU time in forward+backward")
    parser.add_argument("--guards", action="store_true",
                        help="time each side's guard check before its compiled forward")
    args = parser.parse_args()
    if args.steps < 1:
        parser.error(f"--steps {args.steps}: give at least 1")
    full = gpu.model(args.model)
    if not 0 <= args.layers <= full.n_layers:
        parser.error(f"--layers {args.layers}: give 1 to {full.n_layers} (0: all)")
    torch.set_num_threads(1)
    cfg = full.replace(d_model=16, n_heads=2,
                       n_kv_heads=max(1, 2 * full.n_kv_heads // full.n_heads), d_ff=32,
                       vocab_size=64, max_seq_len=16, n_layers=args.layers or full.n_layers)
    x, y = token_batch(cfg.vocab_size, 1, 8, torch.device("cpu"))
    rows = {f"paraxis --compile ({args.precision})": paraxis_phases(cfg, x, y, args.precision),
            "reference (bf16 autocast)": reference_phases(cfg, x, y)}
    print(f"| side | {' | '.join(PHASES)} | step |\n|---|{'---|' * (len(PHASES) + 1)}")
    for side, phases in rows.items():
        medians = timed(phases, args.steps)
        print(f"| {side} | " + " | ".join(f"{m:.2f}" for m in medians)
              + f" | {sum(medians):.2f} |", flush=True)
    for side, phases in rows.items() if args.guards else ():
        print(f"{side}: guard check {guard_microseconds(phases[0]):.1f} us a forward")
    for side, phases in rows.items() if args.profile else ():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(20):
                phases[0]()
        print(f"\n{side}, forward+backward, 20 passes:\n" + prof.key_averages().table(
            sort_by="self_cpu_time_total", row_limit=args.profile), flush=True)


if __name__ == "__main__":
    main()
