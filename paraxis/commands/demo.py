"""`paraxis demo`: one model, one device and eight ranks, the same numbers, and a report.

1. Trains the tiny model on one device on the embedded corpus (this Python's own standard
   library, tokenised as bytes: nothing to download).
2. Trains the same model, seed and batches on a 3D layout, dp=2 x tp=2 x pp=2 (8 CPU ranks,
   ZeRO-1, 1F1B), launched like `paraxis train --nproc 8` (dist/launch.py).
3. Prints the two loss curves side by side, then writes the HTML report for the 3D run
   (plan, defence, pictures, measured next to its forecast on this machine) and its path.

The console output stays short: one line per run saying what it is, the training loop's own
few lines, the loss table, the report's path.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from paraxis.plan.inputs import PlanInputs
from paraxis.spec.layout import Layout

LAYOUT_3D = Layout(dp=2, tp=2, pp=2, zero=1, microbatches=2, schedule="1f1b")
GLOBAL_BATCH, SEQ_LEN = 16, 128


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=60, help="steps of each run")
    parser.add_argument("--model", default="tiny", help="a preset or model file to train")
    parser.add_argument("--layout", default=str(LAYOUT_3D),
                        help="the parallel layout to compare with one device")
    parser.add_argument("--out", default="runs/demo", help="folder for metrics and the report")


def report_inputs(model: str, layout: Layout) -> PlanInputs:
    """What the report of the demo's parallel run prices: its model, layout and batch, in
    fp32 (what `paraxis train` computes in on a CPU), on the hardware it ran on."""
    return PlanInputs(model=model, gpus=layout.world_size, layout=str(layout),
                      global_batch=GLOBAL_BATCH, seq_len=SEQ_LEN, precision="fp32")


def run(args: argparse.Namespace) -> int:
    from paraxis.files.host import check_writable_folder
    from paraxis.files.model_file import load_model_config
    from paraxis.train.config import RunConfig

    # bad input fails before anything is written, and before the imports below (seconds)
    check_writable_folder(args.out, "--out", "runs/demo")
    out = Path(args.out)
    layout = Layout.parse(args.layout)
    common = RunConfig.from_flags(model=args.model, steps=args.steps, global_batch=GLOBAL_BATCH,
                                  seq_len=SEQ_LEN, lr=3e-3, warmup=10, device="cpu",
                                  log_every=max(1, args.steps // 2))
    single_cfg = common.with_flags(layout=Layout(),
                                   metrics_file=str(out / "single" / "metrics.jsonl"))
    parallel_cfg = common.with_flags(layout=layout,
                                     metrics_file=str(out / "parallel" / "metrics.jsonl"))
    model_cfg = load_model_config(args.model)
    for cfg in (single_cfg, parallel_cfg):
        cfg.check()
        cfg.layout.validate(cfg.layout.world_size, model_cfg, GLOBAL_BATCH, SEQ_LEN)

    from rich.table import Table

    from paraxis.dist.launch import launch
    from paraxis.dist.rank_server import start_rank_server
    from paraxis.files.terminal import console as terminal_console
    from paraxis.show.lab.page import write_lab
    from paraxis.show.report.build import build_report, save
    from paraxis.train.calibrate.quick import PROFILE_NAME
    from paraxis.train.loop import RUN_IMPORTS, run_training
    from paraxis.train.run_hardware import choose_hardware

    console = terminal_console(highlight=False)
    if layout.world_size > 1:  # its ranks' server imports torch while one device trains
        start_rank_server(run_training, RUN_IMPORTS)
    what = f"{args.steps} steps of {GLOBAL_BATCH} x {SEQ_LEN} tokens"
    console.print(f"[bold]1/3[/]  {args.model} on one device, {what}; metrics in "
                  f"{out / 'single'}")
    single = run_training(single_cfg)
    console.print(f"[bold]2/3[/]  the same model, seed and batches on {layout.world_size} "
                  f"ranks, {layout}; metrics in {out / 'parallel'}")
    # The report forecasts this run on this machine; on a CPU that needs a profile of it,
    # measured now, next to the run, while the machine carries the same load.
    (out / "parallel" / PROFILE_NAME).unlink(missing_ok=True)
    hardware = choose_hardware(report_inputs(args.model, layout), out / "parallel",
                               layout.world_size, args.model)
    console.print(f"      the report's forecast is priced on {hardware.source}")
    if layout.world_size > 1:
        launch(run_training, (parallel_cfg,), layout.world_size, device="cpu")
    else:
        run_training(parallel_cfg)
    parallel = [json.loads(line) for line in
                Path(parallel_cfg.logging.metrics_file).read_text().splitlines()]

    console.print("[bold]3/3[/]  loss, step by step")
    label = f"dp={layout.dp} x tp={layout.tp} x pp={layout.pp}"
    table = Table("step", "one device", label, "difference")
    shown = sorted({*range(0, args.steps, max(1, args.steps // 10)), args.steps - 1})
    worst = max(abs(a["loss"] - b["loss"]) for a, b in zip(single, parallel, strict=True))
    for step in shown:
        a, b = single[step]["loss"], parallel[step]["loss"]
        table.add_row(str(step), f"{a:.6f}", f"{b:.6f}", f"{abs(a - b):.1e}")
    console.print(table)
    console.print(f"loss {single[0]['loss']:.3f} -> {single[-1]['loss']:.3f}; the largest "
                  f"difference between the layouts over {args.steps} steps is {worst:.1e}")
    report = build_report(report_inputs(args.model, layout), out / "parallel")
    forecast = report.forecast
    path = save(report, out / "report.html")
    if forecast is not None:
        console.print(f"step time {forecast.measured_step_s * 1e3:.1f} ms, forecast "
                      f"{forecast.predicted_step_s * 1e3:.1f} ms for {forecast.hardware} "
                      f"({forecast.error:+.0%})")
        if forecast.disturbed:
            console.print(f"      {forecast.brief()}")
    console.print(f"report: {path.resolve()}")
    console.print(f"lab (the course's simulators, interactive): {write_lab(out).resolve()}")
    return 0
