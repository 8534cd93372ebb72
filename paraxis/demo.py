"""`paraxis demo`: train the tiny model on the embedded corpus and watch the loss fall.

Needs no download: the corpus is this Python's own standard library, tokenised as bytes.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from paraxis.layout import Layout


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--out", default="runs/demo", help="folder for the run's metrics")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from paraxis.train import TrainConfig, run_training

    console = Console()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = TrainConfig(model=args.model, steps=args.steps, global_batch=16, seq_len=128,
                      lr=3e-3, warmup_steps=20, layout=Layout(), device="cpu",
                      metrics_file=str(out / "metrics.jsonl"), log_every=25)
    console.print(f"[bold]paraxis demo[/]: {cfg.model} on the embedded stdlib corpus, "
                  f"{cfg.steps} steps, layout {cfg.layout}")
    records = run_training(cfg)
    first = sum(r["loss"] for r in records[:10]) / min(10, len(records))
    last = sum(r["loss"] for r in records[-10:]) / min(10, len(records))
    console.print(f"loss {first:.3f} (first 10 steps) -> {last:.3f} (last 10 steps); "
                  f"metrics in {out / 'metrics.jsonl'}")
    return 0
