"""`paraxis report`: write one self-contained HTML report: plan, defence, pictures, run.

    paraxis report --model gpt2-1.5b --gpus 16 --out report.html
    paraxis report --model tiny --gpus 8 --layout dp=2,tp=2,pp=2 --run runs/demo/parallel
    paraxis report --model tiny --gpus 2 --layout dp=2 --run runs/m --hardware profile.json \
                   --precision fp32        # priced on a `paraxis calibrate` profile

The model, hardware and batch flags are `paraxis plan`'s (paraxis.plan.inputs); for a run,
those left out come from the run's own config.toml (its model, layout, batch, sequence length
and precision). A run is forecast on the hardware it ran on (paraxis.train.run_hardware):
--hardware or --gpu when given, else this machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from paraxis.files.run_records import found_beside
from paraxis.plan import inputs
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import Layout

GLOBAL_BATCH = 16  # without a run's config.toml: the demo's batch


def add_arguments(parser: argparse.ArgumentParser) -> None:
    inputs.add_arguments(parser, model="tiny", gpus_text="the --layout's ranks, else 1",
                         global_batch=None, precision=None,
                         layout_help="price this layout (e.g. dp=2,tp=2,pp=2) instead of "
                                     "the planner's choice")
    # dest is not "run": the CLI keeps each subcommand's entry point in args.run
    parser.add_argument("--run", dest="run_dir", default=None,
                        help="a run: its --metrics-file, or the folder holding "
                             "metrics.jsonl (+ optional *trace*.json, config.toml)")
    parser.add_argument("--out", default="report.html", help="the HTML file to write")


def run(args: argparse.Namespace) -> int:
    from paraxis.files.host import check_writable
    from paraxis.show.report.build import build_report, save
    from paraxis.show.report.measured import metrics_path

    inputs.check_numbers(args)  # as `paraxis plan` checks them
    check_writable(args.out, "--out", "report.html")
    given = inputs.from_args(args)
    if args.run_dir is not None:
        metrics = metrics_path(Path(args.run_dir))
        config = found_beside(metrics, "config.toml")
        if config is not None:
            given = from_run_config(given, args, config, metrics)
    if given.global_batch is None:
        given = dataclasses.replace(given, global_batch=GLOBAL_BATCH)
    out = save(build_report(given, args.run_dir), args.out)
    print(f"report written to {out.resolve()}")
    return 0


def _layout_text(text: str) -> str:
    try:
        return str(Layout.parse(text))
    except ParaxisError:
        return text  # a bad layout: the forecast says what is wrong with it


def from_run_config(given: inputs.PlanInputs, args: argparse.Namespace, path: Path,
                    metrics: Path | None = None) -> inputs.PlanInputs:
    """What the command line leaves out, from the run's own resolved config (`paraxis train`
    writes config.toml beside metrics.jsonl): the model, layout, batch, sequence length,
    precision, loss kernel and FP8 gathers that really ran, so the forecast prices that
    run."""
    from paraxis.train.run_file import read_run_file

    run = read_run_file(path)
    asked = [f"--model {args.model}"] if args.model not in (None, run.model.name) else []
    if args.layout is not None and _layout_text(args.layout) != str(run.layout):
        asked.append(f"--layout {args.layout}")
    if asked:
        print(f"paraxis: warning: {' and '.join(asked)} is not what the run ran ({run.layout}, "
              f"{run.model.name}: {path}); the forecast of it is set beside that run's "
              "measurements. Leave them out to forecast the run itself.", file=sys.stderr)
    changes: dict[str, object] = {}
    if args.model is None and args.params is None:
        # the model as it ran (model.json beside its metrics), not its file as it is now
        trained = found_beside(metrics, "model.json") if metrics is not None else None
        changes["model"] = str(trained) if trained is not None else run.model.name
    if args.layout is None:
        changes["layout"] = str(run.layout)
    if args.global_batch is None:
        changes["global_batch"] = run.train.global_batch
    if args.seq_len is None:
        changes["seq_len"] = run.train.seq_len
    if args.precision is None:
        changes["precision"] = run.train.precision  # the planner knows every policy
    # how the run computed its loss and gathered its FP8 weights, priced as it ran
    changes["fused_loss"] = given.fused_loss or run.train.fused_loss
    if args.precision is None:  # the run's FP8 precision with it
        changes["fp8_weight_gather"] = given.fp8_weight_gather or run.train.fp8_weight_gather
    return dataclasses.replace(given, **changes)
