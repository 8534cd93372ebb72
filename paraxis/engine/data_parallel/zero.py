"""ZeRO's sharded states (Rajbhandari et al., "ZeRO", SC 2020, sec. 5).

- `shard_optimizer` (ZeRO-1/2/3, sec. 5.1): AdamW sees only this rank's shard of every unit,
  as views into the flat parameter storage and the gradient shard, so Adam's moments exist for
  1/N_d of the parameters and the update writes straight into the parameters.
- `ParamGatherer` (ZeRO-3, sec. 5.3): each unit (the embedding, each transformer block, the
  final norm, the LM head; or one root unit for a tied embedding and head) keeps only its
  parameter shard. Its full parameters are all-gathered just before its forward, freed after
  it, gathered again when the gradient reaches the unit's output (the start of its backward;
  never for the embedding, whose backward needs only the token ids) and freed once all its
  gradients exist. While one block computes, the next one's all-gather is already in flight
  (forward: block i+1, backward: block i-1), as FSDP does (Zhao et al., "PyTorch FSDP", VLDB 2023,
  sec. 3.3 "backward/forward prefetching").

Freeing is done by resizing the flat buffer's storage to zero bytes, the way FSDP1 did: the
parameters stay views of that storage (autograd's saved views included) and see the values
again once the storage is refilled by the next all-gather.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from paraxis.dist.watchdog import WATCH
from paraxis.engine.data_parallel.flat import FlatUnit, Piece, all_gather, group_rank, group_size
from paraxis.engine.data_parallel.fp8_gather import (
    Fp8Weights,
    attach,
    cast_shard,
    describe,
    detach,
    fp8_gemms,
)
from paraxis.engine.optimizer import adamw, decays
from paraxis.model.transformer import Transformer
from paraxis.spec.errors import ParaxisError
from paraxis.spec.optimizer import AdamW
from paraxis.spec.precision import fp8_weights_regathered


def shard_optimizer(units: list[FlatUnit], hyper: AdamW,
                    masters: list[torch.Tensor] | None = None, whole: bool = False
                    ) -> tuple[torch.optim.AdamW, list[tuple[Piece, torch.Tensor]]]:
    """AdamW over this rank's shard; returns it and the (piece, master view) pairs.

    Each unit needs `param_shard` and `grad_shard` (flat, this rank's range). Decay applies to
    pieces of matrices only, the convention of `make_adamw`. masters: one fp32 flat tensor
    per unit that AdamW updates instead of the (16-bit) parameters, over the shard, or over
    the whole unit when `whole` (ZeRO-0); their gradients are set per step where the
    gradient dtype differs or no flat gradient exists (`data_parallel.masters`).
    """
    decay, no_decay, pieces = [], [], []
    for index, unit in enumerate(units):
        for piece in unit.whole_pieces() if whole else unit.pieces():
            owned = unit.param_shard if masters is None else masters[index]
            grads = unit.grad_full if whole else unit.grad_shard
            master = owned[piece.shard_lo: piece.shard_hi]
            if grads is not None and grads.dtype == master.dtype:
                master.grad = grads[piece.shard_lo: piece.shard_hi]
            (decay if decays(piece.param) else no_decay).append(master)
            pieces.append((piece, master))
    optimizer = adamw(decay, no_decay, hyper)
    return optimizer, pieces


def flatten_params_into(unit: FlatUnit, buffer: torch.Tensor) -> None:
    """Copy the unit's parameters into `buffer` and make each parameter a view of it. A
    parameter on the meta device has no values to copy: its view of the buffer is all the
    storage it ever gets (no allocation of its own), filled later by name
    (`runtime.parallelize.materialize`)."""
    with torch.no_grad():
        for p, start, end in unit.spans():
            view = buffer[start:end].view(p.shape)
            if p.is_meta:
                give_storage(p, buffer.device, empty=True)  # off the meta device, 0 bytes
            else:
                view.copy_(p.detach())
            # .data assignment keeps the Parameter object (optimizer, hooks and tied modules
            # keep referring to it) and its own version counter (an all-gather into the
            # buffer must not look like an in-place change of every parameter in it).
            p.data = view


def give_buffers_storage(model: nn.Module, device: torch.device) -> None:
    """Zeros on `device` for the meta buffers of `model` (an MoE block's routing bias), to
    be filled like the parameters: with their initial value, or a checkpoint's."""
    if device.type == "meta":
        return
    for module in model.modules():
        for key, buffer in module._buffers.items():
            if buffer is not None and buffer.is_meta:
                module._buffers[key] = torch.zeros(buffer.shape, dtype=buffer.dtype,
                                                   device=device)


def give_storage(param: nn.Parameter, device: torch.device, empty: bool = False) -> None:
    """Move meta `param` to `device` with uninitialised storage of its own (no values read),
    or with `empty` none at all (zero elements, to be pointed at a buffer with `.data`).
    `.data` cannot move a tensor off the meta device, so the contents are swapped: the
    Parameter object stays (tied modules keep sharing it) and keeps its roles (tp_sharded,
    pp_duplicate)."""
    if device.type == "meta":
        return
    values = torch.empty(0, dtype=param.dtype, device=device) if empty else \
        torch.empty_like(param, device=device)
    new = nn.Parameter(values, requires_grad=param.requires_grad)
    new.__dict__.update(param.__dict__)
    torch.utils.swap_tensors(param, new)


@dataclass
class UnitHooks:
    """Where a ZeRO-3 unit's life cycle is driven from: `enter` runs first in its forward,
    `leave` last. `backward_needs_weights`: whether its backward reads the full parameters
    (an embedding's backward needs only the token ids, so its weights are not gathered
    again)."""

    enter: nn.Module
    leave: nn.Module
    backward_needs_weights: bool = True


class ParamGatherer:
    """ZeRO-3 parameter life cycle. `units[:len(hooks)]` run in forward order (embedding,
    blocks, head), each gathered and freed from its `UnitHooks`; one more unit after them,
    the root, holds what is used at both ends of a microbatch (a tied embedding/head) and is
    gathered when `model`'s forward starts and freed once its gradients are complete (or when
    the step ends, after a forward without backward)."""

    def __init__(self, units: list[FlatUnit], hooks: list[UnitHooks], model: nn.Module,
                 group: dist.ProcessGroup | None) -> None:
        self.units = units
        self.hooks = hooks
        self.group = group
        self.root_index = len(hooks) if len(units) > len(hooks) else None
        self.phase = "forward"
        # Under a pipeline (`pipeline_parallel/zero3.py`): the model chunk of each unit, so
        # prefetch never reaches into another chunk (whose turn may be far off), and `keep`,
        # set while a schedule keeps its chunks gathered across microbatches (no freeing here).
        self.chunk_of = [0] * len(units)
        self.keep = False
        self._state = ["free"] * len(units)
        self._work: list[object | None] = [None] * len(units)
        # FP8 units (`fp8_gather`): their gathered FP8 copy and scales while gathered
        self._fp8: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for unit in units:
            full = torch.empty(unit.padded_numel, dtype=unit.dtype, device=unit.device)
            full[unit.numel:].zero_()
            flatten_params_into(unit, full)
            unit.param_full = full
            unit.param_shard = unit.shard_of(full).clone()
            self._release(unit)
        model.register_forward_pre_hook(self._model_pre_forward)
        for index, hook in enumerate(hooks):
            hook.enter.register_forward_pre_hook(self._pre_forward(index))
            hook.leave.register_forward_hook(self._post_forward(index, index == len(hooks) - 1))

    # ----------------------------------------------------------------- storage moves

    @staticmethod
    def _release(unit: FlatUnit) -> None:
        unit.param_full.untyped_storage().resize_(0)

    def prefetch(self, index: int) -> None:
        """Start the all-gather of unit `index` if it is not gathered or on its way (an
        FP8 unit's in FP8, into a fresh buffer: `fp8_gather`)."""
        if not 0 <= index < len(self.units) or self._state[index] != "free":
            return
        unit = self.units[index]
        weights: Fp8Weights | None = getattr(unit, "fp8", None)
        if weights is not None:
            shard8, scales = cast_shard(unit, weights)
            full8 = torch.empty(unit.padded_numel, dtype=torch.uint8, device=unit.device)
            self._work[index] = all_gather(full8, shard8.view(torch.uint8), unit.group)
            self._fp8[index] = (full8, scales)
        else:
            unit.param_full.untyped_storage().resize_(unit.padded_numel *
                                                      unit.param_full.element_size())
            self._work[index] = all_gather(unit.param_full, unit.param_shard, unit.group)
        self._state[index] = "pending"

    def gather(self, index: int) -> None:
        self.prefetch(index)
        if self._state[index] == "pending":
            with WATCH.waiting("all_gather", self.units[index].group):
                self._work[index].wait()
            self._work[index] = None
            self._state[index] = "ready"
            if index in self._fp8:
                full8, scales = self._fp8[index]
                attach(full8.view(torch.float8_e4m3fn), scales, self.units[index].fp8)

    def free(self, index: int) -> None:
        """Unit `index`'s gathered parameters go (an FP8 copy stays where autograd keeps
        it for backward)."""
        if self._state[index] == "pending":  # never leave a collective half-way
            self.gather(index)
        if self._state[index] == "ready":
            if self._fp8.pop(index, None) is not None:
                detach(self.units[index].fp8)
            else:
                self._release(self.units[index])
            self._state[index] = "free"

    def free_all(self) -> None:
        for index in range(len(self.units)):
            self.free(index)

    # ------------------------------------------------------------------------ hooks

    def _model_pre_forward(self, module: nn.Module, args: object) -> None:
        self.phase = "forward"
        if self.root_index is not None:
            self.gather(self.root_index)
        self.prefetch(0)

    def _pre_forward(self, index: int) -> Callable[[nn.Module, object], None]:
        def hook(module: nn.Module, args: object) -> None:
            self.gather(index)
            if self.phase == "forward" and self._same_chunk(index, index + 1):
                self.prefetch(index + 1)
        return hook

    def _post_forward(self, index: int, is_last: bool
                      ) -> Callable[[nn.Module, object, torch.Tensor], None]:
        def hook(module: nn.Module, args: object, output: torch.Tensor) -> None:
            if self.phase != "forward":
                return
            if (torch.is_grad_enabled() and output.requires_grad
                    and self.hooks[index].backward_needs_weights):
                output.register_hook(self._pre_backward(index))
            # The last unit's backward comes first: keep it rather than gather it again.
            if not (is_last and torch.is_grad_enabled()) and not self.keep:
                self.free(index)
        return hook

    def _pre_backward(self, index: int) -> Callable[[torch.Tensor], None]:
        def hook(grad: torch.Tensor) -> None:
            self.phase = "backward"
            self.gather(index)
            # the next unit backward needs: one before this, past a block's FP8 unit
            before = index - 1
            if before >= 1 and not self.hooks[before].backward_needs_weights \
                    and getattr(self.units[before], "fp8", None) is not None:
                before -= 1
            if self._same_chunk(index, before) and self.hooks[before].backward_needs_weights:
                self.prefetch(before)
        return hook

    def _same_chunk(self, index: int, other: int) -> bool:
        return 0 <= other < len(self.hooks) and self.chunk_of[other] == self.chunk_of[index]

    def on_unit_backward_done(self, index: int) -> None:
        """All of the unit's gradients exist: its full parameters are no longer needed
        (unless a pipeline keeps them for its next microbatch)."""
        if not self.keep:
            self.free(index)

    @torch.no_grad()
    def full_flat(self, index: int) -> torch.Tensor:
        """A fresh copy of unit `index`'s full flat parameters (collective over the group)."""
        unit = self.units[index]
        full = torch.empty(unit.padded_numel, dtype=unit.dtype, device=unit.device)
        with WATCH.waiting("all_gather", unit.group):
            all_gather(full, unit.param_shard, unit.group).wait()
        return full


def zero3_units(model: nn.Module, params: list[nn.Parameter],
                group: dist.ProcessGroup | None, device: torch.device,
                expert_group: dist.ProcessGroup | None = None, fp8_gather: bool = False,
                recompute: str = "none") -> tuple[list[FlatUnit], list[UnitHooks]]:
    """ZeRO-3 units in forward order (embedding, one per block, final norm, LM head; chunk
    after chunk under a pipeline) and their hooks, then a root unit for whatever is left
    (used at both ends of the step: a tied embedding and head).
    A block whose experts are split over ep (`ep_sharded`) has a second unit right after its
    own, its experts, sharded over `expert_group` (the ranks holding the same experts) and
    gathered from the first local expert's forward to the last's.
    fp8_gather: a block's FP8 weights come first, as a unit of their own that travels in FP8
    and backward does not gather again (`fp8_gather`), unless full recompute (`recompute`)
    runs the block's forward again there (under the block method, the blocks it checkpoints:
    `Transformer.set_recompute` marks them before ZeRO takes the parameters)."""
    wanted = {id(p) for p in params}
    taken: set[int] = set()
    units: list[FlatUnit] = []
    hooks: list[UnitHooks] = []

    def add(modules: list[nn.Module], hook: UnitHooks, experts: bool = False,
            own: list[nn.Parameter] | None = None) -> None:
        own = own or [p for m in modules for p in m.parameters() if id(p) in wanted
                      and id(p) not in taken and getattr(p, "ep_sharded", False) == experts]
        if not own:
            raise ParaxisError("ZeRO-3 shards per block, but a block holds no trainable "
                               "parameters of its own; use zero<=2 for this model")
        taken.update(id(p) for p in own)
        over = expert_group if experts else group
        units.append(FlatUnit(own, group_size(over), group_rank(over), device, over))
        hooks.append(hook)

    for part in [m for m in (model, *model.children()) if isinstance(m, Transformer)]:
        tied = part.cfg.tied_embeddings and part.has_embedding and part.has_head
        embed = [part.tok_emb] + ([part.pos_emb] if hasattr(part, "pos_emb") else []) \
            if part.has_embedding else []
        if embed and not tied:
            add(embed, UnitHooks(embed[0], embed[-1], backward_needs_weights=False))
        for block in part.blocks:
            # GEMMs whose weights are all trainable and not yet in a unit
            gemms = [gemm for gemm in (fp8_gemms(block) if fp8_gather else [])
                     if all(id(layer.weight) in wanted and id(layer.weight) not in taken
                            for layer in gemm)]
            if gemms:
                # its forward runs again in backward: checkpointed alone or in a group
                reruns = block.recompute or part.recompute_group > 1
                add([block], UnitHooks(block, block, fp8_weights_regathered(recompute, reruns)),
                    own=[layer.weight for gemm in gemms for layer in gemm])
                units[-1].fp8 = describe(units[-1], gemms)
            add([block], UnitHooks(block, block))
            experts = list(getattr(getattr(block, "moe", None), "experts", []))
            if experts and getattr(experts[0].up.weight, "ep_sharded", False):
                add(experts, UnitHooks(experts[0], experts[-1]), experts=True)
        if part.has_head and not tied:
            # separate units: the LM head's gradient is then a unit's whole flat gradient
            # (no copy), and its gathered weight goes as soon as that gradient exists
            add([part.norm_f], UnitHooks(part.norm_f, part.norm_f))
            add([part.lm_head], UnitHooks(part.lm_head, part.lm_head))
    rest = [p for p in params if id(p) not in taken]
    if rest:
        units.append(FlatUnit(rest, group_size(group), group_rank(group), device, group))
    if not units:
        raise ParaxisError("ZeRO-3 found no trainable parameters to shard")
    return units, hooks
