"""Loading a checkpoint into any layout, and reading it as plain full tensors.

    step = load_checkpoint(engine, directory, model)   # on every rank; any layout
    model_cfg, params = read_full_state(directory)      # one process, no process group

Each rank walks its own entries (`Engine.checkpoint_entries`) and, for each, rebuilds the full
single-device tensor from whichever saved pieces cover it, then cuts its own piece out. The
writer's layout never matters, which is what resharding means. Files are opened with
safetensors (no pickle, so loading never runs code) after their SHA-256 matches the
manifest, so a truncated or corrupted shard is named rather than half-loaded.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from paraxis.checkpoint.entries import KINDS, set_optimizer_steps
from paraxis.checkpoint.manifest import (
    check_model,
    read_manifest,
    resolve,
    safe_member,
    sha256_of,
)
from paraxis.errors import ParaxisError

if TYPE_CHECKING:
    from paraxis.runtime.engine import Engine


class CheckpointReader:
    """Full tensors out of a checkpoint's pieces, verifying each file before first use."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = resolve(directory)  # a step-N dir, or the newest under a parent
        self.manifest = read_manifest(self.directory)
        self.pieces: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        for piece in self.manifest.get("pieces", []):
            self.pieces[(piece["kind"], piece["name"])].append(piece)
        self._open: dict[str, Any] = {}

    def names(self, kind: str = "param") -> list[str]:
        return sorted(name for k, name in self.pieces if k == kind)

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
            values = self._tensor(piece)
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

    def rank_tensor(self, rank_file: str, key: str) -> torch.Tensor | None:
        handle = self._handle(rank_file)
        return handle.get_tensor(key) if key in handle.keys() else None

    def _tensor(self, piece: dict[str, Any]) -> torch.Tensor:
        handle = self._handle(piece["file"])
        try:
            return handle.get_tensor(piece["key"])
        except Exception as error:  # noqa: BLE001 - safetensors raises several kinds
            raise ParaxisError(f"{self.directory / piece['file']}: cannot read "
                               f"{piece['key']} ({error})") from None

    def _handle(self, name: str) -> Any:  # a safetensors file handle
        if name not in self._open:
            from safetensors import safe_open

            path = safe_member(self.directory, name)
            expected = self.manifest.get("files", {}).get(name)
            if expected is None:
                raise ParaxisError(f"{path} is not listed in the manifest's files")
            if not path.is_file():
                raise ParaxisError(f"{path} is missing; the checkpoint is incomplete, use an "
                                   "earlier one")
            if path.stat().st_size != expected["bytes"] or sha256_of(path) != expected["sha256"]:
                raise ParaxisError(f"{path} is corrupt or truncated (checksum differs from "
                                   "the manifest); use an earlier checkpoint")
            try:
                self._open[name] = safe_open(str(path), framework="pt", device="cpu")
            except Exception as error:  # noqa: BLE001
                raise ParaxisError(f"{path} is not a safetensors file ({error})") from None
        return self._open[name]


def load_checkpoint(engine: Engine, directory: str | Path, model: dict[str, Any],
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
    check_model(manifest, model, reader.directory)
    with_optimizer = manifest.get("has_optimizer", False) and not weights_only
    fill_entries(engine, reader.full, KINDS if with_optimizer else ("param",),
                 str(reader.directory))
    if with_optimizer:
        set_optimizer_steps(engine.optimizer, manifest.get("optimizer_steps", 0))
        scaler = engine.loss_scaler
        if scaler is not None and manifest.get("loss_scaler"):
            scaler.load_state_dict(manifest["loss_scaler"])
    same_layout = manifest.get("layout") == str(engine.layout)
    if restore_rng and same_layout and not weights_only:
        from paraxis.checkpoint.save import rank_file

        state = reader.rank_tensor(rank_file(rank), "rng/torch")
        if state is not None:
            torch.set_rng_state(state)
        if engine.device.type == "cuda":
            cuda_state = reader.rank_tensor(rank_file(rank), "rng/cuda")
            if cuda_state is not None:
                torch.cuda.set_rng_state(cuda_state, engine.device)
    return manifest


def fill_entries(engine: Engine, full_of: Callable[[str, str], torch.Tensor],
                 kinds: tuple[str, ...], source: str) -> None:
    """Write into each of the engine's entries of `kinds` its piece of `full_of(kind, name)`
    (the whole single-device tensor): the one place a layout cuts its share out."""
    cache: dict[tuple[str, str], torch.Tensor] = {}
    with torch.no_grad():
        for entry in engine.checkpoint_entries():
            if entry.kind not in kinds:
                continue  # e.g. imported weights: AdamW starts fresh (zero moments, step 0)
            key = (entry.kind, entry.name)
            if key not in cache:
                cache.clear()  # one full tensor at a time keeps memory to a layer's worth
                cache[key] = full_of(*key)
            full = cache[key]
            if tuple(full.shape) != entry.full_shape:
                raise ParaxisError(f"{source}: {entry.name} has shape {tuple(full.shape)}, "
                                   f"the model expects {entry.full_shape}")
            local = full.chunk(entry.tp_count, dim=entry.tp_dim)[entry.tp_index] \
                if entry.tp_count > 1 else full
            piece = local.reshape(-1)[entry.lo:entry.hi]
            entry.tensor.copy_(piece.view(entry.tensor.shape))


def read_full_state(directory: str | Path, kinds: tuple[str, ...] = ("param",)
                    ) -> tuple[Any, dict[str, torch.Tensor]]:
    """(ModelConfig, {name: full tensor}) of one kind, or {"kind/name": tensor} for several.

    No process group needed: this is how `paraxis generate`, `checkpoint convert` and the
    resharding tests see a checkpoint as one device would.
    """
    from paraxis.model_config import ModelConfig

    reader = CheckpointReader(directory)
    cfg = ModelConfig.from_dict(reader.manifest["model"], source=str(reader.directory))
    out = {}
    for kind in kinds:
        if kind not in KINDS:
            raise ParaxisError(f"unknown state kind {kind!r}; known: {', '.join(KINDS)}")
        for name in reader.names(kind):
            out[name if len(kinds) == 1 else f"{kind}/{name}"] = reader.full(kind, name)
    return cfg, out
