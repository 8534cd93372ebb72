"""A layout's step time next to the CPU time a VM's host took while it ran, run after run.

    python -m tools.probes.host_steal [--runs N] [--steps N] [LAYOUT]
                                        (default: 4 runs of 40 steps of paraxis demo's layout)

Trains `paraxis demo`'s model and batch (tiny, 16 x 128 tokens, fp32) on CPU ranks launched as
`paraxis train --nproc` launches them, `--runs` times one after another, and prints per run the
median step time after the warm-up and the mean share of CPU time stolen during those steps (the
metrics' `cpu_steal`, paraxis/files/host_steal.py). Nothing else needs to run in the guest for the
share to move: on a shared host it does, and the step time with it.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from paraxis.commands.demo import GLOBAL_BATCH, LAYOUT_3D, SEQ_LEN
from paraxis.spec.layout import Layout


def one_run(layout: Layout, steps: int, folder: Path) -> tuple[float, float | None]:
    """(median step seconds, stolen share) of one run of `layout`."""
    from paraxis.dist.launch import launch
    from paraxis.files.run_records import load_metrics, steady, steal
    from paraxis.train.config import RunConfig
    from paraxis.train.loop import run_training

    metrics = folder / "metrics.jsonl"
    cfg = RunConfig.from_flags(model="tiny", steps=steps, global_batch=GLOBAL_BATCH,
                               seq_len=SEQ_LEN, lr=3e-3, warmup=10, device="cpu", quiet=True,
                               layout=layout, metrics_file=str(metrics))
    launch(run_training, (cfg,), layout.world_size, device="cpu")
    records = load_metrics(metrics)
    return steady(records, "step_time_s"), steal(records)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.probes.host_steal")
    parser.add_argument("layout", nargs="?", default=str(LAYOUT_3D))
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args(argv)
    layout = Layout.parse(args.layout)
    print(f"tiny {layout}, {args.steps} steps a run")
    with tempfile.TemporaryDirectory() as scratch:
        for run in range(args.runs):
            step, stolen = one_run(layout, args.steps, Path(scratch) / str(run))
            share = "not measured" if stolen is None else f"{stolen:.1%}"
            print(f"run {run + 1}: step {step * 1e3:.1f} ms, CPU time stolen by the host "
                  f"{share}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
