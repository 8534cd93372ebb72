"""Measure activation memory: the bytes autograd holds for backward, live, at their peak.

    with SavedActivations(model.parameters()) as meter:
        engine.forward_backward(x, y)
    meter.peak_bytes

Every tensor autograd saves for backward passes through a `saved_tensors_hooks` pack hook;
the meter wraps it in a small holder and counts its bytes until the autograd graph drops the
holder (after that microbatch's backward). Weights are left out (they are not activations).
Activation checkpointing shows up directly: a checkpointed block keeps only its input.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable

import torch


class _Held:
    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


class SavedActivations:
    def __init__(self, parameters: Iterable[torch.Tensor] = ()) -> None:
        self._weights = {p.data_ptr() for p in parameters}
        self.live_bytes = 0
        self.peak_bytes = 0
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def _pack(self, tensor: torch.Tensor) -> object:
        if tensor.data_ptr() in self._weights:
            return tensor
        # detached: a saved output held as itself would keep its own graph alive through the
        # holder (tensor -> grad_fn -> saved variable -> holder -> tensor)
        held = _Held(tensor.detach())
        size = tensor.numel() * tensor.element_size()
        self.live_bytes += size
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        weakref.finalize(held, self._release, size)
        return held

    def _unpack(self, packed: object) -> torch.Tensor:
        return packed.tensor if isinstance(packed, _Held) else packed  # type: ignore[return-value]

    def _release(self, size: int) -> None:
        self.live_bytes -= size

    def __enter__(self) -> SavedActivations:
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._hooks.__exit__(*exc)
