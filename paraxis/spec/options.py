"""One declared option: a dataclass field with its default, one-line help and, where it is not
`--<name>`, its command-line flag. The run config's sections and the Layout are written with
it, and `paraxis.train.flags` derives the flags and their help from these fields (pure
Python)."""

from __future__ import annotations

from dataclasses import field
from typing import Any


def option(default: Any, help: str, flag: str | None = None, **extra: Any) -> Any:
    """A field: its default, one-line help, and its flag when not `--<name>`."""
    return field(default=default, metadata={"help": help, "flag": flag, **extra})
