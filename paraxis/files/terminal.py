"""The console the commands print to: rich on a terminal; when piped (a log, a file, a
test), wide enough that tables and long lines are not folded at rich's default 80 columns."""

from __future__ import annotations

import sys

from rich.console import Console

PIPED_WIDTH = 200  # columns of a line written to a file or pipe


def console(**options: object) -> Console:
    """A rich console on stdout (`options`: rich's, e.g. highlight=False): the terminal's
    width on a terminal, else PIPED_WIDTH, soft-wrapped (a line longer than that stays one
    line)."""
    if sys.stdout.isatty():
        return Console(**options)
    return Console(width=PIPED_WIDTH, soft_wrap=True, **options)
