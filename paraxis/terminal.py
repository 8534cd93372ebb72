"""The console the commands print to: rich on a terminal; when piped (a log, a file, a
test), wide enough that tables and long lines are not folded at rich's default 80 columns."""

from __future__ import annotations

import sys

from rich.console import Console

PIPED_WIDTH = 200


def console() -> Console:
    return Console() if sys.stdout.isatty() else Console(width=PIPED_WIDTH, soft_wrap=True)
