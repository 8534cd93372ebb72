"""Gradient reduction that overlaps backward: buckets launched from gradient hooks.

The DDP recipe (Li et al., "PyTorch Distributed", VLDB 2020, sec. 3.2.3): parameters are
grouped into buckets in reverse registration order (roughly the order backward produces
their gradients); a `post_accumulate_grad` hook counts each bucket's ready gradients and,
when the last one lands, launches the bucket's collective asynchronously, so communication of
late layers runs while backward still computes early ones. Buckets launch strictly in index
order on every rank (a ready bucket waits for its predecessors), so all ranks issue the same
collectives in the same order even if hooks fired in another.

- ZeRO-0/1: gradients live in one flat fp32 buffer per bucket (`param.grad` is a view into
  it, so autograd accumulates in place). ZeRO-0 all-reduces the bucket; ZeRO-1
  reduce-scatters it, since each rank updates only its shard (its optimizer states) and the
  all-gather of updated parameters brings the rest: reduce-scatter + all-gather move the
  bytes of one all-reduce (ZeRO, Rajbhandari et al. 2020, sec. 7.2.1). The parts of the
  bucket outside this rank's shard then hold local sums only, so ZeRO-1 reads gradients
  through the shard (`grad_buffers`).
- ZeRO-2/3: autograd's own gradients are copied into a transient flat tensor and
  reduce-scattered; each rank keeps only its shard (`unit.grad_shard`, persistent) and the
  full gradients are dropped (ZeRO, Rajbhandari et al. 2020, sec. 5.2). Over several
  microbatches each one's gradients are reduce-scattered and added into the shard
  (`end_microstep`), as DeepSpeed's ZeRO-2 and PyTorch FSDP do by default: full gradients
  never outlive one microbatch's backward. (A pipeline accumulates them whole over its
  microbatches instead and reduces once: `sync` is then set on the last backward only.)

Each unit communicates over its own group (`FlatUnit.group`): the replica group (dp x cp),
or, for experts under expert parallelism, the ranks holding the same experts. Sums are
divided by the replica group's size once every unit has arrived (`finish`): the mean of the
per-rank mean losses is the global-batch mean loss. An expert's gradient arrives summed over
every rank whose tokens reached it (the all-to-all's backward brings them), so its sum over
its own group is already the sum over all replicas, divided by the same number.

Where nothing is reduced (every unit's group is one rank and no copies exist across shard
groups: one device, or tensor or pipeline parallelism without data parallelism), there are
no flat buffers: each `param.grad` is autograd's own tensor, made by the backward that
computes it, added into by later microbatches and dropped by `zero`, as a plain PyTorch
loop keeps them (`local`). Views into a zeroed buffer would cost a fill and an add pass over
every gradient a step, and hold the gradients' bytes through the forward.

Gradients accumulate and are reduced in `grad_dtype` (the precision policy's, default: the
parameters' dtype). When it differs from the parameters' (bf16 parameters, fp32 gradients:
Megatron's `main_grad`), autograd's gradient of each backward is added into the unit's flat
fp32 buffer by the hook and dropped, so microbatches accumulate in fp32.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable

import torch
import torch.distributed as dist

from paraxis.dist.watchdog import WATCH
from paraxis.engine.data_parallel.flat import (
    FlatUnit,
    all_reduce_sum,
    group_rank,
    group_size,
    reduce_scatter_sum,
)

MAX_IN_FLIGHT = 1  # ZeRO-2/3 gradient reductions in flight at once

class GradReducer:
    """Hooks every parameter of `units`; reduces each unit's gradient over its group and
    divides the sums by the size of `group` (the replica group).

    `on_unit_backward_done(i)` is called when every gradient of unit i has been accumulated in
    the current backward (ZeRO-3 frees the unit's gathered parameters there).
    """

    KEEP_AUTOGRAD_GRADS = True  # where nothing is reduced (False: flat buffers anyway)

    def __init__(self, units: list[FlatUnit], group: dist.ProcessGroup | None,
                 shard_grads: bool,
                 on_unit_backward_done: Callable[[int], None] | None = None,
                 reduce_to_shard: bool = False, grad_dtype: torch.dtype | None = None,
                 replicate_group: dist.ProcessGroup | None = None) -> None:
        self.units = units
        # hybrid sharding: each unit's shard, summed within its shard group, is then summed
        # over its copies in the other shard groups
        self.replicate_group = replicate_group
        self.final = False  # the step's last microbatch: a finished shard goes across at once
        self._across: dict[int, object] = {}  # unit index -> its all-reduce across copies
        self.grad_dtype = grad_dtype or units[0].dtype
        # autograd makes gradients in the parameters' dtype: another one is accumulated by
        # the hook into the flat buffers
        self.accumulate = any(unit.dtype != self.grad_dtype for unit in units)
        self.group = group
        self.dp_size = group_size(group)
        # fp16 gradients are divided by the group's size before they are summed, not after:
        # dp loss-scaled gradients can overflow fp16 in their sum where their mean does not
        # (PyTorch DDP's hook and FSDP pre-divide for the same reason); a power of 2 divides
        # exactly, so for such groups the mean is the same bits either way
        self.predivide = self.grad_dtype == torch.float16 and self.dp_size > 1
        # nothing to reduce: autograd's own gradients, no flat buffers
        self.local = (self.KEEP_AUTOGRAD_GRADS and not self.accumulate and not shard_grads
                      and not reduce_to_shard and replicate_group is None
                      and all(group_size(unit.group) == 1 for unit in units))
        self.shard_grads = shard_grads
        # ZeRO-1: full buckets, but only this rank's shard needs the sum
        self.reduce_to_shard = reduce_to_shard
        self.on_unit_backward_done = on_unit_backward_done
        self.sync = True
        self.record = False  # when True, `events` gets (kind, index, grads_seen, time)
        self.events: list[tuple[str, int, int, float]] = []
        self._unit_of: dict[int, int] = {}
        self._span_of: dict[int, tuple[int, int]] = {}
        for index, unit in enumerate(units):
            for p, start, end in unit.spans():
                self._unit_of[id(p)] = index
                self._span_of[id(p)] = (start, end)
        self._grads_seen = 0
        self._ready = [0] * len(units)
        self._complete = [False] * len(units)
        self._next_launch = 0
        self._reduced: set[int] = set()  # units already reduced into their shard this step
        # (work, tensor to hold until it is done, that tensor's sum or None, the shard it
        # goes into (copied, or added where `add`) or None, its group, its unit's index and
        # whether it was launched by the step's final backward)
        self._pending: list[tuple[object, torch.Tensor | None, torch.Tensor | None,
                                  torch.Tensor | None, bool, dist.ProcessGroup | None,
                                  int, bool]] = []
        self._pending_op = ("reduce_scatter" if shard_grads or reduce_to_shard
                            else "all_reduce")  # what finish() waits on
        for unit in units:
            unit.grad_accum = None  # ZeRO-2/3: the unit's flat gradient until it is reduced
            if self.local:
                unit.grad_full = unit.grad_shard = None
            elif shard_grads:
                unit.grad_shard = torch.zeros(unit.shard_numel, dtype=self.grad_dtype,
                                              device=unit.device)
            else:
                # One persistent buffer per bucket; the params' .grad are views into it, so
                # the bucket is already flat when its all-reduce launches (no copy).
                unit.grad_full = torch.zeros(unit.padded_numel, dtype=self.grad_dtype,
                                             device=unit.device)
                unit.grad_shard = unit.shard_of(unit.grad_full)
        self.attach_grad_views()
        # The hook reaches the reducer through a weak reference: a tensor's hooks are not
        # seen by Python's cycle collector, so a strong one would keep the engine (and all of
        # its memory) alive after its last user let go of it.
        # Nothing to reduce (`local`): no hook, which would cost the host a call into Python
        # per parameter per backward for nothing.
        reducer = weakref.ref(self)
        for unit in units if not self.local else []:
            for p in unit.params:
                p.register_post_accumulate_grad_hook(
                    lambda param, reducer=reducer: reducer()._on_grad(param))

    def attach_grad_views(self) -> None:
        if self.shard_grads or self.accumulate or self.local:
            return
        for unit in self.units:
            for p, start, end in unit.spans():
                p.grad = unit.grad_full[start:end].view_as(p)

    # ------------------------------------------------------------------ per microstep

    def begin_microstep(self, sync: bool, final: bool = False) -> None:
        """Called before each microbatch's backward: only a syncing one communicates.
        `final`: no later backward adds to this step's gradients, so under hybrid sharding
        each shard's all-reduce across copies starts as soon as its own sum has arrived."""
        self.sync = sync
        self.final = final
        self._ready = [0] * len(self.units)
        self._grads_seen = 0

    def end_microstep(self) -> None:
        """After a syncing microbatch's backward that is not the step's last (ZeRO-2/3 reduce
        every microbatch): launch what it did not (units with parameters that got no
        gradient), and let the next microbatch launch from the first unit again. Nothing
        waits here: the reductions still in flight are retired by the next launches or by
        `finish`."""
        for index in range(self._next_launch, len(self.units)):
            self._complete[index] = True
        self._launch_ready()
        self._complete = [False] * len(self.units)
        self._next_launch = 0

    def _flat_grads(self, unit: FlatUnit) -> torch.Tensor:
        """Where `accumulate` adds the unit's gradients: its bucket, or (ZeRO-2/3) its full
        flat buffer `unit.grad_accum`, which lives until the unit's reduction is launched."""
        if not self.shard_grads:
            return unit.grad_full
        if unit.grad_accum is None:
            unit.grad_accum = torch.zeros(unit.padded_numel, dtype=self.grad_dtype,
                                          device=unit.device)
        return unit.grad_accum

    def grad_of(self, param: torch.Tensor) -> torch.Tensor:
        """The gradient accumulated so far for `param`, as a tensor that the reduction reads
        (a view into the flat buffer under `accumulate`; else `param.grad`, made zero if
        missing): in-place changes, like the tied embedding's sum, reach the reduction."""
        if not self.accumulate:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            return param.grad
        start, end = self._span_of[id(param)]
        flat = self._flat_grads(self.units[self._unit_of[id(param)]])
        return flat[start:end].view(param.shape)

    def _on_grad(self, param: torch.Tensor) -> None:
        index = self._unit_of[id(param)]
        if self.accumulate:
            start, end = self._span_of[id(param)]
            self._flat_grads(self.units[index])[start:end].add_(param.grad.reshape(-1))
            param.grad = None
        elif self.shard_grads and self.sync:
            self._into_flat(index, param)
        self._grads_seen += 1
        if self.record:
            self.events.append(("grad", index, self._grads_seen, time.perf_counter()))
        self._ready[index] += 1
        if self._ready[index] < len(self.units[index].params):
            return
        self._ready[index] = 0
        # ZeRO-3 frees the unit's gathered parameters first: the gradients no longer need
        # them, and the memory is free before the collective's buffers are made.
        if self.on_unit_backward_done is not None:
            self.on_unit_backward_done(index)
        if self.sync:
            self._complete[index] = True
            self._launch_ready()

    def _into_flat(self, index: int, param: torch.Tensor) -> None:
        """ZeRO-2/3: move a finished gradient into its unit's flat buffer as it arrives, so a
        unit's gradients never exist twice (autograd's and the flat copy) beyond one
        parameter's. A unit of one parameter (an embedding, an LM head) needs no copy at all:
        its gradient is the flat buffer."""
        unit = self.units[index]
        if unit.grad_accum is None and len(unit.params) == 1 \
                and unit.padded_numel == unit.numel and param.grad.is_contiguous():
            unit.grad_accum = param.grad.view(-1)
        else:
            start, end = self._span_of[id(param)]
            self._flat_grads(unit)[start:end].copy_(param.grad.reshape(-1))
        param.grad = None

    def _take_flat(self, unit: FlatUnit) -> torch.Tensor:
        """ZeRO-2/3: the unit's flat gradient, taken from the unit for its reduction, with any
        gradient that did not arrive through a hook in this microstep (accumulated earlier,
        or never) added in."""
        flat = self._flat_grads(unit)
        unit.grad_accum = None
        for p, start, end in unit.spans():
            if p.grad is not None:
                flat[start:end].add_(p.grad.reshape(-1))
                p.grad = None
        return flat

    def _launch_ready(self) -> None:
        while self._next_launch < len(self.units) and self._complete[self._next_launch]:
            self._launch(self._next_launch)
            self._next_launch += 1

    def _launch(self, index: int) -> None:
        unit = self.units[index]
        if self.record:
            self.events.append(("launch", index, self._grads_seen, time.perf_counter()))
        if self.shard_grads:
            # Each reduction holds its unit's whole flat gradient until it is done: waiting
            # for the previous one before starting the next keeps MAX_IN_FLIGHT of them alive
            # (each still overlaps the backward of the unit after it), where waiting only in
            # `finish` would hold the whole model's gradients at once.
            while len(self._pending) >= MAX_IN_FLIGHT:
                self._retire_oldest()
            flat = self._take_flat(unit)
            if self.predivide:
                flat.div_(self.dp_size)
            if index in self._reduced:  # a later microbatch: its sum adds to the shard
                out = torch.empty_like(unit.grad_shard)
                self._pending.append((reduce_scatter_sum(out, flat, unit.group), flat, out,
                                      unit.grad_shard, True, unit.group, index, self.final))
            else:
                self._pending.append((reduce_scatter_sum(unit.grad_shard, flat, unit.group),
                                      flat, None, None, False, unit.group, index, self.final))
            self._reduced.add(index)
            return
        if self.predivide:
            unit.grad_full.div_(self.dp_size)
        if self.reduce_to_shard:
            # The output must not alias the input (gloo gets it wrong), so the sum lands in
            # a shard-sized buffer and is copied into the bucket when it has arrived.
            out = torch.empty_like(unit.grad_shard)
            self._pending.append((reduce_scatter_sum(out, unit.grad_full, unit.group), out,
                                  out, unit.grad_shard, False, unit.group, index, self.final))
        else:
            self._pending.append((all_reduce_sum(unit.grad_full, unit.group), None, None,
                                  None, False, unit.group, index, self.final))

    def _retire_oldest(self) -> None:
        work, _, summed, shard, add, group, index, final = self._pending.pop(0)
        with WATCH.waiting(self._pending_op, group):
            work.wait()
        if shard is not None:
            shard.add_(summed) if add else shard.copy_(summed)
        if final:  # an earlier microbatch's sum is followed by the final one's
            self._send_across(index)

    def _send_across(self, index: int) -> None:
        """Hybrid sharding: start the all-reduce of unit `index`'s summed shard over its
        copies (once a step; nothing without hybrid sharding)."""
        if self.replicate_group is not None and index not in self._across:
            self._across[index] = all_reduce_sum(self.units[index].grad_shard,
                                                 self.replicate_group)

    # ----------------------------------------------------------------------- finish

    def finish(self) -> None:
        """Launch what backward did not (units with unused parameters), wait for every
        collective, and turn the sums into means. Nothing to reduce (`local`): a parameter
        no backward reached gets a zero gradient, as a bucket would give it (AdamW then
        decays it as on every other layout)."""
        if self.local:
            for unit in self.units:
                for p in unit.params:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
            return
        for index in range(self._next_launch, len(self.units)):
            self._complete[index] = True
        self._launch_ready()
        while self._pending:
            self._retire_oldest()
        for index in range(len(self.units)):
            self._send_across(index)
        for work in self._across.values():
            with WATCH.waiting("all_reduce", self.replicate_group):
                work.wait()
        self._across.clear()
        self.final = False
        if self.dp_size > 1 and not self.predivide:
            for buffer in self.grad_buffers():
                buffer.div_(self.dp_size)
        self._complete = [False] * len(self.units)
        self._next_launch = 0
        self._reduced.clear()
        self.sync = True

    def grad_buffers(self) -> list[torch.Tensor]:
        """The reduced gradients: full buckets (ZeRO-0) or this rank's shards (ZeRO-1/2/3);
        with nothing to reduce, the parameters' own gradients."""
        if self.local:
            return [p.grad for unit in self.units for p in unit.params if p.grad is not None]
        if self.shard_grads or self.reduce_to_shard:
            return [unit.grad_shard for unit in self.units]
        return [unit.grad_full for unit in self.units]

    def zero(self) -> None:
        if self.local:
            for unit in self.units:
                for p in unit.params:
                    p.grad = None
            return
        for unit in self.units:  # ZeRO-0/1 accumulate into the whole bucket
            (unit.grad_shard if self.shard_grads else unit.grad_full).zero_()
        if self.shard_grads:
            for unit in self.units:
                unit.grad_accum = None
                for p in unit.params:
                    p.grad = None


def make_buckets(params: list[torch.nn.Parameter], bucket_bytes: int,
                 group_of: Callable[[torch.nn.Parameter], dist.ProcessGroup | None],
                 device: torch.device | None = None) -> list[FlatUnit]:
    """Reverse registration order (≈ backward order, as DDP does), cut at `bucket_bytes` and
    wherever the dtype or the group (`group_of(param)`: who reduces its gradient) changes."""
    buckets: list[FlatUnit] = []
    current: list[torch.nn.Parameter] = []
    size = 0

    def close() -> None:
        group = group_of(current[0])
        buckets.append(FlatUnit(current, group_size(group), group_rank(group), device, group))

    for p in reversed(params):
        if current and (size + p.numel() * p.element_size() > bucket_bytes
                        or p.dtype != current[0].dtype or group_of(p) is not group_of(current[0])):
            close()
            current, size = [], 0
        current.append(p)
        size += p.numel() * p.element_size()
    if current:
        close()
    return buckets
