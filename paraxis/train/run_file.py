"""Run files: a RunConfig read from TOML, strictly, and written back (`paraxis/train/config.py`
holds the sections; a run file is one TOML table per section)."""

from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Collection
from pathlib import Path
from typing import Any

from paraxis.spec.errors import ParaxisError
from paraxis.spec.model_config import PRESETS
from paraxis.train.auto_config import expand_run_file
from paraxis.train.config import (
    FLAGS,
    NO_VALUE,
    FlagNames,
    RunConfig,
    field_type,
    flag_key,
    sections,
)


class RunFileNames(FlagNames):
    """A run file's values named as the file writes them (`run.toml: [optimizer] lr = -1`),
    so that a rule's error points at the line to fix, not at a flag nobody gave; a value a
    flag overrode keeps its flag's name. Keys are flat flag keys (`checkpoint_every`)."""

    def __init__(self, path: Path, keys: Collection[str]) -> None:
        self.path, self.keys = path, frozenset(keys)

    def of(self, key: str, value: Any = NO_VALUE) -> str:
        if key not in self.keys:
            return super().of(key, value)
        section, name = FLAGS[key]
        shown = "" if value is NO_VALUE else f" = {_toml_value(value)}"
        return f"{self.path}: [{section}] {name}{shown}"

    def overridden(self, flags: Collection[str]) -> RunFileNames:
        """These names less the values `flags` replaced (`RunConfig.with_flags`: --layout
        replaces the whole layout and its auto switch, --grad-accum is --microbatches)."""
        gone = set(flags) | ({"microbatches"} if "grad_accum" in flags else set())
        if "layout" in flags:
            gone |= {key for key, (section, _) in FLAGS.items() if section in ("layout", "auto")}
        return RunFileNames(self.path, self.keys - gone)


def read_run_file(path: str | Path) -> RunConfig:
    """A TOML run file -> RunConfig (defaults for what it leaves out)."""
    return read_run_file_named(path)[0]


def read_run_file_named(path: str | Path) -> tuple[RunConfig, RunFileNames]:
    """A TOML run file -> RunConfig, and the names of the values it set (`RunFileNames`)."""
    path = Path(path)
    if path.is_dir():
        raise ParaxisError(f"config file {path} is a folder; give a .toml run file (examples/ "
                           "holds some to start from)")
    if not path.exists():
        raise ParaxisError(f"config file {path} does not exist; check the path (examples/ "
                           "holds run files to start from)")
    if not path.is_file():  # a FIFO or a device: reading it could wait forever
        raise ParaxisError(f"config file {path} is not a regular file; give a .toml run file")
    try:
        text = path.read_text()
    except UnicodeDecodeError as error:
        raise ParaxisError(f"config file {path} is not UTF-8 text ({error}); save it as "
                           "UTF-8") from None
    if text.startswith("\ufeff"):
        raise ParaxisError(f"config file {path} starts with a byte-order mark (U+FEFF), which "
                           "TOML does not allow; save it as UTF-8 without BOM")
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ParaxisError(f"config file {path} is not valid TOML ({error}); fix that "
                           "line") from None
    known = sections()
    doc = expand_run_file(doc)  # `layout = "auto"` atop the file: the planner picks
    values: dict[str, Any] = {}
    keys: list[str] = []
    for section, table in doc.items():
        if section not in known:
            raise ParaxisError(f"{path}: unknown section [{section}]; known: "
                               f"{', '.join(known)}")
        if not isinstance(table, dict):
            raise ParaxisError(f"{path}: [{section}] must be a table of key = value lines")
        cls = known[section]
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = [key for key in table if key not in fields]
        if unknown and section == "layout":
            raise ParaxisError(f"{path}: unknown [layout] key(s) {', '.join(sorted(unknown))}; "
                               f"known: {', '.join(fields)}")
        if unknown:
            raise ParaxisError(f"{path}: unknown key {unknown[0]!r} in [{section}]; known: "
                               f"{', '.join(fields)}")
        for key, value in table.items():
            _check_type(path, section, key, value, field_type(cls, key), fields[key].default)
            keys.append(flag_key(section, fields[key]))
        values[section] = cls(**table)
    return RunConfig(**values), RunFileNames(path, keys)


EXAMPLES = {str: "runs/metrics.jsonl", int: 5, float: 400.0, bool: True}


def _check_type(path: Path, section: str, key: str, value: Any, wanted: type,
                default: Any) -> None:
    """A value must have its field's type (an int where a float is wanted is fine): a quoted
    number would otherwise fail deep inside training, far from the file that caused it."""
    ok = (isinstance(value, wanted) and not (isinstance(value, bool) and wanted is not bool)
          or wanted is float and isinstance(value, int) and not isinstance(value, bool))
    if not ok:
        fallback = "runs/x" if wanted is str and key == "dir" else EXAMPLES[wanted]
        example = _toml_value(default if default is not None else fallback)
        raise ParaxisError(f"{path}: [{section}] {key} = {value!r} must be of type "
                           f"{wanted.__name__}; write e.g. {key} = {example}")
    if wanted is float and not math.isfinite(value):  # TOML has nan and inf literals
        example = _toml_value(default if default is not None else EXAMPLES[float])
        raise ParaxisError(f"{path}: [{section}] {key} = {value} must be a finite number; "
                           f"write e.g. {key} = {example}")


# The fields that name files or folders, read relative to the working folder: written to a
# saved config whole, so it reads back the same from any folder (`to_toml`). Made ones are
# made when the run starts (metrics, checkpoints, event files); found ones only where they
# exist and are not one of the names the run reads first (a model preset, the embedded
# corpus, --resume auto; a datasets name exists nowhere), whatever lies in the folder.
MADE_PATHS = (("logging", "metrics_file"), ("logging", "tensorboard"), ("checkpoint", "dir"))
FOUND_PATHS = (("model", "name"), ("data", "tokenizer"), ("logging", "hardware"),
               ("checkpoint", "resume"), ("checkpoint", "init_from"))
BLEND_PATHS = (("data", "path"), ("data", "val_path"))
NAMES = {*PRESETS, "embedded", "auto", ""}


def _found(value: str) -> str:
    return value if value in NAMES or not Path(value).exists() else str(Path(value).resolve())


def _blend(spec: str) -> str:
    """A --data blend with each source that exists here made absolute, weights as written."""
    if spec in NAMES or Path(spec).exists():
        return _found(spec)
    items = []
    for item in spec.split(","):
        path, sep, weight = item.strip().rpartition(":")
        items.append(f"{_found(path)}:{weight}" if sep and path else _found(item.strip()))
    return ",".join(items)


def with_absolute_paths(cfg: RunConfig) -> RunConfig:
    """`cfg` with every path it names made absolute (`MADE_PATHS`, `FOUND_PATHS`,
    `BLEND_PATHS`): a saved config read back with --config from another folder names the
    same model, data, checkpoints and metrics, where relative ones would silently name others
    (or none: a resume from nothing starts at step 0)."""
    changes: dict[str, dict[str, str]] = {}
    for fields, convert in ((MADE_PATHS, lambda v: str(Path(v).resolve())),
                            (FOUND_PATHS, _found), (BLEND_PATHS, _blend)):
        for section, name in fields:
            value = getattr(getattr(cfg, section), name)
            if value is not None:
                changes.setdefault(section, {})[name] = convert(value)
    return dataclasses.replace(cfg, **{
        section: dataclasses.replace(getattr(cfg, section), **values)
        for section, values in changes.items()})


def to_toml(cfg: RunConfig) -> str:
    """The TOML that reads back to `cfg` (saved with checkpoints and runs). A field left at
    None (no metrics file, no checkpoint dir, ...) is left out: TOML has no None."""
    lines: list[str] = []
    for section in sections():
        values = getattr(cfg, section)
        lines.append(f"[{section}]")
        for f in dataclasses.fields(values):
            value = getattr(values, f.name)
            if value is not None:
                lines.append(f"{f.name} = {_toml_value(value)}")
        lines.append("")
    return "\n".join(lines)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
