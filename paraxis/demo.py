"""`paraxis demo`: one model, one device and eight ranks, the same numbers, and a report.

1. Trains the tiny model on one device on the embedded corpus (this Python's own standard
   library, tokenised as bytes: nothing to download).
2. Trains the same model, seed and batches on a 3D layout, dp=2 x tp=2 x pp=2 (8 CPU ranks,
   ZeRO-1, 1F1B), launched like `paraxis train --nproc 8` (runtime/launch.py).
3. Prints the two loss curves side by side, then writes the HTML report for the 3D run
   (plan, defence, pictures, measured next to predicted) and prints its path.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from paraxis.layout import Layout

LAYOUT_3D = Layout(dp=2, tp=2, pp=2, zero=1, microbatches=2, schedule="1f1b")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--layout", default=str(LAYOUT_3D),
                        help="the parallel layout to compare with one device")
    parser.add_argument("--out", default="runs/demo", help="folder for metrics and the report")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from paraxis.config import RunConfig
    from paraxis.report import write_report
    from paraxis.runtime.launch import launch
    from paraxis.train import run_training

    console = Console()
    out = Path(args.out)
    layout = Layout.parse(args.layout)
    common = RunConfig.from_flags(model=args.model, steps=args.steps, global_batch=16,
                                  seq_len=128, lr=3e-3, warmup=10, device="cpu", log_every=20)
    single_cfg = common.with_flags(layout=Layout(),
                                   metrics_file=str(out / "single" / "metrics.jsonl"))
    parallel_cfg = common.with_flags(layout=layout,
                                     metrics_file=str(out / "parallel" / "metrics.jsonl"))
    for cfg in (single_cfg, parallel_cfg):  # bad input fails before anything is written
        cfg.check()
        cfg.layout.validate(cfg.layout.world_size)

    console.rule(f"[bold]1/3  {args.model} on one device")
    single = run_training(single_cfg)
    console.rule(f"[bold]2/3  the same model on {layout.world_size} ranks: {layout}")
    if layout.world_size > 1:
        launch(run_training, (parallel_cfg,), layout.world_size, device="cpu")
    else:
        run_training(parallel_cfg)
    parallel = [json.loads(line) for line in
                Path(parallel_cfg.logging.metrics_file).read_text().splitlines()]

    console.rule("[bold]3/3  loss, step by step")
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
    report = write_report(out / "report.html", model=args.model, gpus=layout.world_size,
                          layout=layout, global_batch=16, seq_len=128,
                          run_dir=out / "parallel")
    console.print(f"report: {report.resolve()}")
    return 0
