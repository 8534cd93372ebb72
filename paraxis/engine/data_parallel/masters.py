"""fp32 master weights for 16-bit parameters (Micikevicius et al. 2018, sec. 3.1).

With a 16-bit policy (`paraxis.spec.precision`) the model's parameters are bf16/fp16 and AdamW
updates an fp32 copy of the part this rank owns: the whole of each unit under ZeRO-0, its
shard under ZeRO-1/2/3, so the copy and Adam's moments are sharded where ZeRO shards the
optimizer (2 + 2 + 12 bytes per parameter: ZeRO, Rajbhandari et al. 2020, sec. 3.1).

A step (`step`) is one pass over each unit (`kernels.master_adamw`): its 16-bit gradient (the
reducer's flat one, or where the gradients are the parameters' own, a parameter's alone in
its unit, or one flat copy of several),
its fp32 master and AdamW's moments in; master, moments and the 16-bit parameters out,
clipping and fp16's unscaling applied inside it (`grad_scale`: fp16's 1/S would underflow in
fp16 itself). AdamW's state stays torch's, a step count and two moments per piece, the moments
views of one flat pair per unit (`share_moments`): checkpoints, which read and fill them
in place, see the tensors they always did. fp32 gradients (`bf16-fp32grad`) are read as
they are.
"""

from __future__ import annotations

import torch

from paraxis.engine.data_parallel.flat import FlatUnit, Piece
from paraxis.kernels.master_adamw import master_adamw_
from paraxis.model.checkpoint.entries import step_count
from paraxis.spec.errors import ParaxisError
from paraxis.spec.precision import MASTER_UNITS_A_CALL


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
        # AdamW's moments, one flat pair per unit (`share_moments`), and the step's inputs
        # that live on the device (learning rate, 1, 0)
        self.exp_avgs: list[torch.Tensor] = []
        self.exp_avg_sqs: list[torch.Tensor] = []
        self._scalars: dict[str, torch.Tensor] = {}

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

    def share_moments(self, optimizer: torch.optim.Optimizer) -> None:
        """AdamW's moments as views of one flat pair per unit, so that a step runs
        `master_adamw_` on each unit's masters, moments, gradient and 16-bit parameters as
        flat tensors. `optimizer` is torch's AdamW made by `optimizer.adamw` (decoupled decay,
        neither amsgrad nor maximize; the decayed pieces of a unit lead it: `FlatUnit`).
        Call before `optimizer.init_adam_state`, which then leaves these states as they
        are."""
        if type(optimizer) is not torch.optim.AdamW or any(
                group["amsgrad"] or group["maximize"] for group in optimizer.param_groups):
            raise ParaxisError("fp32 master weights step torch's AdamW without amsgrad or "
                               "maximize (optimizer.adamw); use an fp32 precision for another")
        self.exp_avgs = [torch.zeros_like(master) for master in self.masters]
        self.exp_avg_sqs = [torch.zeros_like(master) for master in self.masters]
        steps = step_count(0, self.masters[0].device) if self.masters else None
        for index, view, lo, hi in self.views:
            optimizer.state[view].update(step=steps,
                                         exp_avg=self.exp_avgs[index][lo:hi],
                                         exp_avg_sq=self.exp_avg_sqs[index][lo:hi])

    @torch.no_grad()
    def step(self, optimizer: torch.optim.Optimizer, factor: float | torch.Tensor,
             nonfinite: torch.Tensor | None) -> None:
        """AdamW on the masters, one `master_adamw_` pass a unit (MASTER_UNITS_A_CALL units
        a call) from its gradient to its 16-bit parameters; the gradients are the reduced ones times
        `factor` (a number, or a 0-d tensor on the device: clipping decided there), and
        nothing changes where `nonfinite` (a 0-d bool tensor), step counts included."""
        if not self.views:  # nothing of a parameter in this rank's range, only padding
            return
        device = self.masters[0].device
        if not self._scalars:
            self._scalars = {name: torch.full((), value, device=device) for name, value in
                             (("lr", 0.0), ("one", 1.0), ("zero", 0.0))}
        lr = self._scalars["lr"]
        group = optimizer.param_groups[0]
        lr.fill_(group["lr"])  # in place: no copy from the host to wait for
        grad_scale = self._scalars["one"] if isinstance(factor, float) and factor == 1.0 \
            else (1.0 / torch.as_tensor(factor, dtype=torch.float32, device=device)).reshape(())
        found_inf = self._scalars["zero"] if nonfinite is None else nonfinite.float()
        steps = self._step_count(optimizer)
        steps.add_(self._scalars["one"] - found_inf)
        beta1, beta2 = group["betas"]
        decay = max(g["weight_decay"] for g in optimizer.param_groups)
        for start in range(0, len(self.units), MASTER_UNITS_A_CALL):
            # a call's units: the gradients gathered for them exist for this call alone
            call = range(start, min(start + MASTER_UNITS_A_CALL, len(self.units)))
            master_adamw_(*([each[i] for i in call] for each in (
                self.masters, self.exp_avgs, self.exp_avg_sqs, self.owned)),
                [self._own_grads(i) if self.grads[i] is None else self.grads[i] for i in call],
                [self._decayed(self.units[i]) for i in call], lr, beta1, beta2,
                group["eps"], decay, steps, grad_scale, found_inf)

    def _step_count(self, optimizer: torch.optim.Optimizer) -> torch.Tensor:
        """AdamW's step count, one tensor every piece's state holds (the count is one
        number for all: `checkpoint.entries.optimizer_steps`), so a step adds to it once
        rather than to a tensor a piece. Loading a checkpoint gives each piece a tensor of
        its own (`set_optimizer_steps`): they are shared again here."""
        count = optimizer.state[self.views[0][1]]["step"]
        if optimizer.state[self.views[-1][1]]["step"] is not count:  # each its own
            for _, view, _, _ in self.views:
                optimizer.state[view]["step"] = count
        return count

    def _decayed(self, unit: FlatUnit) -> int:
        """How many of the elements this rank owns of `unit` are weight-decayed: the
        unit's leading `decayed`, cut to this rank's range."""
        if self.whole:
            return unit.decayed
        return min(max(unit.decayed - unit.shard_start, 0), unit.shard_numel)

    def _own_grads(self, index: int) -> torch.Tensor:
        """Unit `index`'s parameters' own gradients as one flat tensor: a parameter alone in
        its unit (one larger than a gradient bucket, `buckets.make_buckets`) gives its own,
        viewed flat; several are gathered (`_gathered_grads`)."""
        unit = self.units[index]
        grad = unit.params[0].grad if len(unit.params) == 1 else None
        if grad is not None and grad.is_contiguous() and \
                grad.numel() == self.owned[index].numel():
            return grad.view(-1)
        return self._gathered_grads(index)

    def _gathered_grads(self, index: int) -> torch.Tensor:
        """Unit `index`'s parameters' own gradients in one flat tensor (zeros for a
        parameter that got none), laid out as the unit's flat parameters, then zeros to
        the owned length: one concatenation in the gradients' own dtype, a kernel or two on
        a GPU whatever the parameter count (across dtypes `torch.cat` runs one copy a
        tensor there), flattened in C++ rather than viewed tensor by tensor here."""
        unit, owned = self.units[index], self.owned[index]
        grads = [param.grad if param.grad is not None
                 else torch.zeros_like(param, dtype=owned.dtype) for param in unit.params]
        if owned.numel() > unit.numel:
            grads.append(owned.new_zeros(owned.numel() - unit.numel))
        return torch._C._nn.flatten_dense_tensors(grads)
