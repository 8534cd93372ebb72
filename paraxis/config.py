"""A run described by a TOML file; every key can be overridden from the command line.

    [model]      name = "tiny-llama"
    [data]       path = "embedded"        dtype = "uint16"   tokenizer = "tok/tokenizer.json"
    [train]      steps = 200  global_batch = 16  seq_len = 128  seed = 0  device = "auto"
                 dtype = "fp32"  timeout_s = 600  on_nan = "stop"
    [optimizer]  lr = 3e-3  min_lr_ratio = 0.1  warmup_steps = 20  weight_decay = 0.1
                 grad_clip = 1.0
    [layout]     dp = 2  tp = 1  pp = 1  zero = 1  microbatches = 2  schedule = "1f1b"
    [logging]    metrics_file = "runs/x/metrics.jsonl"  log_every = 10
    [checkpoint] dir = "runs/x/checkpoints"  every = 50  keep = 3  resume = "auto"

Sections map onto `TrainConfig` fields (and `Layout` for [layout]); an unknown section or key
is an error naming the known ones, so a typo never silently trains with a default.
"""

from __future__ import annotations

import dataclasses
import tomllib
import typing
from pathlib import Path
from typing import Any

from paraxis.errors import ParaxisError
from paraxis.layout import Layout

# TOML (section, key) -> TrainConfig field.
SECTIONS: dict[str, dict[str, str]] = {
    "model": {"name": "model"},
    "data": {"path": "data", "dtype": "data_dtype", "tokenizer": "tokenizer"},
    "train": {"steps": "steps", "global_batch": "global_batch", "seq_len": "seq_len",
              "seed": "seed", "device": "device", "dtype": "dtype", "timeout_s": "timeout_s",
              "on_nan": "on_nan"},
    "optimizer": {"lr": "lr", "min_lr_ratio": "min_lr_ratio", "warmup_steps": "warmup_steps",
                  "weight_decay": "weight_decay", "grad_clip": "grad_clip"},
    "logging": {"metrics_file": "metrics_file", "log_every": "log_every",
                "tensorboard": "tensorboard", "peak_tflops": "peak_tflops",
                "hardware": "hardware"},
    "eval": {"every": "eval_every", "batches": "eval_batches"},
    "checkpoint": {"dir": "checkpoint_dir", "every": "checkpoint_every", "keep": "keep",
                   "resume": "resume", "exit_after": "exit_after", "init_from": "init_from"},
}


def read_run_file(path: str | Path) -> dict[str, Any]:
    """TOML file -> {TrainConfig field: value}, with "layout" holding a Layout."""
    path = Path(path)
    if not path.is_file():
        raise ParaxisError(f"config file {path} does not exist; check the path (examples/ "
                           "holds run files to start from)")
    try:
        doc = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise ParaxisError(f"config file {path} is not valid TOML ({error}); fix that "
                           "line") from None
    from paraxis.train import TrainConfig

    hints = typing.get_type_hints(TrainConfig)
    # field -> (its type without "| None", its default): the type decides, not the default
    fields = {f.name: (_plain_type(hints[f.name]), f.default)
              for f in dataclasses.fields(TrainConfig)}
    values: dict[str, Any] = {}
    for section, table in doc.items():
        if section == "layout":
            if not isinstance(table, dict):
                raise ParaxisError(f"{path}: [layout] must be a table")
            known = {f.name for f in dataclasses.fields(Layout)}
            unknown = sorted(set(table) - known)
            if unknown:
                raise ParaxisError(f"{path}: unknown [layout] key(s) {', '.join(unknown)}; "
                                   f"known: {', '.join(sorted(known))}")
            values["layout"] = Layout(**table)
            continue
        if section not in SECTIONS or not isinstance(table, dict):
            raise ParaxisError(f"{path}: unknown section [{section}]; known: "
                               f"{', '.join([*SECTIONS, 'layout'])}")
        for key, value in table.items():
            if key not in SECTIONS[section]:
                raise ParaxisError(f"{path}: unknown key {key!r} in [{section}]; known: "
                                   f"{', '.join(SECTIONS[section])}")
            _check_type(path, section, key, value, *fields[SECTIONS[section][key]])
            values[SECTIONS[section][key]] = value
    return values


def _plain_type(hint: Any) -> type:
    """`float | None` -> float; a plain type stays itself."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


EXAMPLES = {str: "runs/metrics.jsonl", int: 5, float: 400.0, bool: True}


def _check_type(path: Path, section: str, key: str, value: Any, wanted: type,
                default: Any) -> None:
    """A value must have its field's type (an int where a float is wanted is fine): a quoted
    number would otherwise fail deep inside training, far from the file that caused it."""
    ok = (isinstance(value, wanted) and not (isinstance(value, bool) and wanted is not bool)
          or wanted is float and isinstance(value, int) and not isinstance(value, bool))
    if not ok:
        example = _toml_value(default if default is not None else EXAMPLES[wanted])
        raise ParaxisError(f"{path}: [{section}] {key} = {value!r} must be of type "
                           f"{wanted.__name__}; write e.g. {key} = {example}")


def to_toml(cfg: Any) -> str:
    """A TrainConfig as the TOML that reads back to it (saved with checkpoints and runs)."""
    lines: list[str] = []
    for section, keys in SECTIONS.items():
        lines.append(f"[{section}]")
        for key, field in keys.items():
            value = getattr(cfg, field)
            if value is not None:
                lines.append(f"{key} = {_toml_value(value)}")
        lines.append("")
    lines.append("[layout]")
    for key, value in cfg.layout.to_dict().items():
        lines.append(f"{key} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
