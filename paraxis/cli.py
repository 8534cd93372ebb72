"""The `paraxis` command: one front door to training, planning and the pictures.

Each subcommand lives in its own module with `add_arguments(parser)` and `run(args) -> int`;
modules are imported only when needed, so `paraxis plan` never imports torch.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import NoReturn

from paraxis.errors import ParaxisError

# (name, module, one-line help). Add a subcommand by adding a line.
COMMANDS: list[tuple[str, str, str]] = [
    ("demo", "paraxis.demo", "train the tiny model on the embedded corpus and show the loss fall"),
    ("train", "paraxis.train", "train a model on one device or many (torchrun-compatible)"),
    ("checkpoint", "paraxis.checkpoint.cli", "inspect a checkpoint, or convert it to "
     "another layout"),
    ("data", "paraxis.data_command", "tokenize a JSONL, Parquet or datasets corpus into shards"),
    ("plan", "paraxis.plan.plan_cli",
     "choose a layout (dp, tp, pp, cp, ep, zero, schedule...) from a cost model"),
    ("memory", "paraxis.plan.memory_cli", "ZeRO calculator: model-state memory per GPU"),
    ("schedule", "paraxis.simulate.schedule_command",
     "print a pipeline schedule's timeline, bubble and memory"),
    ("ring", "paraxis.simulate.ring_command", "watch a ring all-reduce step by step"),
    ("experts", "paraxis.moe.command",
     "where a mixture of experts routes its tokens, and the all-to-all that costs under EP"),
    ("context", "paraxis.viz.context_command",
     "see how context parallelism splits a sequence and passes K/V (text and pictures)"),
    ("report", "paraxis.report.command",
     "write one self-contained HTML report: plan, pictures, run"),
    ("lab", "paraxis.lab.command",
     "write the course's seven simulators and two more as one interactive, offline page"),
    ("calibrate", "paraxis.calibrate.command",
     "measure this machine's compute and collectives; write a profile for `plan --hardware`"),
    ("generate", "paraxis.generate", "sample text from a paraxis or Hugging Face checkpoint"),
]


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (argparse prints the whole usage block first),
    like every other paraxis error. Subcommand parsers inherit the class."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"paraxis: error: {message}; see `{self.prog} --help`\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="paraxis",
        description="Train one model across many devices (DP, TP, PP, CP, EP, ZeRO), plan the "
                    "layout from a cost model, and see how it works.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name, help_text in COMMANDS:
        module = importlib.import_module(module_name)
        command = sub.add_parser(name, help=help_text, description=help_text)
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                             help="show tracebacks on errors")
        module.add_arguments(command)
        command.set_defaults(run=module.run)
    return parser


def run_guarded(body: Callable[[], int], debug: bool = False) -> int:
    """Run a command; bad input becomes one line on stderr and exit code 2, a failed run
    (`RunFailed`) one line and exit code 3; no traceback unless `debug`."""
    try:
        return body() or 0
    except ParaxisError as error:
        if debug:
            traceback.print_exc()
        from paraxis.runtime.one_line import decide

        say, code = decide(error)  # one line however many ranks of a job raise it
        if say:
            print(f"paraxis: error: {error}", file=sys.stderr, flush=True)
        time.sleep(getattr(error, "linger_s", 0.0))
        return code
    except KeyboardInterrupt:
        print("paraxis: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader left (`paraxis schedule --json | head`): nothing more to say, and stdout
        # goes to /dev/null so that the interpreter's last flush does not fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # as a shell reports a process that SIGPIPE ended


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    return run_guarded(lambda: args.run(args), debug=args.debug)


if __name__ == "__main__":
    sys.exit(main())
