"""fp32 master weights for 16-bit parameters (Micikevicius et al. 2018, sec. 3.1).

With a 16-bit policy (`paraxis.spec.precision`) the model's parameters are bf16/fp16 and AdamW
updates an fp32 copy of the part this rank owns: the whole of each unit under ZeRO-0, its
shard under ZeRO-1/2/3, so the copy and Adam's moments are sharded where ZeRO shards the
optimizer (2 + 2 + 12 bytes per parameter: ZeRO, Rajbhandari et al. 2020, sec. 3.1). Per step:

    load_grads(factor)   the reduced 16-bit gradients, cast to fp32 and unscaled/clipped there
                         (fp16's 1/S would underflow in fp16 itself)
    optimizer.step()     on the fp32 masters
    write_back()         the 16-bit parameters become the rounded masters

fp32 gradients (`bf16-fp32grad`) are the masters' gradients directly (views, no copy).
"""

from __future__ import annotations

import torch

from paraxis.engine.data_parallel.flat import FlatUnit, Piece


class MasterWeights:
    """One fp32 flat master per unit over `owned` (the 16-bit range this rank updates) and
    `grads` (its reduced gradients, the same range)."""

    def __init__(self, units: list[FlatUnit], owned: list[torch.Tensor],
                 grads: list[torch.Tensor], whole: bool) -> None:
        self.units = units
        self.owned = owned
        self.grads = grads
        self.whole = whole  # ZeRO-0: the whole unit, else this rank's shard of it
        self.masters = [torch.zeros(t.numel(), dtype=torch.float32, device=t.device)
                        for t in owned]
        # (unit index, the optimizer's master view, lo, hi in the unit's range)
        self.views: list[tuple[int, torch.Tensor, int, int]] = []

    def pieces(self, unit: FlatUnit) -> list[Piece]:
        return unit.whole_pieces() if self.whole else unit.pieces()

    def attach(self, optimizer_pieces: list[tuple[Piece, torch.Tensor]]) -> None:
        """Take the optimizer's master views (`zero.shard_optimizer`, made in this order)."""
        views = iter(view for _, view in optimizer_pieces)
        for index, unit in enumerate(self.units):
            for piece in self.pieces(unit):
                self.views.append((index, next(views), piece.shard_lo, piece.shard_hi))

    @torch.no_grad()
    def fill_from(self, values: dict[int, torch.Tensor]) -> None:
        """Set each master from the parameters' fp32 values (id(param) -> tensor), taken
        before the parameters were cast to 16 bits, and the parameters from the masters."""
        for unit, master in zip(self.units, self.masters, strict=True):
            for piece in self.pieces(unit):
                source = values[id(piece.param)].reshape(-1)[piece.lo:piece.hi]
                master[piece.shard_lo:piece.shard_hi].copy_(source)
        torch._foreach_copy_(self.owned, self.masters)

    @torch.no_grad()
    def load_grads(self, factor: float | torch.Tensor) -> None:
        """The masters' gradients: fp32 casts of the reduced gradients times `factor` (a
        number, or a 0-d tensor on the device: clipping decided there)."""
        scale = not (isinstance(factor, float) and factor == 1.0)
        flats = []
        for grads in self.grads:
            if grads.dtype == torch.float32:
                flats.append(grads.mul_(factor) if scale else grads)
            else:
                flats.append(grads.float().mul_(factor))
        for index, view, lo, hi in self.views:
            view.grad = flats[index][lo:hi]

    @torch.no_grad()
    def write_back(self) -> None:
        """16-bit parameters from the masters (round to nearest); drops the fp32 copies of
        16-bit gradients."""
        torch._foreach_copy_(self.owned, self.masters)
        for _, view, _, _ in self.views:
            view.grad = None
