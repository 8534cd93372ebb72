"""Where a TP rank's step goes on CPU ranks, next to a DP rank doing the same FLOPs.

    python -m tools.probes.cpu_tp_probe [--skip-all-reduce | --per-call] [--model NAME] [LAYOUT ...]
                                                  (default: dp=2 and dp=1,tp=2)

The predicted-vs-measured table (docs/benchmarks.md) under-forecasts the TP layouts the most.
For each layout this trains bench.predicted_vs_measured's model on real gloo ranks, times
steps, and reports per rank: the step's wall time, the CPU time of the process and of its
main thread (the rest is gloo's helper threads), and from torch.profiler the time inside
`aten::mm` with the GEMM rate it implies (FLOPs from the profiled input shapes). dp=2 and
tp=2 each compute half of the global batch's FLOPs per rank, so their `aten::mm` times
should match if a GEMM ran at one rate whatever the layout.

--skip-all-reduce makes every all-reduce a no-op on the ranks (the numbers trained are then wrong;
only the times mean something): what a TP rank's step costs without its collectives, against the
same step with them. --per-call runs each layout both ways and divides the difference by the
all-reduces a rank makes per step: what one call costs in a step (the figure the planner prices as
the call's idle time plus its sync wait, plan/sync_wait.py). Without its all-reduces nothing holds a
pipeline's ranks together but its sends, so their own step times spread (86-132 ms over the 8 ranks
of the demo's layout here) and the slowest rank's, which the figure takes, reads the no-call step
long: trust it for layouts without PP. --model NAME probes a preset instead of the bench's model
(`--model tiny`: `paraxis demo`'s model and batch).
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable

from paraxis.dist.testing import run_distributed
from paraxis.spec.layout import Layout

GLOBAL_BATCH, SEQ_LEN, STEPS = 16, 128, 5


def model_step(text: str, model: str = "") -> Callable[[], None]:
    """One training step of the bench's model (or preset `model`) on this rank of `text`'s
    layout, the global batch of bench.predicted_vs_measured split over its DP ranks; call on
    every rank."""
    import torch

    from bench.common import engine_step
    from bench.predicted_vs_measured import MODEL
    from paraxis.dist.groups import build_groups
    from paraxis.parallelize import build_engine
    from paraxis.spec.model_config import PRESETS

    cfg = PRESETS[model] if model else MODEL
    layout = Layout.parse(text)
    layout = layout.validate(layout.world_size, cfg, GLOBAL_BATCH, SEQ_LEN)
    groups = build_groups(layout)
    engine = build_engine(cfg, layout, groups, "cpu", seed=0, seq_len=SEQ_LEN)
    tokens = torch.randint(0, cfg.vocab_size, (GLOBAL_BATCH, SEQ_LEN + 1),
                           generator=torch.Generator().manual_seed(0))
    per_dp = GLOBAL_BATCH // layout.dp
    rows = slice(groups.dp_rank * per_dp, (groups.dp_rank + 1) * per_dp)
    return engine_step(engine, tokens[rows, :-1].contiguous(), tokens[rows, 1:].contiguous(),
                       clip=1.0)


def probe_body(text: str, skip_all_reduce: bool = False, model: str = "") -> dict:
    """On every rank: time steps (counting the all-reduces), then profile one."""
    import time

    import torch.distributed as dist

    from paraxis.engine.data_parallel.flat import _Done

    calls, real_all_reduce = [0], dist.all_reduce

    def counted(*args: object, async_op: bool = False, **kwargs: object) -> object:
        calls[0] += 1
        if skip_all_reduce:  # timing only: the sums are wrong
            return _Done() if async_op else None
        return real_all_reduce(*args, async_op=async_op, **kwargs)

    dist.all_reduce = counted
    from torch.profiler import ProfilerActivity, profile

    step = model_step(text, model)
    for _ in range(2):
        step()
    timings, calls[0] = [], 0
    for _ in range(STEPS):
        wall, process, thread = time.perf_counter(), time.process_time(), time.thread_time()
        step()
        timings.append((time.perf_counter() - wall, time.process_time() - process,
                        time.thread_time() - thread))
    per_step = calls[0] / STEPS
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        step()
    mm_s = flops = 0.0
    for event in prof.key_averages(group_by_input_shape=True):
        if event.key == "aten::mm":
            (m, k), (_, n) = event.input_shapes[0], event.input_shapes[1]
            mm_s += event.self_cpu_time_total / 1e6
            flops += 2.0 * m * k * n * event.count
    wall, process, thread = (statistics.median(t[i] for t in timings) for i in range(3))
    return {"wall_s": wall, "all_reduces": per_step, "process_cpu_s": process,
            "main_thread_cpu_s": thread, "mm_s": mm_s, "mm_flops_per_s": flops / mm_s}


def main(argv: list[str]) -> int:
    per_call = "--per-call" in argv
    modes = [False, True] if per_call else ["--skip-all-reduce" in argv]
    model = argv[argv.index("--model") + 1] if "--model" in argv else ""
    texts = [a for i, a in enumerate(argv) if not a.startswith("--")
             and (i == 0 or argv[i - 1] != "--model")]
    for text in texts or ["dp=2", "dp=1,tp=2"]:
        layout = Layout.parse(text)
        steps = {}
        for skip in modes:
            label = f"{text} (no all-reduce)" if skip else text
            ranks = run_distributed(probe_body, layout.world_size, (text, skip, model),
                                    timeout_s=600)
            steps[skip] = (max(r["wall_s"] for r in ranks),
                           max(r["all_reduces"] for r in ranks))
            for rank, r in enumerate(ranks):
                print(f"{label:12s} rank {rank}: step {r['wall_s']:.3f} s, "
                      f"{r['all_reduces']:.0f} all-reduces, CPU {r['process_cpu_s']:.3f} s "
                      f"(main thread {r['main_thread_cpu_s']:.3f}, other threads "
                      f"{r['process_cpu_s'] - r['main_thread_cpu_s']:.3f}), aten::mm "
                      f"{r['mm_s']:.3f} s at {r['mm_flops_per_s'] / 1e9:.1f} GFLOP/s",
                      flush=True)
        if per_call:
            (with_calls, calls), (without, _) = steps[False], steps[True]
            print(f"{text}: the slowest rank steps in {with_calls * 1e3:.1f} ms with its "
                  f"{calls:.0f} all-reduces, {without * 1e3:.1f} ms without: "
                  f"{(with_calls - without) / calls * 1e3:.2f} ms a call", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
