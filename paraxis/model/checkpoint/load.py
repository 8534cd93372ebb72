"""Loading a checkpoint into any layout, and reading it as plain full tensors.

    step = load_checkpoint(engine, directory, model)   # on every rank; any layout
    model_cfg, params = read_full_state(directory)      # one process, no process group

Each rank walks its own entries (`Engine.checkpoint_entries`) and reads, for each, only its
piece: where the writer cut the tensor the same way for TP (the same count of slices), the
saved pieces are flat ranges of the same slice, and the rank reads just the overlapping
parts of them (`get_slice`); otherwise the full single-device tensor is rebuilt from the
pieces that cover it, one at a time, and the rank's piece cut out. The writer's layout never
matters, which is what resharding means. Files are opened with safetensors (no pickle, so
loading never runs code) after their SHA-256 matches the manifest, so a truncated or
corrupted shard is named rather than half-loaded; with a process group, the ranks share the
hashing (each hashes every world-size-th file) instead of each hashing every file.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors import safe_open

from paraxis.files.checkpoint_manifest import (
    check_model,
    read_manifest,
    resolve,
    safe_member,
    sha256_of,
)
from paraxis.model.checkpoint.entries import KINDS, Checkpointable, Entry, set_optimizer_steps
from paraxis.model.checkpoint.pieces import FullSource, fill_entries, rows_holding
from paraxis.model.checkpoint.save import rank_file
from paraxis.spec.errors import ParaxisError
from paraxis.spec.model_config import ModelConfig


class CheckpointReader:
    """Full tensors out of a checkpoint's pieces, verifying each file before first use."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = resolve(directory)  # a step-N dir, or the newest under a parent
        self.manifest = read_manifest(self.directory)
        self.pieces: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        for piece in self.manifest.get("pieces", []):
            self.pieces[(piece["kind"], piece["name"])].append(piece)
        self._verified: set[str] = set()  # files whose checksum some rank has checked
        # full tensors rebuilt from their pieces, one at a time, where the TP cut changed
        self._rebuilt = FullSource(self.full, {})

    def names(self, kind: str = "param") -> list[str]:
        return sorted(name for k, name in self.pieces if k == kind)

    def model_config(self) -> ModelConfig:
        """The model the checkpoint trained, every field (one it predates: its default)."""
        return ModelConfig.from_dict(self.manifest["model"],
                                     source=str(self.directory / "manifest.json"))

    def full(self, kind: str, name: str) -> torch.Tensor:
        """The whole single-device tensor `kind/name`, assembled from its pieces."""
        pieces = self.pieces.get((kind, name))
        if not pieces:
            raise ParaxisError(f"checkpoint {self.directory} has no {kind} for {name}; it was "
                               "saved from a different model")
        shape = tuple(pieces[0]["shape"])
        count = pieces[0]["tp_count"]
        slice_numel = math.prod(shape) // count
        slices: list[torch.Tensor | None] = [None] * count
        filled = [0] * count
        for piece in pieces:
            values = self._slice(piece, 0, piece["hi"] - piece["lo"])
            index = piece["tp_index"]
            if slices[index] is None:
                slices[index] = torch.empty(slice_numel, dtype=values.dtype)
            slices[index][piece["lo"]:piece["hi"]] = values.reshape(-1)
            filled[index] += piece["hi"] - piece["lo"]
        if filled != [slice_numel] * count:
            raise ParaxisError(f"checkpoint {self.directory} covers only part of {kind} "
                               f"{name}; a rank's shard is missing from the manifest")
        if count == 1:
            return slices[0].view(shape)
        dim = pieces[0]["tp_dim"]
        local = list(shape)
        local[dim] //= count
        return torch.cat([s.view(local) for s in slices], dim=dim)

    def full_shape(self, kind: str, name: str) -> tuple[int, ...] | None:
        pieces = self.pieces.get((kind, name))
        return tuple(pieces[0]["shape"]) if pieces else None

    def piece(self, entry: Entry) -> torch.Tensor:
        """The entry's piece, flat: read from the saved ranges of the same TP slice when
        the writer sliced the tensor the same way, else cut from the rebuilt full tensor."""
        pieces = self.pieces[(entry.kind, entry.name)]
        same_cut = all(p["tp_count"] == entry.tp_count and
                       (entry.tp_count == 1 or p["tp_dim"] == entry.tp_dim) for p in pieces)
        if not same_cut:
            return self._rebuilt.piece(entry)
        out = None
        filled = 0
        for saved in pieces:
            lo, hi = max(entry.lo, saved["lo"]), min(entry.hi, saved["hi"])
            if saved["tp_index"] != entry.tp_index or lo >= hi:
                continue
            values = self._slice(saved, lo - saved["lo"], hi - saved["lo"])
            if out is None:
                out = torch.empty(entry.hi - entry.lo, dtype=values.dtype)
            out[lo - entry.lo:hi - entry.lo] = values
            filled += hi - lo
        if out is None or filled != entry.hi - entry.lo:
            raise ParaxisError(f"checkpoint {self.directory} covers only part of {entry.kind} "
                               f"{entry.name}; a rank's shard is missing from the manifest")
        return out

    def verify(self, rank: int = 0, world_size: int = 1) -> list[str]:
        """Hash this rank's share of the files (every world_size-th, from `rank`); returns the
        problems found. Files it hashed, and those the caller marks, are not hashed again."""
        problems = []
        for position, name in enumerate(sorted(self.manifest.get("files", {}))):
            if position % world_size == rank:
                try:
                    self._check_file(name)
                except ParaxisError as error:
                    problems.append(str(error))
        return problems

    def rank_tensor(self, rank_file: str, key: str) -> torch.Tensor | None:
        with self._handle(rank_file) as handle:
            return handle.get_tensor(key) if key in handle.keys() else None

    def _slice(self, piece: dict[str, Any], lo: int, hi: int) -> torch.Tensor:
        """Elements [lo, hi) of a saved piece, flattened, read without the rest of it (a
        whole parameter is saved in its shape: the rows that hold the range are read)."""
        try:
            with self._handle(piece["file"]) as handle:
                saved = handle.get_slice(piece["key"])
                row = math.prod(saved.get_shape()[1:])
                first, last = rows_holding(lo, hi, row)
                return saved[first:last].reshape(-1)[lo - first * row:hi - first * row]
        except ParaxisError:
            raise
        except Exception as error:  # noqa: BLE001 - safetensors raises several kinds
            raise ParaxisError(f"{self.directory / piece['file']}: cannot read "
                               f"{piece['key']} ({error})") from None

    def _handle(self, name: str) -> Any:
        """A safetensors handle (a context manager) on a checked file. Handles are not kept:
        an open file stays memory-mapped, and the pages it touched would count as this
        process's memory until it closed."""
        path = self._check_file(name)
        try:
            return safe_open(str(path), framework="pt", device="cpu")
        except Exception as error:  # noqa: BLE001
            raise ParaxisError(f"{path} is not a safetensors file ({error})") from None

    def _present(self, name: str) -> tuple[Path, dict]:
        """The file's path and manifest entry, once it is listed and present."""
        path = safe_member(self.directory, name)
        expected = self.manifest.get("files", {}).get(name)
        if expected is None:
            raise ParaxisError(f"{path} is not listed in the manifest's files")
        if not path.is_file():
            raise ParaxisError(f"{path} is missing; the checkpoint is incomplete, use an "
                               "earlier one")
        return path, expected

    def _check_file(self, name: str) -> Path:
        """The file's path once it is listed, present, of its size and (unless some rank
        already hashed it) of its checksum."""
        path, expected = self._present(name)
        if path.stat().st_size != expected["bytes"] or (
                name not in self._verified and sha256_of(path) != expected["sha256"]):
            raise ParaxisError(f"{path} is corrupt or truncated (checksum differs from "
                               "the manifest); use an earlier checkpoint")
        self._verified.add(name)
        return path

    def check_complete(self) -> None:
        """Every listed file present at its size (no hashing: the files read are hashed on
        first use), so a checkpoint that training would refuse is refused here too."""
        for name in sorted(self.manifest.get("files", {})):
            path, expected = self._present(name)
            if path.stat().st_size != expected["bytes"]:
                raise ParaxisError(f"{path} is corrupt or truncated (its size differs from "
                                   "the manifest); use an earlier checkpoint")

    def trust_all(self) -> None:
        """Every file was hashed by some rank (`verify_together`): skip hashing on open."""
        self._verified.update(self.manifest.get("files", {}))


def verify_together(reader: CheckpointReader) -> None:
    """Check the checkpoint's files with the work split over the ranks of the default process
    group (each hashes 1/world of them), and raise the same one-line error on every rank if
    any failed. Without a process group, files are checked as they are opened."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    rank, world = dist.get_rank(), dist.get_world_size()
    problems = reader.verify(rank, world)
    everyone: list[list[str] | None] = [None] * world
    dist.all_gather_object(everyone, problems)
    found = sorted(p for share in everyone for p in share or [])
    if found:
        raise ParaxisError(found[0])
    reader.trust_all()


def load_checkpoint(engine: Checkpointable, directory: str | Path, model: dict[str, Any],
                    rank: int = 0, restore_rng: bool = True,
                    weights_only: bool = False) -> dict[str, Any]:
    """Fill the engine's parameters and optimizer states from `directory`; every rank calls
    it. Returns the manifest (step, data position, ...).

    weights_only: parameters alone, AdamW starting fresh (fine-tuning from a checkpoint).
    The RNG state comes back only when the checkpoint was written by the same layout (a
    resharded run has different ranks, so no rank's state is "its own").
    """
    reader = CheckpointReader(directory)
    manifest = reader.manifest
    # the saved model with every field: one the checkpoint predates reads as its default,
    # the model that checkpoint trained
    saved = reader.model_config().to_dict()
    check_model({"model": saved}, model, reader.directory)
    verify_together(reader)
    with_optimizer = manifest.get("has_optimizer", False) and not weights_only
    fill_entries(engine, reader, KINDS if with_optimizer else ("param",),
                 f"checkpoint {reader.directory}")
    if with_optimizer:
        set_optimizer_steps(engine.optimizer, manifest.get("optimizer_steps", 0))
        scaler = engine.loss_scaler
        if scaler is not None and manifest.get("loss_scaler"):
            scaler.load_state_dict(manifest["loss_scaler"])
    # A run's own layout wrote a file per rank with its RNG state; a conversion (`convert`)
    # writes one per (stage, TP rank) and no RNG state, so the other ranks have none.
    own_file = rank_file(rank)
    same_layout = manifest.get("layout") == str(engine.layout)
    if restore_rng and same_layout and not weights_only and own_file in manifest["files"]:
        state = reader.rank_tensor(own_file, "rng/torch")
        if state is not None:
            torch.set_rng_state(state)
        if engine.device.type == "cuda":
            cuda_state = reader.rank_tensor(own_file, "rng/cuda")
            if cuda_state is not None:
                torch.cuda.set_rng_state(cuda_state, engine.device)
    return manifest


def read_full_state(directory: str | Path, kinds: tuple[str, ...] = ("param",)
                    ) -> tuple[Any, dict[str, torch.Tensor]]:
    """(ModelConfig, {name: full tensor}) of one kind, or {"kind/name": tensor} for several.

    No process group needed: this is how `paraxis generate`, `checkpoint convert` and the
    resharding tests see a checkpoint as one device would.
    """
    reader = CheckpointReader(directory)
    reader.check_complete()
    cfg = reader.model_config()
    out = {}
    for kind in kinds:
        if kind not in KINDS:
            raise ParaxisError(f"unknown state kind {kind!r}; known: {', '.join(KINDS)}")
        for name in reader.names(kind):
            out[name if len(kinds) == 1 else f"{kind}/{name}"] = reader.full(kind, name)
    return cfg, out
