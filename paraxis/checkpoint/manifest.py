"""The checkpoint directory's table of contents, and the checks made before trusting it.

    runs/x/checkpoints/step-00000010/
        manifest.json           format, step, layout, model, data position, files, pieces
        config.toml             the resolved run config (reads back with --config)
        rank-00000.safetensors  the pieces rank 0 owns (+ its RNG state) ...
        rank-00000-1.safetensors  ... in files of at most 256 MiB of pieces each
        ...

`manifest.json` is written last, inside a temporary directory that is then renamed into
place: a directory named `step-N` with a manifest is complete by construction.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

from paraxis.errors import ParaxisError

FORMAT = "paraxis-checkpoint"
VERSION = 1
MANIFEST = "manifest.json"
STEP_DIR = re.compile(r"^step-(\d{8})$")


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_manifest(directory: Path) -> dict[str, Any]:
    """The manifest of a complete checkpoint, checked for format, version and file names."""
    path = directory / MANIFEST
    if not directory.is_dir():
        raise ParaxisError(f"checkpoint {directory} does not exist")
    if not path.is_file():
        raise ParaxisError(f"{directory} has no {MANIFEST}: not a checkpoint, or a save that "
                           "never finished; point at a step-N directory or its parent")
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ParaxisError(f"{path} is not valid JSON ({error}); the checkpoint is damaged, "
                           "use an earlier one") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ParaxisError(f"{path} is not a paraxis checkpoint manifest")
    version = manifest.get("version")
    if not isinstance(version, int) or version > VERSION:
        raise ParaxisError(f"{path} has format version {version}, newer than this paraxis "
                           f"reads ({VERSION}); upgrade paraxis to load it")
    for name in manifest.get("files", {}):
        safe_member(directory, name)
    return manifest


def safe_member(directory: Path, name: str) -> Path:
    """`directory / name`, refusing names that would leave the directory (`../x`, `/x`)."""
    if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
        raise ParaxisError(f"{directory / MANIFEST} names file {name!r} outside the "
                           "checkpoint directory; refusing to read it")
    return directory / name


def check_model(manifest: dict[str, Any], model: dict[str, Any], directory: Path) -> None:
    """The checkpoint must hold this model: same shapes, same architecture."""
    saved = manifest.get("model", {})
    differ = sorted(k for k in set(saved) | set(model)
                    if k != "name" and saved.get(k) != model.get(k))
    if differ:
        details = ", ".join(f"{k} {saved.get(k)} vs {model.get(k)}" for k in differ[:4])
        raise ParaxisError(f"checkpoint {directory} holds a different model ({details}); "
                           "train with --model set to the checkpoint's model (or its directory)")


def resolve(path: str | Path) -> Path:
    """A checkpoint directory, or the newest complete one under a directory of them."""
    path = Path(path)
    if (path / MANIFEST).is_file():
        return path
    if not path.is_dir():
        raise ParaxisError(f"checkpoint {path} does not exist; give a step-N directory or the "
                           "directory that holds them")
    if STEP_DIR.match(path.name.removesuffix(".tmp")):
        read_manifest(path)  # raises: a step directory without its manifest
    found = complete_checkpoints(path)
    if not found:
        raise ParaxisError(f"no complete checkpoint (step-N/{MANIFEST}) under {path}")
    return found[-1][1]


def complete_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """(step, directory) of every complete checkpoint under `root`, oldest first. Partial
    saves (`*.tmp`, or no manifest) are never listed, so never taken as the latest."""
    if not root.is_dir():
        return []
    out = []
    for child in root.iterdir():
        match = STEP_DIR.match(child.name)
        if match and (child / MANIFEST).is_file():
            out.append((int(match.group(1)), child))
    return sorted(out)
