"""fp32 master weights for 16-bit parameters (Micikevicius et al. 2018, sec. 3.1).

With a 16-bit policy (`paraxis.spec.precision`) the model's parameters are bf16/fp16 and AdamW
updates an fp32 copy of the part this rank owns: the whole of each unit under ZeRO-0, its
shard under ZeRO-1/2/3, so the copy and Adam's moments are sharded where ZeRO shards the
optimizer (2 + 2 + 12 bytes per parameter: ZeRO, Rajbhandari et al. 2020, sec. 3.1). A step
(`step`), over batches of units of at most MASTER_STEP_ELEMENTS elements each:

    _flat_grads(batch)   the batch's reduced 16-bit gradients cast to fp32
    AdamW                torch's fused kernel on the batch's fp32 masters, handed those
                         gradients (`contract.fused_adamw_group`: no `.grad` set per
                         master), unscaled and clipped inside it (its `grad_scale`; fp16's
                         1/S would underflow in fp16 itself)
    drop the fp32 copies

and then `write_back`: the 16-bit parameters become the rounded masters. (An optimizer that
is not torch's fused AdamW reads the gradients as the masters' `.grad`, set by `load_grads`,
in its `step()`.) The batches bound the fp32 copies to MASTER_STEP_ELEMENTS x 4 bytes (or one
larger unit's) instead of 4 bytes for every parameter at once, which would be the step's
peak of memory; a model of 2^28 parameters or fewer steps in one batch.

fp32 gradients (`bf16-fp32grad`) are the masters' gradients directly (views, no copy).
"""

from __future__ import annotations

import torch

from paraxis.engine.contract import (
    fused_adamw_group,
    step_unless_nonfinite,
    takes_gradients_given,
)
from paraxis.engine.data_parallel.flat import FlatUnit, Piece
from paraxis.spec.precision import MASTER_STEP_ELEMENTS


class MasterWeights:
    """One fp32 flat master per unit over `owned` (the 16-bit range this rank updates) and
    `grads` (its reduced gradients, the same range)."""

    def __init__(self, units: list[FlatUnit], owned: list[torch.Tensor],
                 grads: list[torch.Tensor | None], whole: bool) -> None:
        self.units = units
        self.owned = owned
        self.grads = grads  # None: no flat gradient, the parameters' own (`GradReducer.local`)
        self.whole = whole  # ZeRO-0: the whole unit, else this rank's shard of it
        self.masters = [torch.zeros(t.numel(), dtype=torch.float32, device=t.device)
                        for t in owned]
        # (unit index, the optimizer's master view, lo, hi in the unit's range)
        self.views: list[tuple[int, torch.Tensor, int, int]] = []
        self._members_of: dict[tuple[int, ...], list] = {}  # `_members`'s, by batch
        self._sizes_of: dict[int, list[int]] = {}  # `_span_sizes`'s, by unit
        self._cuts_of: dict[int, tuple[list[int], list[int]]] = {}  # `_piece_grads`'s

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

    def batches(self) -> list[list[int]]:
        """Consecutive units, each run of them at most MASTER_STEP_ELEMENTS elements (a
        larger unit alone): what one optimizer call steps."""
        batches: list[list[int]] = []
        size = 0
        for index, owned in enumerate(self.owned):
            if batches and size + owned.numel() <= MASTER_STEP_ELEMENTS:
                batches[-1].append(index)
                size += owned.numel()
            else:
                batches.append([index])
                size = owned.numel()
        return batches

    @torch.no_grad()
    def step(self, optimizer: torch.optim.Optimizer, factor: float | torch.Tensor,
             nonfinite: torch.Tensor | None) -> None:
        """AdamW on the masters, a batch of units at a time; their gradients are the
        reduced ones times `factor` (a number, or a 0-d tensor on the device: clipping
        decided there), skipped where `nonfinite` (`contract.step_unless_nonfinite`)."""
        scale = not (isinstance(factor, float) and factor == 1.0)
        if takes_gradients_given(optimizer):
            self._step_fused(optimizer, factor if scale else None, nonfinite)
            return
        fused = bool(optimizer.defaults.get("fused"))
        if scale and fused:  # the fused kernel divides each gradient by grad_scale
            device = self.masters[0].device if self.masters else None
            optimizer.grad_scale = (1.0 / torch.as_tensor(factor, dtype=torch.float32,
                                                          device=device)).reshape(())
        try:
            for batch in self.batches():
                self.load_grads(batch, factor if scale and not fused else 1.0)
                step_unless_nonfinite(optimizer, nonfinite)
                self.drop_grads(batch)
        finally:
            if scale and fused:
                del optimizer.grad_scale
        self.write_back()

    def _step_fused(self, optimizer: torch.optim.Optimizer, factor: float | torch.Tensor | None,
                    nonfinite: torch.Tensor | None) -> None:
        """`step` with torch's fused AdamW, each batch's fp32 gradients handed to the kernel
        (`fused_adamw_group`) instead of set as the masters' `.grad`."""
        device = self.masters[0].device if self.masters else None
        grad_scale = None if factor is None else (1.0 / torch.as_tensor(
            factor, dtype=torch.float32, device=device)).reshape(())
        found_inf = None if nonfinite is None else nonfinite.float()
        for batch in self.batches():
            grads = self._piece_grads(self._flat_grads(batch, 1.0))
            for group, members in self._members(optimizer, tuple(batch)):
                fused_adamw_group(optimizer, group, [view for _, view, _, _ in members],
                                  [grads[index][lo] for index, _, lo, _ in members],
                                  grad_scale, found_inf)
            del grads
        self.write_back()

    def _piece_grads(self, flats: dict[int, torch.Tensor]) -> dict[int, dict[int, torch.Tensor]]:
        """Unit index -> {a master view's lo: its gradient}, each unit's flat gradient cut
        into its pieces by one split (the pieces of a unit are consecutive from 0)."""
        if not self._cuts_of:
            for index, _, lo, hi in self.views:
                los, sizes = self._cuts_of.setdefault(index, ([], []))
                if lo != sum(sizes):
                    raise AssertionError(f"unit {index}: pieces not consecutive at {lo}")
                los.append(lo)
                sizes.append(hi - lo)
        out = {}
        for index, flat in flats.items():
            los, sizes = self._cuts_of[index]
            out[index] = dict(zip(los, flat.split([*sizes, flat.numel() - sum(sizes)]),
                                  strict=False))
        return out

    def _members(self, optimizer: torch.optim.Optimizer, batch: tuple[int, ...]
                 ) -> list[tuple[dict, list[tuple[int, torch.Tensor, int, int]]]]:
        """The batch's master views by the optimizer's param group, in `views` order: worked
        out at the first step and kept (the groups and views never change)."""
        if batch not in self._members_of:
            group_of = {id(view): group for group in optimizer.param_groups
                        for view in group["params"]}
            members: dict[int, list[tuple[int, torch.Tensor, int, int]]] = {}
            wanted = set(batch)
            for index, view, lo, hi in self.views:
                if index in wanted:
                    members.setdefault(id(group_of[id(view)]), []).append((index, view, lo, hi))
            self._members_of[batch] = [(group, members[id(group)])
                                       for group in optimizer.param_groups
                                       if id(group) in members]
        return self._members_of[batch]

    def _flat_grads(self, units: list[int], factor: float | torch.Tensor
                    ) -> dict[int, torch.Tensor]:
        """Unit index -> its fp32 flat gradient: a cast of the reduced one, times `factor`
        (1.0: as it is)."""
        flats = {}
        for index in units:
            grads = self.grads[index]
            if grads is None:
                flat = self._gathered_grads(index)
            else:
                flat = grads if grads.dtype == torch.float32 else grads.float()
            flats[index] = flat if isinstance(factor, float) and factor == 1.0 \
                else flat.mul_(factor)
        return flats

    def load_grads(self, units: list[int], factor: float | torch.Tensor) -> None:
        """These units' masters' gradients: fp32 casts of their reduced gradients, times
        `factor` (1.0: as they are)."""
        wanted = set(units)
        flats = self._flat_grads(units, factor)
        for index, view, lo, hi in self.views:
            if index in wanted:
                view.grad = flats[index][lo:hi]

    def _gathered_grads(self, index: int) -> torch.Tensor:
        """Unit `index`'s parameters' own gradients in one fp32 flat tensor (zeros for a
        parameter that got none), laid out as the unit's flat parameters. One multi-tensor
        copy casts them all into place: `torch.cat` into an fp32 output from 16-bit inputs
        would copy them one kernel each on a GPU (its batched kernel wants one dtype), a
        launch per parameter in every step."""
        unit = self.units[index]
        flat = torch.empty(self.owned[index].numel(), dtype=torch.float32,
                           device=self.owned[index].device)
        spans = flat.split(self._span_sizes(index))  # each parameter's, then the padding
        into, grads = [], []
        for param, span in zip(unit.params, spans, strict=False):
            if param.grad is None:
                span.zero_()
            else:
                into.append(span)
                grads.append(param.grad.view(-1))
        spans[-1].zero_()
        if into:
            torch._foreach_copy_(into, grads)
        return flat

    def _span_sizes(self, index: int) -> list[int]:
        """The sizes that split unit `index`'s flat range into its parameters and the
        padding after them (kept: the units never change)."""
        if index not in self._sizes_of:
            unit = self.units[index]
            sizes = [p.numel() for p in unit.params]
            self._sizes_of[index] = [*sizes, self.owned[index].numel() - sum(sizes)]
        return self._sizes_of[index]

    def drop_grads(self, units: list[int]) -> None:
        wanted = set(units)
        for index, view, _, _ in self.views:
            if index in wanted:
                view.grad = None

    @torch.no_grad()
    def write_back(self) -> None:
        """16-bit parameters from the masters (round to nearest)."""
        torch._foreach_copy_(self.owned, self.masters)
