"""`DataParallelEngine`: the Engine contract on a dp group, with ZeRO stage 0-3.

Every dp rank runs the same module on its slice of the batch. The engine works on whatever
parameters the module holds (a whole model, TP shards, one pipeline stage's parts) and talks
only over `groups.replica_group` (dp, or dp x cp: cp ranks hold the same parameters), so the
pipeline engine puts it underneath its own. dp = cp = 1 is a group of one (`dp_group` None):
its collectives are no-ops, so every layout runs through this engine at no measurable cost.
The one exception is experts split over ep (`ep_sharded`): their units reduce, shard and
gather over the ranks holding the same experts (`groups.expert_group`); their gradients,
already summed over every rank whose tokens they took, are divided by dp*cp like the rest.

Parameters still on the meta device (`runtime.parallelize`) get their storage here, on
`device`, without a value being read: ZeRO-3 never allocates more than a block's full
parameters at a time. Their values come afterwards, by name (`parallelize.materialize`).

    with engine.no_sync(last=is_last_microbatch):   # around each microbatch's backward
        loss.backward()
    engine.finish_grad_sync()                        # once, after the last backward
    engine.clip_grad_norm(max_norm); engine.optimizer_step(lr); engine.zero_grad()
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn

from paraxis.dist.groups import ParallelGroups
from paraxis.dist.params import (
    global_norm_squared,
    is_ep_sharded,
    is_pp_duplicate,
    is_tp_sharded,
    local_norm_squares,
    norm_squared,
)
from paraxis.dist.watchdog import WATCH
from paraxis.engine.contract import LocalEngine
from paraxis.engine.data_parallel.buckets import GradReducer, make_buckets
from paraxis.engine.data_parallel.flat import FlatUnit, all_gather, group_size
from paraxis.engine.data_parallel.loss_scale import LossScaler, any_rank_overflowed, torch_dtype
from paraxis.engine.data_parallel.masters import MasterWeights
from paraxis.engine.data_parallel.zero import (
    ParamGatherer,
    flatten_params_into,
    give_buffers_storage,
    give_storage,
    shard_optimizer,
    zero3_units,
)
from paraxis.engine.optimizer import (
    clip_factor,
    init_adam_state,
    make_adamw,
    optimizer_tensors,
    step_unless_nonfinite,
    storage_bytes,
)
from paraxis.model.checkpoint.entries import KINDS, Entry, shard_entries, whole_entries
from paraxis.parallel.tensor.partial import sum_partial_grads
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import Layout
from paraxis.spec.optimizer import AdamW
from paraxis.spec.precision import fp8_gather_problem, get_policy
from paraxis.spec.runtime_options import DEFAULT_OPTIONS, RuntimeOptions


class DataParallelEngine(LocalEngine):
    """Data parallelism over `groups.replica_group` (dp x cp) with ZeRO stage `layout.zero`.

    device: where parameters still on the meta device get their storage (default: where the
    parameters are). `options` (`spec.runtime_options`): the precision policy (parameters
    stored in its param dtype, gradients accumulated and reduced in its grad dtype, a 16-bit
    policy's AdamW updating fp32 masters (`masters.py`), fp16 scaling its loss;
    `autocast_policy` gives 16-bit compute over fp32 parameters and gradients), AdamW, the
    gradient buckets, document packing (`LocalEngine`), and ZeRO-3's FP8 gather
    (`fp8_gather.py`).
    """

    def __init__(self, model: nn.Module, layout: Layout, groups: ParallelGroups | None,
                 device: torch.device | None = None,
                 options: RuntimeOptions = DEFAULT_OPTIONS) -> None:
        self.model, self.layout, self.groups = model, layout, groups
        self.end_of_document = options.end_of_document
        self.policy = policy = get_policy(options.precision)
        if options.fp8_weight_gather and (
                problem := fp8_gather_problem(policy.name, layout.zero)):
            raise ParaxisError(problem)
        self.autocast_dtype = (None if policy.compute_dtype == "fp32"
                               else torch_dtype(policy.compute_dtype))
        self.zero = layout.zero
        self._take_groups(groups)
        if options.bucket_bytes <= 0:
            raise ParaxisError(f"bucket size {options.bucket_bytes} bytes must be positive")
        self.bucket_bytes = options.bucket_bytes
        self.loss_scaler = LossScaler() if policy.loss_scaling else None
        self._skip_step = False
        self._grad_factor = 1.0  # unscale/clip factor left for the fp32 master gradients
        params = [p for p in model.parameters() if p.requires_grad]
        device = device or params[0].device
        fp32_values = self._place_parameters(params, device)
        # Sharded gradients are reduced per microbatch (buckets.py), except under a pipeline,
        # whose stages accumulate them whole and reduce once (its tied embedding's sum and
        # ZeRO-3's chunks need the whole step's gradients: pipeline_parallel/engine.py).
        self.reduce_every_microbatch = self.zero >= 2 and layout.pp == 1
        self._build_units(params, device, options.fp8_weight_gather)
        self._build_optimizer(params, options.adamw, fp32_values)

    def _take_groups(self, groups: ParallelGroups | None) -> None:
        """The groups the gradient sync runs over, checked against the layout."""
        layout = self.layout
        self.dp_group = groups.replica_group if groups is not None else None  # dp (x cp)
        self.dp_size = group_size(self.dp_group)
        # experts split over ep reduce (and shard) over the ranks holding the same experts
        self.expert_group = groups.expert_group if groups is not None else None
        # where ZeRO shards: the groups above, or under hybrid sharding their parts inside
        # one shard group, whose copies then all-reduce across (`replicate_group`)
        self.zero_group = groups.zero_group if groups is not None else None
        self.expert_zero_group = groups.expert_zero_group if groups is not None else None
        self.replicate_group = groups.replicate_group if groups is not None else None
        if self.dp_size != layout.dp * layout.cp:
            axes = "dp*cp" if layout.cp > 1 else "dp"
            raise ParaxisError(f"layout {axes}={layout.dp * layout.cp} but this rank's {axes} "
                               f"group has {self.dp_size} ranks; build its groups from the layout")

    def _place_parameters(self, params: list[nn.Parameter], device: torch.device
                          ) -> dict[int, torch.Tensor] | None:
        """The parameters in the policy's dtype: given storage where they are still on the
        meta device (except where flat buffers will hold them), or else every rank's copy
        made dp rank 0's. Returns their fp32 values where masters start from them (not from
        their 16-bit roundings), else None."""
        policy, fp32_values = self.policy, None
        if any(p.is_meta for p in params):
            _cast(params, torch_dtype(policy.param_dtype))
            if self.zero == 0 and not policy.has_masters:  # else views of flat buffers
                for p in params:
                    if p.is_meta:
                        give_storage(p, device)
            give_buffers_storage(self.model, device)
        else:
            self._broadcast_from_first_rank(params)
            if policy.has_masters:
                fp32_values = {id(p): p.detach().float() for p in params}
            _cast(params, torch_dtype(policy.param_dtype))
        return fp32_values

    def _build_units(self, params: list[nn.Parameter], device: torch.device,
                     fp8_weight_gather: bool) -> None:
        """The flat units the gradients are reduced in and ZeRO shards, and their reducer:
        ZeRO-3's per block (gathered in the forward, freed after), else buckets of
        `bucket_bytes`."""
        grad_dtype = torch_dtype(self.policy.grad_dtype)
        self.gatherer: ParamGatherer | None = None
        if self.zero == 3:
            self.units, hooks = zero3_units(self.model, params, self.zero_group, device,
                                            self.expert_zero_group, fp8_weight_gather,
                                            self.layout.recompute)
            self.gatherer = ParamGatherer(self.units, hooks, self.model, self.zero_group)
            # Backward completes the forward units last-to-first, then the root.
            order = list(range(len(hooks) - 1, -1, -1)) + list(range(len(hooks),
                                                                     len(self.units)))
            self.reducer = GradReducer([self.units[i] for i in order], self.dp_group,
                                       shard_grads=True,
                                       on_unit_backward_done=lambda i: self.gatherer
                                       .on_unit_backward_done(order[i]), grad_dtype=grad_dtype,
                                       replicate_group=self.replicate_group)
            return
        self.units = make_buckets(params, self.bucket_bytes, self.group_of, device)
        if self.zero >= 1 or self.policy.has_masters:  # flat parameters (ZeRO-0: for masters)
            for unit in self.units:
                full = torch.zeros(unit.padded_numel, dtype=unit.dtype, device=unit.device)
                flatten_params_into(unit, full)
                unit.param_full = full
                unit.param_shard = unit.shard_of(full)
        self.reducer = GradReducer(self.units, self.dp_group, shard_grads=self.zero >= 2,
                                   reduce_to_shard=self.zero == 1, grad_dtype=grad_dtype,
                                   replicate_group=self.replicate_group)

    def _build_optimizer(self, params: list[nn.Parameter], adamw: AdamW,
                         fp32_values: dict[int, torch.Tensor] | None) -> None:
        """AdamW over what this rank updates: fp32 masters of its shards (or of the whole
        units under ZeRO-0) where the policy keeps masters, else the parameters themselves
        (ZeRO-0) or their shards."""
        self.masters: MasterWeights | None = None
        if self.policy.has_masters:
            whole = self.zero == 0  # ZeRO-0 updates every unit whole
            owned = [u.param_full if whole else u.param_shard for u in self.units]
            grads = [u.grad_full if whole else u.grad_shard for u in self.units]
            self.masters = MasterWeights(self.units, owned, grads, whole)
            self.optimizer, self.pieces = shard_optimizer(
                self.units, adamw, self.masters.masters, whole)
            self.masters.attach(self.pieces)
            self.masters.share_moments(self.optimizer)
            if fp32_values is not None:
                self.masters.fill_from(fp32_values)
        elif self.zero == 0:
            self.optimizer = make_adamw(params, adamw)
            self.pieces = []
        else:
            self.optimizer, self.pieces = shard_optimizer(self.units, adamw)
        init_adam_state(self.optimizer)
        # the reduced gradient of each piece (the optimizer's .grad where dtypes agree)
        self.piece_grads = [] if not self.pieces or self.reducer.local else _piece_grads(
            self.units, whole=self.masters is not None and self.zero == 0)

    def group_of(self, param: nn.Parameter) -> dist.ProcessGroup | None:
        """Where `param`'s gradient is reduced and its states sharded: the replica group,
        or the experts' own (their parts in one shard group under hybrid sharding)."""
        return self.expert_zero_group if is_ep_sharded(param) else self.zero_group

    def _broadcast_from_first_rank(self, params: list[nn.Parameter]) -> None:
        """Every rank starts from dp rank 0's weights (as DDP does), whatever their seeds."""
        with torch.no_grad():
            for p in params:
                group = self.expert_group if is_ep_sharded(p) else self.dp_group
                if group is not None:
                    with WATCH.waiting("broadcast", group):
                        dist.broadcast(p.data, src=dist.get_global_rank(group, 0), group=group)

    # ------------------------------------------------------------------- the contract

    def backward(self, loss: torch.Tensor) -> None:
        scaler = self.loss_scaler
        (loss * scaler.scale if scaler is not None else loss).backward()

    @contextlib.contextmanager
    def no_sync(self, last: bool) -> Iterator[None]:
        """Around one microbatch's backward. ZeRO-0/1: gradients accumulate locally unless
        `last`, in which case buckets launch from the backward hooks (nanoGPT: sync only at
        the last microstep, since earlier all-reduces would be overwritten work). ZeRO-2/3
        without a pipeline: every microbatch reduce-scatters its gradients into the shards
        (`reduce_every_microbatch`), so no rank ever holds the whole model's gradients."""
        every = self.reduce_every_microbatch
        # under a pipeline `last` may mean one chunk's last backward: only finish() is final
        self.reducer.begin_microstep(sync=last or every, final=last and self.layout.pp == 1)
        yield
        if every and not last:
            self.reducer.end_microstep()

    def finish_grad_sync(self) -> None:
        """Wait for every bucket/shard reduction; gradients are then the dp mean. Then sum
        the partial gradients over the TP group, a call per bucket (`sum_partial_grads`)."""
        self.reducer.finish()
        if self.gatherer is not None:
            self.gatherer.free_all()
        tp_group = self.groups.tp_group if self.groups is not None else None
        if group_size(tp_group) == 1:
            return  # nothing partial to sum (and no per-parameter pass on the host)
        pairs = ([(piece.param, grad) for (piece, _), grad in  # what norm and optimizer read
                  zip(self.pieces, self.current_piece_grads(), strict=True)] if self.pieces
                 else [(p, p.grad) for p in self.model.parameters()])
        sum_partial_grads(pairs, tp_group, self.bucket_bytes)

    def evaluate(self, inputs: torch.Tensor, targets: torch.Tensor) -> float:
        loss = super().evaluate(inputs, targets)
        if self.gatherer is not None:  # forward-only leaves the root unit gathered
            self.gatherer.free_all()
        return loss

    def count_over_replicas(self, count: int) -> int:
        if self.dp_group is None:
            return count
        value = torch.tensor([count], dtype=torch.int64, device=self.device)
        with WATCH.waiting("all_reduce", self.dp_group):
            dist.all_reduce(value, group=self.dp_group)
        return int(value)

    def reduce_loss(self, loss: torch.Tensor) -> torch.Tensor:
        if self.dp_group is None:
            return loss
        value = loss.reshape(1).clone()  # the collective's own buffer, on the loss's device
        with WATCH.waiting("all_reduce", self.dp_group):
            dist.all_reduce(value, group=self.dp_group)
        return value[0] / self.dp_size

    def grad_norm_squared(self) -> torch.Tensor:
        if self.zero == 0 and self.masters is None:
            params = list(self.model.parameters())
            sharded, replicated = local_norm_squares([p for p in params if not is_ep_sharded(p)])
            experts = self._experts_norm([p.grad for p in params if is_ep_sharded(p)
                                          and p.grad is not None])
            return global_norm_squared(sharded, replicated, self.groups, False, experts,
                                       self.layout.etp > 1)
        # ZeRO-1/2/3: each rank holds the reduced gradient of a disjoint piece of every
        # parameter (its shard); padding is left out. (ZeRO-0 with masters: whole pieces.)
        grads = self.current_piece_grads()
        experts, sharded, replicated = ([grads[i] for i in kind]
                                        for kind in self._pieces_by_norm)
        return global_norm_squared(norm_squared(sharded, self.device),
                                   norm_squared(replicated, self.device), self.groups,
                                   self.zero >= 1, self._experts_norm(experts),
                                   self.layout.etp > 1)

    @functools.cached_property
    def _pieces_by_norm(self) -> tuple[list[int], list[int], list[int]]:
        """The pieces' indices by how their gradients enter the norm: expert-parallel,
        tensor-parallel sharded, and the rest (a pipeline's duplicate of a tied weight in
        none); worked out at the first step, once every axis has marked its parameters, and
        kept: the step then makes no per-piece pass over the flags."""
        kinds: tuple[list[int], list[int], list[int]] = ([], [], [])
        for index, (piece, _) in enumerate(self.pieces):
            if not is_pp_duplicate(piece.param):
                kind = (0 if is_ep_sharded(piece.param) else
                        1 if is_tp_sharded(piece.param) else 2)
                kinds[kind].append(index)
        return kinds

    def current_piece_grads(self) -> list[torch.Tensor]:
        """Each piece's reduced gradient (`piece_grads`, views of the flat buffers); with
        nothing reduced (`GradReducer.local`) the parameter's own gradient, whole as its
        piece is (ZeRO-0), read in the same order."""
        if not self.reducer.local:
            return self.piece_grads
        return [piece.param.grad for piece, _ in self.pieces]

    def _experts_norm(self, grads: list[torch.Tensor]) -> torch.Tensor | None:
        """Squared norm of this rank's expert gradients (None without expert parallelism)."""
        return norm_squared(grads, self.device) if self.layout.ep > 1 else None

    def clip_grad_norm_on_device(self, max_norm: float) -> torch.Tensor:
        """Global norm over every shard; clips (and, for fp16, unscales) in one pass: on
        fp32 gradients in place, on 16-bit ones in their fp32 master copies at the step.
        Decided on the device, except fp16's overflow check, which every rank must agree on
        before the step (its loss scale changes with it)."""
        norm = self.grad_norm_squared().sqrt()
        factor: torch.Tensor | float = 1.0
        if self.loss_scaler is not None:
            finite = math.isfinite(float(norm))
            self._skip_step = any_rank_overflowed(finite, self.groups, self.device)
            self.loss_scaler.update(overflow=self._skip_step)
            if self._skip_step:
                return norm
            factor = 1.0 / self.loss_scaler.last_scale
            norm = norm * factor
        if max_norm > 0:
            factor = factor * clip_factor(norm, max_norm)
        if isinstance(factor, float) and factor == 1.0:
            return norm
        if self.masters is None:  # fp32 parameters, stepped on their fp32 gradients
            torch._foreach_mul_(self.reducer.grad_buffers(), factor)
        else:  # applied in the masters' one pass (1/S would underflow in fp16 itself)
            self._grad_factor = factor
        return norm

    def skipped_overflow(self) -> bool:
        return self._skip_step

    def optimizer_step(self, lr: float) -> None:
        factor, self._grad_factor = self._grad_factor, 1.0
        if self._skip_step:  # fp16 overflow: this step's gradients are not usable
            return
        if self.gatherer is not None:
            self.gatherer.free_all()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if self.masters is not None:
            self.masters.step(self.optimizer, factor, self._nonfinite)
        else:
            step_unless_nonfinite(self.optimizer, self._nonfinite)
        if self.zero in (1, 2):
            # Each rank updated its shard in place; all-gather rebuilds the full parameters.
            # The shard is copied first: an all-gather's input must not alias its output.
            works = [(all_gather(unit.param_full, unit.param_shard.clone(), unit.group),
                      unit.group) for unit in self.units]
            for work, group in works:
                with WATCH.waiting("all_gather", group):
                    work.wait()

    def zero_grad(self) -> None:
        self.reducer.zero()

    # ------------------------------------------------------ checkpoints, traces, reports

    def checkpoint_entries(self) -> list[Entry]:
        """ZeRO-1/2: whole parameters, AdamW moments of this rank's shard; ZeRO-3: the
        parameters too exist only as this rank's shard. The model's buffers are whole."""
        if self.masters is not None:
            return self._master_entries() + self.buffer_entries()
        if self.zero == 0:
            return super().checkpoint_entries()
        named = self.named_parameters()
        names = {id(p): n for n, p in named}
        place = self.place()
        kinds = KINDS if self.zero == 3 else KINDS[1:]
        entries = shard_entries(self.pieces, names, self.optimizer.state, place, kinds)
        if self.zero in (1, 2):
            trainable = [(n, p) for n, p in named if p.requires_grad]
            entries += whole_entries(trainable, self.optimizer.state, place, ("param",))
        return entries + self.buffer_entries()

    def _master_entries(self) -> list[Entry]:
        """A 16-bit policy saves the fp32 masters as the parameters (with their moments).
        The 16-bit parameters are entries too, never written (owner False) but filled from
        the same full tensor on load or initialisation, so they equal the rounded masters."""
        named = self.named_parameters()
        names = {id(p): n for n, p in named}
        place = self.place()
        # ZeRO-0: whole masters on every dp rank, one writer
        entries = shard_entries(self.pieces, names, self.optimizer.state, place, KINDS,
                                whole_on_every_dp_rank=self.zero == 0)
        if self.zero == 3:
            copies = shard_entries(
                [(piece, unit.param_shard[piece.shard_lo:piece.shard_hi])
                 for unit in self.units for piece in unit.pieces()], names, {}, place,
                ("param",))
        else:
            copies = whole_entries([(n, p) for n, p in named if p.requires_grad], {}, place,
                                   ("param",))
        for entry in copies:
            entry.owner = False
        # by name, so initialisation and loading build each full tensor once
        return sorted(entries + copies, key=lambda e: (e.name, e.kind))

    @torch.no_grad()
    def full_parameters(self) -> dict[str, torch.Tensor]:
        """Name -> full parameter (a copy). Collective under ZeRO-3: call on every rank."""
        if self.gatherer is None:
            return {n: p.detach().clone() for n, p in self.model.named_parameters()}
        out = {}
        names = {id(p): n for n, p in self.named_parameters()}  # single-device names
        for index, unit in enumerate(self.units):
            flat = self.gatherer.full_flat(index)
            for p, start, end in unit.spans():
                out[names[id(p)]] = flat[start:end].view(p.shape).clone()
        return out

    def memory_report(self) -> dict[str, int]:
        """Bytes this rank holds for parameters, gradients and optimizer states, counted from
        tensor storages (each storage once; a freed ZeRO-3 block counts zero). Gradients
        that each backward makes and `zero_grad` drops (`GradReducer.local`) count what a
        step holds, whether or not they exist now."""
        params = [p.data for p in self.model.parameters()]
        if self.gatherer is not None:
            params += [unit.param_shard for unit in self.units]
        grads = list(self.reducer.grad_buffers())
        grads += [p.grad for p in self.model.parameters() if p.grad is not None]
        optimizer = list(optimizer_tensors(self.optimizer))
        if self.masters is not None:
            optimizer += self.masters.masters
        grad_bytes = storage_bytes(grads) if not self.reducer.local else sum(
            p.numel() * p.element_size() for unit in self.units for p in unit.params)
        return {"params": storage_bytes(params), "grads": grad_bytes,
                "optimizer": storage_bytes(optimizer)}


def _cast(params: list[nn.Parameter], dtype: torch.dtype) -> None:
    """Store `params` in `dtype` (the policy's); the Parameter objects stay (hooks, tied
    modules and the roles set on them keep referring to them)."""
    for p in params:
        if p.dtype != dtype:
            p.data = p.data.to(dtype)


def _piece_grads(units: list[FlatUnit], whole: bool) -> list[torch.Tensor]:
    """Each piece's reduced gradient, in `shard_optimizer`'s order."""
    return [(unit.grad_full if whole else unit.grad_shard)[piece.shard_lo:piece.shard_hi]
            for unit in units for piece in (unit.whole_pieces() if whole else unit.pieces())]

