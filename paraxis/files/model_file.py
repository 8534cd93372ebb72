"""Where a run's model comes from: a preset name, a .json/.toml model file, or a directory
holding a model (a paraxis checkpoint's manifest, or a Hugging Face config.json)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from paraxis.files.checkpoint_manifest import complete_checkpoints, read_manifest, resolve
from paraxis.files.hf_config import hf_model_config
from paraxis.spec.errors import ParaxisError
from paraxis.spec.model_config import PRESETS, ModelConfig


def model_directory(name_or_path: str) -> Path | None:
    """The directory `name_or_path` names where it holds a model (a Hugging Face config.json,
    a paraxis checkpoint, or a directory of checkpoints), else None. Such a directory is read
    even where a preset has its name, as transformers' from_pretrained reads a local folder
    before the hub: every command that takes --model reads one model for one text."""
    path = Path(name_or_path)
    if not name_or_path.strip() or not path.is_dir():
        return None
    if (path / "config.json").is_file() or (path / "manifest.json").is_file():
        return path
    return path if complete_checkpoints(path) or name_or_path not in PRESETS else None


def load_model_config(name_or_path: str) -> ModelConfig:
    """A preset name, a .json/.toml file with the ModelConfig fields, or a directory holding a
    model: a paraxis checkpoint (manifest.json) or a Hugging Face model (config.json)."""
    if not name_or_path.strip():  # Path("") is the working folder, read as a checkpoint
        raise ParaxisError(f"--model is empty; give a preset ({', '.join(PRESETS)}), a "
                           ".json/.toml model file or a checkpoint folder")
    directory = model_directory(name_or_path)
    if directory is not None:
        return _model_of_directory(directory)
    if name_or_path in PRESETS:
        return PRESETS[name_or_path]
    path = Path(name_or_path)
    if path.suffix in (".json", ".toml"):
        if not path.is_file():
            raise ParaxisError(f"model file {path} does not exist; give a preset name "
                               f"({', '.join(PRESETS)}) or an existing .json/.toml file")
        try:
            text = path.read_text()
            data = (json.loads(text, object_pairs_hook=_no_repeated_keys)
                    if path.suffix == ".json" else tomllib.loads(text))
        except (ValueError, UnicodeDecodeError) as error:
            raise ParaxisError(f"model file {path} is not valid {path.suffix[1:]} ({error}); "
                               "fix the file or give a preset name") from None
        if isinstance(data, dict) and ("architectures" in data or "model_type" in data):
            return hf_model_config(path.parent)  # a Hugging Face config.json, given by name
        if isinstance(data, dict) and isinstance(data.get("model"), dict):
            data = _model_table(data, path)
        return ModelConfig.from_dict(data, source=str(path))
    raise ParaxisError(f"unknown model {name_or_path!r}; choose a preset ({', '.join(PRESETS)}), "
                       "or give a .json/.toml model file or a directory holding a model (a "
                       "Hugging Face config.json, or a paraxis checkpoint)")


def _model_table(data: dict, path: Path) -> dict:
    """The [model] table of a model file that wraps its fields in one; a run file's (which
    names its model) and keys beside the table, which would be ignored, are refused."""
    table, others = data["model"], sorted(key for key in data if key != "model")
    if set(table) == {"name"}:
        raise ParaxisError(f"{path} is a run file whose model is {table['name']!r}; give "
                           f"--model {table['name']} (or --config {path} to run it)")
    if others:
        raise ParaxisError(f"model file {path} has key(s) {', '.join(others)} beside its "
                           "[model] table, which would be ignored; move them into the table")
    return table


def _no_repeated_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """A JSON object whose keys are each given once: JSON would take the last of a repeated
    key silently (TOML refuses it itself)."""
    seen: dict[str, object] = {}
    for key, value in pairs:
        if key in seen:
            raise ValueError(f"the key {key!r} is given twice")
        seen[key] = value
    return seen


def _model_of_directory(path: Path) -> ModelConfig:
    if (path / "config.json").is_file():
        return hf_model_config(path)
    directory = resolve(path)  # a checkpoint, or the newest under a directory of them
    return ModelConfig.from_dict(read_manifest(directory)["model"], source=str(directory))
