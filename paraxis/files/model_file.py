"""Where a run's model comes from: a preset name, a .json/.toml model file, or a directory
holding a model (a paraxis checkpoint's manifest, or a Hugging Face config.json)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from paraxis.files.checkpoint_manifest import read_manifest, resolve
from paraxis.files.hf_config import hf_model_config
from paraxis.spec.errors import ParaxisError
from paraxis.spec.model_config import PRESETS, ModelConfig


def load_model_config(name_or_path: str) -> ModelConfig:
    """A preset name, a .json/.toml file with the ModelConfig fields, or a directory holding a
    model: a paraxis checkpoint (manifest.json) or a Hugging Face model (config.json)."""
    if name_or_path in PRESETS:
        return PRESETS[name_or_path]
    if not name_or_path.strip():  # Path("") is the working folder, read as a checkpoint
        raise ParaxisError(f"--model is empty; give a preset ({', '.join(PRESETS)}), a "
                           ".json/.toml model file or a checkpoint folder")
    path = Path(name_or_path)
    if path.is_dir():
        return _model_of_directory(path)
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
        if isinstance(data, dict):
            data = data.get("model", data)
        return ModelConfig.from_dict(data, source=str(path))
    raise ParaxisError(f"unknown model {name_or_path!r}; choose a preset ({', '.join(PRESETS)}) "
                       "or give a .json/.toml file")


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
