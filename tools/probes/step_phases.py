"""Where a training step's time goes on every rank, phase by phase, next to the planner's
price of the step's own small calls.

    python -m tools.probes.step_phases [--model NAME] [--steps N] [LAYOUT]
                                          (default: paraxis demo's model and layout)

Trains `--model` (default tiny, `paraxis demo`'s, with its batch of 16 x 128 tokens, fp32)
on real gloo ranks and times each step's phases as the training loop makes them
(paraxis/train/loop.py): the pipeline's schedule (`executor.run`; the whole forward and backward
without PP), the gradient sync after it (`finish_grad_sync`: a tied embedding's gradient
and the data-parallel buckets), the loss's broadcast and mean, the gradient norm for
clipping, the optimizer step, and the stop flag. Medians over the steps after the first
five, per rank, in milliseconds. The last phases but the optimizer are the calls
plan/step_calls.py prices; the table's last line is that price on a quick calibration of
this machine (`paraxis.train.calibrate.quick`, about 15 s), with its one-element calls and sync
waits.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

from paraxis.dist.testing import run_on_ranks
from paraxis.spec.layout import Layout

GLOBAL_BATCH, SEQ_LEN, WARMUP = 16, 128, 5
DEMO_LAYOUT = "dp=2,tp=2,pp=2,zero=1,microbatches=2,schedule=1f1b"
PHASES = ("step", "pipeline", "grad_sync", "loss", "norm", "optimizer", "stop_flag")


def phases_body(ctx, model: str, steps: int) -> dict[str, float]:
    """On every rank: train `steps` steps as the loop does, timing each phase."""
    import torch

    from paraxis.dist.preemption import StopRequest
    from paraxis.files.model_file import load_model_config
    from paraxis.parallelize import materialize, parallelize

    torch.set_num_threads(1)
    cfg = load_model_config(model)
    layout, groups = ctx.layout, ctx.groups
    engine = parallelize(cfg, layout, groups, "cpu")
    materialize(engine, cfg, 0)
    generator = torch.Generator().manual_seed(0)
    x, y = (torch.randint(0, cfg.vocab_size, (GLOBAL_BATCH, SEQ_LEN), generator=generator)
            for _ in range(2))
    share = GLOBAL_BATCH // layout.dp
    rows = slice(groups.dp_rank * share, (groups.dp_rank + 1) * share)
    marks: dict[str, float] = {}

    def timed(name: str, fn):
        def wrapper(*args, **kwargs):
            marks[name] = time.perf_counter()
            out = fn(*args, **kwargs)
            marks[name + "_end"] = time.perf_counter()
            return out
        return wrapper

    if getattr(engine, "executor", None) is not None:
        engine.executor.run = timed("pipeline", engine.executor.run)
    engine.finish_grad_sync = timed("grad_sync", engine.finish_grad_sync)
    records = []
    with StopRequest() as stop:
        for _ in range(steps):
            started = time.perf_counter()
            engine.forward_backward(x[rows], y[rows])
            backward_done = time.perf_counter()
            engine.clip_grad_norm(1.0)
            norm_done = time.perf_counter()
            engine.optimizer_step(1e-3)
            engine.zero_grad()
            optimizer_done = time.perf_counter()
            stop.agreed(torch.device("cpu"))
            done = time.perf_counter()
            pipeline = (marks["pipeline_end"] - marks["pipeline"]) if "pipeline" in marks \
                else marks["grad_sync"] - started
            records.append({
                "step": done - started, "pipeline": pipeline,
                "grad_sync": marks["grad_sync_end"] - marks["grad_sync"],
                "loss": backward_done - marks["grad_sync_end"],
                "norm": norm_done - backward_done, "optimizer": optimizer_done - norm_done,
                "stop_flag": done - optimizer_done})
    kept = records[WARMUP:]
    return {phase: statistics.median(r[phase] for r in kept) for phase in PHASES}


def priced(model: str, layout: Layout) -> tuple[float, int]:
    """(seconds, calls) the planner prices for the step's own calls, on a quick calibration
    of this machine."""
    from paraxis.files.model_file import load_model_config
    from paraxis.plan.inputs import PlanInputs
    from paraxis.plan.step_calls import step_calls, step_calls_time
    from paraxis.train.calibrate.quick import profile_for_cpu_run

    with tempfile.TemporaryDirectory() as folder:
        found = profile_for_cpu_run(layout.world_size, folder, model, SEQ_LEN)
        cluster = PlanInputs(model=model, gpus=layout.world_size,
                             hardware=str(found.path)).cluster()
        cfg = load_model_config(model)
        return step_calls_time(cfg, layout, cluster), len(step_calls(cfg, layout, cluster))


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.probes.step_phases")
    parser.add_argument("layout", nargs="?", default=DEMO_LAYOUT)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args(argv)
    layout = Layout.parse(args.layout)
    by_rank = run_on_ranks(layout, phases_body, args.model, args.steps, timeout_s=600)
    print(f"{args.model} {layout}: medians of {args.steps - WARMUP} steps, ms")
    print("rank " + " ".join(f"{phase:>10}" for phase in PHASES))
    for rank, phases in enumerate(by_rank):
        print(f"{rank:4d} " + " ".join(f"{phases[p] * 1e3:10.1f}" for p in PHASES))
    seconds, calls = priced(args.model, layout)
    print(f"priced: the step's own {calls} calls (plan/step_calls.py) {seconds * 1e3:.1f} ms; "
          "measured, rank 0: loss + norm + stop flag "
          f"{sum(by_rank[0][p] for p in ('loss', 'norm', 'stop_flag')) * 1e3:.1f} ms "
          "(a tied embedding's call is inside grad_sync)")


if __name__ == "__main__":
    main(sys.argv[1:])
