"""The `paraxis` command: one front door to training, planning and the pictures.

Each subcommand lives in its own module with `add_arguments(parser)` and `run(args) -> int`;
modules are imported only when needed, so `paraxis plan` never imports torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from paraxis.dist.bad_input import OneLineParser, run_guarded

# (name, module, one-line help). Add a subcommand by adding a line.
COMMANDS: list[tuple[str, str, str]] = [
    ("demo", "paraxis.commands.demo",
     "train the tiny model on the embedded corpus and show the loss fall"),
    ("train", "paraxis.commands.train",
     "train a model on one device or many (torchrun-compatible)"),
    ("checkpoint", "paraxis.commands.checkpoint", "inspect a checkpoint, or convert it to "
     "another layout"),
    ("data", "paraxis.commands.data", "tokenize a JSONL, Parquet or datasets corpus into shards"),
    ("plan", "paraxis.commands.plan",
     "choose a layout (dp, tp, pp, cp, ep, zero, schedule...) from a cost model"),
    ("memory", "paraxis.commands.memory", "ZeRO calculator: model-state memory per GPU"),
    ("schedule", "paraxis.commands.schedule",
     "print a pipeline schedule's timeline, bubble and memory"),
    ("ring", "paraxis.commands.ring", "watch a ring all-reduce step by step"),
    ("experts", "paraxis.commands.experts",
     "where a mixture of experts routes its tokens, and the all-to-all that costs under EP"),
    ("context", "paraxis.commands.context",
     "see how context parallelism splits a sequence and passes K/V (text and pictures)"),
    ("report", "paraxis.commands.report",
     "write one self-contained HTML report: plan, pictures, run"),
    ("diagnose", "paraxis.commands.diagnose",
     "why a run ended, or why throughput fell after a move: measured figures and forecast"),
    ("lab", "paraxis.commands.lab",
     "write the course's seven simulators and two more as one interactive, offline page"),
    ("calibrate", "paraxis.commands.calibrate",
     "measure this machine's compute and collectives; write a profile for `plan --hardware`"),
    ("generate", "paraxis.commands.generate",
     "sample text from a paraxis or Hugging Face checkpoint"),
]


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; with `command`, only that subcommand's module is imported and its
    arguments added (the others are listed by name and help), so a command starts quickly."""
    parser = OneLineParser(
        prog="paraxis",
        description="Train one model across many devices (DP, TP, PP, CP, EP, ZeRO), plan the "
                    "layout from a cost model, and see how it works.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name, help_text in COMMANDS:
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        sub_parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                                help="show tracebacks on errors")
        if command in (None, name):
            module = importlib.import_module(module_name)
            module.add_arguments(sub_parser)
            sub_parser.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # the first word naming a command is the command (options before it are paraxis's own)
    named = {name for name, _, _ in COMMANDS}
    parser = build_parser(next((word for word in argv if word in named), None))
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    return run_guarded(lambda: args.run(args), debug=args.debug)


if __name__ == "__main__":
    sys.exit(main())
