"""Filling a rank's entries from a source of full tensors, reading only what the rank owns.

    fill_entries(engine, source, kinds=("param",), what="initial weights")

An `Entry` (checkpoint/entries.py) is a piece of one full single-device tensor: TP slice
`tp_index` of `tp_count` along `tp_dim`, then the flat range [lo, hi) of that slice. A
*source* answers for one entry with exactly that piece. Three kinds exist:

- `FullSource`: a function of the name that makes the whole tensor (initial weights are drawn
  whole, so that every layout starts from the single-device values bit for bit); the piece
  is cut out of it, and one full tensor is alive at a time.
- `RegionSource`: a reader of rectangular regions of a full tensor on disk (a Hugging Face
  safetensors file, through `get_slice`): the piece is read from the smallest block of rows
  that holds it (`entry_region`), never the whole tensor unless the rank owns it whole.
- `checkpoint.load.CheckpointReader`: the saved pieces that cover the entry.

A rank's memory while filling is therefore its own share plus one full tensor at most (a
`FullSource`) or one block of rows (a region read).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

import torch

from paraxis.model.checkpoint.entries import Checkpointable, Entry
from paraxis.spec.errors import ParaxisError


class PieceSource(Protocol):
    def full_shape(self, kind: str, name: str) -> tuple[int, ...] | None:
        """The shape of the whole single-device tensor `kind/name` (None: not held)."""
        ...

    def piece(self, entry: Entry) -> torch.Tensor:
        """The entry's piece of its full tensor, flat (hi - lo elements)."""
        ...


def rows_holding(lo: int, hi: int, row: int) -> tuple[int, int]:
    """The rows [first, last) of a tensor flattened row by row (`row` elements each) that
    hold its elements [lo, hi)."""
    return lo // row, -(-hi // row)


def entry_region(entry: Entry) -> tuple[tuple[slice, ...], int, int]:
    """(index, start, stop): `full[index].reshape(-1)[start:stop]` is the entry's piece, and
    `full[index]` is the smallest block of whole rows (first dimension) of its TP slice that
    holds it. Flattening a TP slice row by row is what the flat range [lo, hi) counts in."""
    shape = entry.full_shape
    local = list(shape)
    offset = [0] * len(shape)
    if entry.tp_count > 1:
        local[entry.tp_dim] //= entry.tp_count
        offset[entry.tp_dim] = entry.tp_index * local[entry.tp_dim]
    row = math.prod(local[1:])  # elements in one row of the TP slice (1 for a vector)
    first, last = rows_holding(entry.lo, entry.hi, row)
    index = [slice(offset[d], offset[d] + local[d]) for d in range(len(shape))]
    index[0] = slice(offset[0] + first, offset[0] + last)
    return tuple(index), entry.lo - first * row, entry.hi - first * row


def cut(full: torch.Tensor, entry: Entry) -> torch.Tensor:
    """The entry's piece of `full`, flat."""
    index, start, stop = entry_region(entry)
    return full[index].reshape(-1)[start:stop]


class FullSource:
    """Pieces cut from whole tensors made by `full_of(kind, name)`, one alive at a time."""

    def __init__(self, full_of: Callable[[str, str], torch.Tensor],
                 shapes: dict[str, tuple[int, ...]]) -> None:
        self.full_of = full_of
        self.shapes = shapes
        self._cached: tuple[tuple[str, str], torch.Tensor] | None = None

    def full_shape(self, kind: str, name: str) -> tuple[int, ...] | None:
        return self.shapes.get(name)

    def piece(self, entry: Entry) -> torch.Tensor:
        key = (entry.kind, entry.name)
        if self._cached is None or self._cached[0] != key:
            self._cached = None  # drop the last one before making the next
            self._cached = (key, self.full_of(*key))
        return cut(self._cached[1], entry)


class RegionSource:
    """Pieces read as regions of full tensors: `region(name, index)` is `full[index]`."""

    def __init__(self, region: Callable[[str, tuple[slice, ...]], torch.Tensor],
                 shapes: dict[str, tuple[int, ...]]) -> None:
        self.region = region
        self.shapes = shapes

    def full_shape(self, kind: str, name: str) -> tuple[int, ...] | None:
        return self.shapes.get(name)

    def piece(self, entry: Entry) -> torch.Tensor:
        index, start, stop = entry_region(entry)
        return self.region(entry.name, index).reshape(-1)[start:stop]


def fill_entries(engine: Checkpointable, source: PieceSource, kinds: tuple[str, ...],
                 what: str) -> None:
    """Write into each of the engine's entries of `kinds` its piece from `source`: the one
    place a layout takes its share (initial weights, imported weights, a checkpoint)."""
    with torch.no_grad():
        for entry in engine.checkpoint_entries():
            if entry.kind not in kinds:
                continue  # e.g. imported weights: AdamW starts fresh (zero moments, step 0)
            shape = source.full_shape(entry.kind, entry.name)
            if shape is None:
                raise ParaxisError(f"{what} has no {entry.kind} for {entry.name}; it was made "
                                   "for a different model")
            if tuple(shape) != entry.full_shape:
                raise ParaxisError(f"{what}: {entry.name} has shape {shape}, the model "
                                   f"expects {entry.full_shape}")
            piece = source.piece(entry)
            entry.tensor.copy_(piece.view(entry.tensor.shape))
