"""`paraxis report`: write one self-contained HTML report: plan, defence, pictures, run.

    paraxis report --model gpt2-1.5b --gpus 16 --out report.html
    paraxis report --model tiny --gpus 8 --layout dp=2,tp=2,pp=2 --run runs/demo/parallel
    paraxis report --model tiny --gpus 2 --layout dp=2 --run runs/m --hardware profile.json \
                   --precision fp32        # priced on a `paraxis calibrate` profile

The model, hardware and batch flags are `paraxis plan`'s (paraxis.plan.inputs). A run is
forecast on the hardware it ran on (paraxis.report.hardware): --hardware or --gpu when
given, else this machine.
"""

from __future__ import annotations

import argparse

from paraxis.plan import inputs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    inputs.add_arguments(parser, model="tiny", gpus_text="the --layout's ranks, else 1",
                         global_batch=16, precision=None,
                         layout_help="price this layout (e.g. dp=2,tp=2,pp=2) instead of "
                                     "the planner's choice")
    # dest is not "run": the CLI keeps each subcommand's entry point in args.run
    parser.add_argument("--run", dest="run_dir", default=None,
                        help="a run folder: metrics.jsonl (+ optional *trace*.json)")
    parser.add_argument("--out", default="report.html", help="the HTML file to write")


def run(args: argparse.Namespace) -> int:
    from paraxis.report.build import build_report, save

    out = save(build_report(inputs.from_args(args), args.run_dir), args.out)
    print(f"report written to {out.resolve()}")
    return 0
