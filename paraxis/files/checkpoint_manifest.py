"""The checkpoint directory's table of contents, and the checks made before trusting it.

    runs/x/checkpoints/step-00000010/
        manifest.json           format, step, layout, model, data position, files, pieces
        config.toml             the resolved run config (reads back with --config)
        rank-00000.safetensors  the pieces rank 0 owns (+ its RNG state) ...
        rank-00000-1.safetensors  ... in files of at most 256 MiB of pieces each
        ...

`manifest.json` is written last, inside a temporary directory that is then renamed into
place: a directory named `step-N` with a manifest is complete by construction. The manifest
carries a SHA-256 of its own content (`checksum`, over the other fields as canonical JSON),
as each shard file's entry carries the file's: a manifest damaged on disk or edited by hand
is refused before anything it names is read (format version 2; version 1, written before
the checksum existed, is read without it).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any

from paraxis.spec.errors import ParaxisError

FORMAT = "paraxis-checkpoint"
VERSION = 2
CHECKSUM = "checksum"
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


def checksum_of(manifest: dict[str, Any]) -> str:
    """SHA-256 of a manifest's fields but its checksum, as sorted compact JSON: the same value
    for the dict written and the dict read back (JSON round-trips Python floats exactly)."""
    body = {key: value for key, value in manifest.items() if key != CHECKSUM}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def with_checksum(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest as written: its fields and the checksum over them."""
    return {**manifest, CHECKSUM: checksum_of(manifest)}


def read_manifest(directory: Path) -> dict[str, Any]:
    """The manifest of a complete checkpoint, checked for format, version, file names, every
    field a reader uses, and (version 2 on) its own checksum."""
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
        raise ParaxisError(f"{path} is not a paraxis checkpoint manifest (no \"format\": "
                           f"\"{FORMAT}\"); the checkpoint is damaged or not paraxis's: use "
                           "an earlier checkpoint, or one `paraxis train` saved")
    version = manifest.get("version")
    if not isinstance(version, int) or version > VERSION:
        raise ParaxisError(f"{path} has format version {version}, newer than this paraxis "
                           f"reads ({VERSION}); upgrade paraxis to load it")
    for name in manifest.get("files") or {}:  # first: a name leaving the folder is the worst
        safe_member(directory, name)
    check_schema(manifest, path)
    _check_checksum(manifest, path)
    named = STEP_DIR.match(directory.name)
    if named and int(named.group(1)) != manifest["step"]:
        raise ParaxisError(f"{directory} is named for step {int(named.group(1))} but its "
                           f"manifest says step {manifest['step']} (renamed?); give it back "
                           f"its name, {step_dir_name(manifest['step'])}")
    return manifest


def _check_checksum(manifest: dict[str, Any], path: Path) -> None:
    """After the schema (whose errors say more): a change that kept every field well-formed
    (a file's checksum, a shape, the step) still shows as a mismatch here."""
    if manifest["version"] < 2:
        return  # written before manifests carried a checksum
    recorded = manifest.get(CHECKSUM)
    if not isinstance(recorded, str):
        raise ParaxisError(f"{path} is damaged: it has no checksum of its own (format version "
                           f"{manifest['version']} carries one); use an earlier checkpoint")
    if recorded != checksum_of(manifest):
        raise ParaxisError(f"{path} is damaged: its content does not match its checksum "
                           "(changed after it was written); use an earlier checkpoint")


def _whole(value: Any, least: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def check_schema(manifest: dict[str, Any], path: Path) -> None:
    """Every field a reader uses, of its type and within its range, so that a damaged or
    hand-edited manifest is one line naming the field, never an IndexError deep in loading."""
    def bad(what: str) -> ParaxisError:
        return ParaxisError(f"{path} is damaged: {what}; use an earlier checkpoint")

    for key, least in (("step", 0), ("world_size", 1)):
        if not _whole(manifest.get(key), least):
            raise bad(f"{key} is {manifest.get(key)!r}, not a whole number >= {least}")
    if "optimizer_steps" in manifest and not _whole(manifest["optimizer_steps"]):
        raise bad(f"optimizer_steps is {manifest['optimizer_steps']!r}")
    if not isinstance(manifest.get("model"), dict) or not isinstance(manifest.get("layout"), str):
        raise bad("model must be a table and layout a string")
    files = manifest.get("files")
    if not isinstance(files, dict) or not all(
            isinstance(f, dict) and isinstance(f.get("sha256"), str) and _whole(f.get("bytes"))
            for f in files.values()):
        raise bad("files must map each file name to its sha256 and bytes")
    pieces = manifest.get("pieces")
    if not isinstance(pieces, list):
        raise bad("pieces must be a list")
    first: dict[tuple[str, str], tuple] = {}
    for number, piece in enumerate(pieces):
        problem = _piece_problem(piece, files)
        if problem:
            raise bad(f"piece {number} ({_label(piece)}) {problem}")
        cut = (tuple(piece["shape"]), piece["tp_count"], piece["tp_dim"])
        if first.setdefault((piece["kind"], piece["name"]), cut) != cut:
            raise bad(f"piece {number} ({_label(piece)}) has shape {list(cut[0])} cut "
                      f"{cut[1]} ways, unlike the other pieces of that tensor")


def _label(piece: Any) -> str:
    return f"{piece.get('kind')} {piece.get('name')}" if isinstance(piece, dict) else "?"


def _piece_problem(piece: Any, files: dict[str, Any]) -> str | None:
    """What is wrong with one piece's record (None: nothing)."""
    if not isinstance(piece, dict):
        return "is not a table"
    for key in ("kind", "name", "file", "key"):
        if not isinstance(piece.get(key), str):
            return f"has no {key}"
    if piece["file"] not in files:
        return f"names file {piece['file']!r}, which the manifest does not list"
    shape = piece.get("shape")
    if not isinstance(shape, list) or not all(_whole(d, 1) for d in shape):
        return f"has shape {shape!r}, not a list of positive sizes"
    count, index, dim = piece.get("tp_count"), piece.get("tp_index"), piece.get("tp_dim")
    if not _whole(count, 1) or not _whole(index) or index >= count:
        return f"has tp_index {index!r} outside 0..tp_count-1 (tp_count {count!r})"
    if count > 1 and not (_whole(dim) and dim < len(shape) and shape[dim] % count == 0):
        return f"is cut {count} ways along dimension {dim!r} of shape {shape}: no such cut"
    if dim is not None and not _whole(dim):
        return f"has tp_dim {dim!r}"
    numel = math.prod(shape) // count
    lo, hi = piece.get("lo"), piece.get("hi")
    if not (_whole(lo) and _whole(hi) and lo < hi <= numel):
        return f"has range {lo!r}..{hi!r} outside its slice of {numel} elements"
    return None


def safe_member(directory: Path, name: str) -> Path:
    """`directory / name`, refusing names that would leave the directory (`../x`, `/x`)."""
    if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
        raise ParaxisError(f"{directory / MANIFEST} names file {name!r} outside the "
                           "checkpoint directory; refusing to read it")
    return directory / name


# Model fields a resumed run may change: the name, and the routing bias's update speed
# (DeepSeek-V3 trained with 0.001, then 0 for its last 500B tokens, Sec. 4.2).
CHANGES_ON_RESUME = ("name", "expert_bias_rate")


def check_model(manifest: dict[str, Any], model: dict[str, Any], directory: Path) -> None:
    """The checkpoint must hold this model: same shapes, same architecture. `manifest`'s
    model as `ModelConfig.to_dict` gives it (with every field; `load_checkpoint` reads it
    so), so a field the checkpoint predates reads as its default."""
    saved = manifest.get("model", {})
    differ = sorted(k for k in set(saved) | set(model)
                    if k not in CHANGES_ON_RESUME and saved.get(k) != model.get(k))
    if differ:
        details = ", ".join(f"{k} {saved.get(k)} vs {model.get(k)}" for k in differ[:4])
        raise ParaxisError(f"checkpoint {directory} holds a different model ({details}); "
                           "train with --model set to the checkpoint's model (or its directory)")


def folder_of(path: str | Path) -> Path:
    """`path`, or its checkpoint directory when `path` is the manifest itself (a path one
    may well give for the checkpoint)."""
    path = Path(path)
    return path.parent if path.name == MANIFEST and path.is_file() else path


def resolve(path: str | Path) -> Path:
    """A checkpoint directory, or the newest complete one under a directory of them."""
    path = folder_of(path)
    if path.name.endswith(".tmp") and STEP_DIR.match(path.name.removesuffix(".tmp")):
        raise ParaxisError(f"checkpoint {path} is a save that never finished (a step-N.tmp "
                           "folder is never loaded); give a complete step-N directory or the "
                           "directory that holds them")
    if (path / MANIFEST).is_file():
        return path
    if path.exists() and not path.is_dir():
        raise ParaxisError(f"checkpoint {path} is a file, not a checkpoint directory; give a "
                           "step-N directory or the directory that holds them")
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
