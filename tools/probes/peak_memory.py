"""What is alive at the peak of a step's forward and backward, beyond the model states: paraxis's
compiled step in bf16 (fp32 masters) and under autocast-bf16, beside bench/reference.py's
compiled loop under bf16 autocast, allocation by allocation, grouped by where each was made.

    python -m tools.probes.peak_memory [--model llama3-8b/8 --batch 2 --seq 4096]   # CUDA
    python -m tools.probes.peak_memory --device cpu --width 512 --layers 2 --seq 512
    # (on a 2-core AMD EPYC VM it printed nothing in 10 minutes: three compiled sides and bf16
    # matmuls, which that CPU runs 70-270x slower than fp32; a many-core Intel host, or CUDA)

On CUDA, one forward and backward after three warm-up steps under
`torch.cuda.memory._record_memory_history` (every allocation and free of the caching
allocator, with its Python stack); on CPU, the same under `torch.profiler`'s memory events
(the allocating operator in place of a stack). Their allocations are summed in order from
what was allocated at the start; at the peak, the ones not yet freed are grouped by their
innermost frame in paraxis, bench or a compiled graph (CUDA) or by operator (CPU).
`--width`/`--layers` cut the model, as `saved_activations` does (on CPU the reference runs
under CPU autocast, which bench.gpu's CPU sides do not).
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import linecache
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from bench import gpu
from bench.common import token_batch
from bench.reference import Reference, training_phases
from paraxis.dist.groups import build_groups
from paraxis.parallelize import build_engine
from paraxis.spec.layout import Layout
from paraxis.spec.runtime_options import RuntimeOptions

SIDES = ("paraxis bf16", "paraxis autocast-bf16", "reference")
FUSED = " fused-loss"  # a paraxis side with this suffix fuses the LM head and loss
EAGER = " eager"  # and one with this suffix runs uncompiled
OWN = ("paraxis/", "bench/", "torchinductor")  # the frames a group is named by, innermost first


@dataclass
class Event:
    """One allocation (`size` > 0) or free (`size` < 0) of block `addr`, where `where` made it."""
    addr: int
    size: int
    where: str


def alive_at_peak(events: Iterable[Event]) -> tuple[int, int, dict[str, int]]:
    """(peak, end, bytes by `where`): the running sum of `events` from 0, its largest value,
    its last, and the allocations made during the step and not freed at that largest value."""
    running = peak = 0
    alive: dict[int, Event] = {}
    at_peak: dict[int, Event] = {}
    for event in events:
        running += event.size
        if event.size > 0:
            alive[event.addr] = event
        else:
            alive.pop(event.addr, None)
        if running > peak:
            peak, at_peak = running, dict(alive)
    groups: collections.Counter = collections.Counter()
    for event in at_peak.values():
        groups[event.where] += event.size
    return peak, running, dict(groups)


def _where(frames: list[dict]) -> str:
    for frame in frames:
        if any(part in frame["filename"] for part in OWN):
            name = frame["filename"].split("/")[-1]
            return f"{name}:{frame['line']} {frame['name']}{_generated(frame)}"
    return frames[0]["name"] if frames else "?"


def _generated(frame: dict) -> str:
    """In a compiled graph's generated code, the allocating line and the source nodes named
    in the comment after it (the buffer's shape and what made it): "" elsewhere."""
    if "torchinductor" not in frame["filename"]:
        return ""
    line = linecache.getline(frame["filename"], frame["line"]).strip()
    below = (linecache.getline(frame["filename"], frame["line"] + 1).strip()
             .removeprefix("# Topologically Sorted Source Nodes: "))
    return f" [{line}]" + (f" {below.split(', Original ATen')[0]}" if below.startswith("[")
                           else "")


def cuda_events(step: Callable[[], None]) -> list[Event]:
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(max_entries=2_000_000)
    step()
    torch.cuda.synchronize()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    trace = snapshot["device_traces"][torch.cuda.current_device()]
    events = []
    for entry in trace:
        if entry["action"] == "alloc":
            events.append(Event(entry["addr"], entry["size"], _where(entry.get("frames", []))))
        elif entry["action"] == "free_completed":
            events.append(Event(entry["addr"], -entry["size"], ""))
    return events


def cpu_events(step: Callable[[], None]) -> list[Event]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    with tempfile.NamedTemporaryFile(suffix=".json") as trace:
        prof.export_chrome_trace(trace.name)
        spans = json.load(open(trace.name))["traceEvents"]
    ops = sorted(((e["ts"], e["ts"] + e.get("dur", 0), e["name"]) for e in spans
                  if e.get("ph") == "X" and e.get("cat") == "cpu_op"), key=lambda op: op[0])
    events = []
    for e in sorted((e for e in spans if e.get("name") == "[memory]"), key=lambda e: e["ts"]):
        inner = [name for start, end, name in ops if start <= e["ts"] <= end]
        size = e["args"]["Bytes"]
        events.append(Event(e["args"]["Addr"], size, inner[-1] if inner else "?"))
    return events


def build(side: str, cfg, x: torch.Tensor, y: torch.Tensor, device: torch.device
          ) -> tuple[Callable[[], None], Callable[[], None]]:
    """(forward and backward, the rest of the step: clipping, AdamW, zero_grad) of `side`, as
    bench.gpu's sides run them."""
    if side == "reference":
        return training_phases(Reference(cfg).to(device), x, y, gpu.CLIP)
    precision = side.removeprefix("paraxis ").removesuffix(FUSED).removesuffix(EAGER)
    engine = build_engine(cfg, Layout(), build_groups(Layout()), device, seed=0,
                          options=RuntimeOptions(
                              precision=precision, compile=not side.endswith(EAGER),
                              fused_loss=side.endswith(FUSED)))

    def finish() -> None:
        engine.clip_grad_norm_on_device(gpu.CLIP)
        engine.optimizer_step(1e-3)
        engine.zero_grad()

    return lambda: engine.forward_backward_on_device(x, y), finish


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--model", default="llama3-8b/8")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--width", type=int, help="cut the model to this width (CPU)")
    parser.add_argument("--layers", type=int, help="and to this many layers")
    parser.add_argument("--top", type=int, default=12, help="groups printed per side")
    parser.add_argument("--sides", default=",".join(SIDES), help=f"of {', '.join(SIDES)}; "
                        f"a paraxis side ending in '{FUSED.strip()}' fuses its head and loss, "
                        f"one ending in '{EAGER.strip()}' runs uncompiled")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    cfg = gpu.model(args.model)
    if args.width:
        heads = max(2, args.width // 128)  # a GPT-2 block has no grouped-query attention
        cfg = cfg.replace(d_model=args.width, n_heads=heads,
                          n_kv_heads=heads if cfg.style == "gpt2" else max(1, args.width // 512),
                          d_ff=4 * args.width if cfg.style == "gpt2" else args.width * 7 // 2)
    if args.layers:
        cfg = cfg.replace(n_layers=args.layers)
    x, y = token_batch(cfg.vocab_size, args.batch, args.seq, device)
    for side in args.sides.split(","):
        torch._dynamo.reset()
        forward_backward, rest = build(side, cfg, x, y, device)
        for _ in range(3):
            forward_backward()
            rest()
        start = torch.cuda.memory_allocated() if device.type == "cuda" else 0
        record = cuda_events if device.type == "cuda" else cpu_events
        events = record(forward_backward)
        rest()
        peak, end, groups = alive_at_peak(events)
        print(f"\n{side}: {args.model} {args.batch} x {args.seq}"
              + (f", width {args.width}" if args.width else "")
              + f": allocated at the start {start / 2**30:.2f} GiB, peak {peak / 2**20:,.0f} "
              f"MiB over it, {end / 2**20:,.0f} MiB at the end; alive at the peak:", flush=True)
        for where, size in sorted(groups.items(), key=lambda item: -item[1])[:args.top]:
            print(f"  {size / 2**20:10,.1f} MiB  {where}")
        del forward_backward, rest
        torch._dynamo.reset()  # the compiled graphs hold the side's model
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
