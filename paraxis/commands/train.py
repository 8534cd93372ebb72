"""`paraxis train`: train a model on one device or many (flags: `paraxis/train/flags.py`)."""

from __future__ import annotations

import argparse

from paraxis.train.flags import add_arguments, config_from_args

__all__ = ["add_arguments", "run"]


def run(args: argparse.Namespace) -> int:
    from paraxis.train.loop import run_training
    from paraxis.train.start import start

    return start(config_from_args(args), run_training, debug=getattr(args, "debug", False))
