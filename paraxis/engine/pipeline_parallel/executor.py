"""Run one stage's action list, exactly as the schedule generator wrote it.

The executor decides nothing about order: it walks `schedule.stages[stage]` and, per action,

    recv  -> post irecv for the activation / gradient the next compute needs, wait for it
    F     -> forward of (microbatch, chunk); on the last virtual stage, the loss / M
    send  -> post isend of the output activation / input gradient (waited for at step end)
    B     -> backward of (microbatch, chunk), gradients accumulate in .grad; on the last
             virtual stage backward starts from loss / M times fp16's loss scale, so every
             stage's gradients carry the scale (the data-parallel engine removes it once).
             When the schedule has W actions (zero-bubble), B computes only the gradient of
             the chunk's input and leaves the weight gradients pending (`split_backward`)
    W     -> those weight gradients; the data-parallel hooks fire here, and the stage's
             gradient sync starts in its last W

A run of consecutive send/recv actions (e.g. 1F1B's "send activation, receive gradient") is
posted together with `dist.batch_isend_irecv`, so neither side waits on the other's send
(the deadlock Megatron's `send_forward_recv_backward` avoids); the schedule's generator
orders those groups so that NCCL, which matches a pair's messages in posting order and
completes a group as a whole, cannot deadlock (`schedules.validate`). A recv is posted where
the schedule puts it and waited for only by the compute that needs it, so an early post
never holds the stage. Messages also carry the schedule's tag (tensor, microbatch,
destination virtual stage), which gloo matches on.

Receives posted ahead (`recv_ahead`, gloo only). On gloo an irecv is posted one
communication point earlier still, before that point's sends: the message then lands while
this stage computes, instead of starting its transfer only when the stage asks for it. Gloo
matches messages by tag, so posting early cannot reorder them; NCCL matches a pair's
messages in the order they were posted and runs them on one stream, where an early recv
could hold back a send its peer is waiting for, so there it stays 0.

Every action is recorded in `trace` as {"rank", "stage", "kind", "microbatch", "chunk",
"start_s", "end_s"} (perf_counter seconds) for the Chrome trace; a recv is recorded when its
compute waits for it, and also has "posted_s", when its irecv was posted.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from paraxis.dist.groups import batch_isend_irecv, through_host
from paraxis.dist.watchdog import WATCH
from paraxis.engine.pipeline_parallel.split_backward import PendingWeightGrad, backward_input
from paraxis.parallel.context.packing import weigh
from paraxis.spec.errors import ParaxisError
from paraxis.spec.schedules import COMPUTE, Action, Schedule, input_message


@dataclass
class _Step:
    """Everything one `run` carries from action to action (a fresh one per step)."""

    inputs: list[torch.Tensor]
    targets: list[torch.Tensor]
    shape: tuple[int, ...]  # of the tensor crossing a stage boundary
    device: torch.device
    autocast_dtype: torch.dtype | None
    loss_scale: float  # fp16's dynamic loss scale (1: none)
    loss_weights: list[float] | None  # packing: each microbatch's (packing.loss_weights)
    loss_total: torch.Tensor  # the last stage's sum of loss / M
    # (microbatch, chunk) -> the chunk's input (its .grad is the gradient to send back) and
    # output (kept for the backward)
    stage_inputs: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)
    stage_outputs: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)
    received: dict[tuple[str, int, int], torch.Tensor] = field(default_factory=dict)
    local_grads: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)
    input_grads: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)
    # (microbatch, chunk) -> weight gradients a split B left for its W
    weight_grads: dict[tuple[int, int], PendingWeightGrad] = field(default_factory=dict)
    # (work, tensor, peer): a tensor must outlive its isend, so it is held until the step ends
    pending_sends: list[tuple[dist.Work | AllOf, torch.Tensor, int]] = field(default_factory=list)
    # receives posted ahead: action position -> (work, buffer, perf_counter time of posting)
    posted: dict[int, tuple[dist.Work, torch.Tensor, float]] = field(default_factory=dict)
    # receives posted and not yet waited for: message key -> (work, buffer, posted_s, action)
    inflight: dict[tuple, tuple[dist.Work | AllOf, torch.Tensor, float, Action]] = field(
        default_factory=dict)


class AllOf:
    """One wait for a coalesced batch of point-to-point ops: waits for every Work of it."""

    def __init__(self, works: list[dist.Work]) -> None:
        self.works = works

    def wait(self) -> None:
        for work in self.works:
            work.wait()

    def is_completed(self) -> bool:
        return all(work.is_completed() for work in self.works)


def op_handles(ops: list[dist.P2POp], works: list[dist.Work]) -> list[dist.Work | AllOf]:
    """A wait handle per op of a `batch_isend_irecv`. A backend that coalesces (NCCL) returns
    one Work for the whole batch (torch's `_coalescing_manager`: `cm.works`), which completes
    all its ops together; gloo returns one per op. Every op of a coalesced batch waits for it
    all, as torch.distributed.pipelining's `_wait_batch_p2p` does."""
    if len(works) == len(ops):
        return list(works)
    return [AllOf(works)] * len(ops)


class PipelineExecutor:
    def __init__(self, schedule: Schedule, stage: int, chunks: list[nn.Module],
                 stage_ranks: list[int], rank: int, dtype: torch.dtype = torch.float32,
                 recv_ahead: int | None = None,
                 boundary_shape: Callable[[torch.Size], tuple[int, ...]] | None = None,
                 around_compute: Callable[[int], contextlib.AbstractContextManager[Any]] | None
                 = None) -> None:
        """boundary_shape: (shape of microbatch token ids) -> shape of the tensor crossing a
        stage boundary (default: the whole residual stream; sequence parallelism gives its
        sequence-scattered shape); around_compute: position -> a context around that compute
        action (ZeRO-3 gathers and frees a chunk's weights by the schedule:
        `zero3.PipelineZero3.around`)."""
        self.schedule = schedule
        self.stage = stage
        self.chunks = chunks
        self.stage_ranks = stage_ranks  # global rank of each pipeline stage
        self.rank = rank
        self.dtype = dtype  # of the tensors crossing a stage boundary (the parameters')
        self.actions = schedule.stages[stage]
        self.last_virtual = schedule.num_virtual_stages - 1
        self.split = schedule.split_backward
        # the receives of each communication point (a run of send/recv actions), in order
        self.recv_groups: list[list[int]] = []
        for i, a in enumerate(self.actions):
            if a.kind in ("send", "recv") and (i == 0 or self.actions[i - 1].kind in COMPUTE):
                self.recv_groups.append([])
            if a.kind == "recv":
                self.recv_groups[-1].append(i)
        # this stage's final gradient-producing action (B, or W when backward is split; an
        # evaluation schedule has none), where data parallelism syncs
        grads_in = "W" if self.split else "B"
        self.last_backward = max((i for i, a in enumerate(self.actions) if a.kind == grads_in),
                                 default=-1)
        self.trace: list[dict[str, Any]] = []
        # How many communication points ahead to post receives (see above).
        host = dist.is_initialized() and through_host()
        self.recv_ahead = recv_ahead if recv_ahead is not None else int(host)
        if self.recv_ahead and dist.is_initialized() and dist.get_backend() == "nccl":
            # A lone irecv is not ordered against NCCL's batched groups on the same pair.
            raise ParaxisError("recv_ahead > 0 posts receives outside the batched groups, "
                               "which NCCL does not order; leave recv_ahead unset on NCCL")
        self.boundary_shape = boundary_shape or self._residual_shape
        self.around_compute = around_compute

    def _residual_shape(self, ids_shape: torch.Size) -> tuple[int, ...]:
        module = self.chunks[0]
        return (*ids_shape, module.cfg.d_model)

    def run(self, inputs: list[torch.Tensor], targets: list[torch.Tensor],
            autocast_dtype: torch.dtype | None = None,
            backward_context: Callable[[bool], Any] | None = None,
            loss_scale: float = 1.0, loss_weights: list[float] | None = None) -> torch.Tensor:
        """One step over the microbatches; returns the summed loss/M on the last stage (its
        share of the batch mean, unscaled) and 0 elsewhere. Gradients accumulate in the
        chunks, multiplied by `loss_scale`.

        backward_context(is_last): wraps each backward; is_last is True for this stage's
        final backward (data parallelism syncs there, as `DataParallelEngine.no_sync` does).
        loss_weights: document packing's factor on each microbatch's mean loss; every chunk
        is also given its microbatch's token ids (`inputs`) to find the documents in.
        """
        device = inputs[0].device
        step = _Step(inputs, targets, self.boundary_shape(inputs[0].shape), device,
                     autocast_dtype, loss_scale, loss_weights, torch.zeros((), device=device))
        self._post_ahead(0, step)
        position = 0
        while position < len(self.actions):
            action = self.actions[position]
            if action.kind in ("send", "recv"):
                batch = []
                while (position < len(self.actions)
                       and self.actions[position].kind in ("send", "recv")):
                    batch.append(position)
                    position += 1
                # The receives after this batch go out before its sends: on gloo a recv posted
                # behind an isend to the same peer can wait until that send has drained.
                self._post_ahead(position, step)
                self._communicate(batch, step)
                continue
            self._await_input(action, step)
            started = time.perf_counter()
            with (self.around_compute(position) if self.around_compute
                  else contextlib.nullcontext()):
                self._compute(position, action, step, backward_context)
            self._record(action, started)
            position += 1
        for work, _, peer in step.pending_sends:
            with WATCH.waiting("send", peer=peer, axis="pp"):
                work.wait()
        return step.loss_total

    def _compute(self, position: int, action: Action, step: _Step,
                 backward_context: Callable[[bool], Any] | None) -> None:
        if action.kind == "F":
            self._forward(action, step)
        elif action.kind == "B" and self.split:
            self._backward(action, step)  # input gradient only: no weight touched
        else:
            context = (backward_context(position == self.last_backward)
                       if backward_context else contextlib.nullcontext())
            with context:
                if action.kind == "W":
                    step.weight_grads.pop((action.microbatch, action.chunk)).run()
                else:
                    self._backward(action, step)

    def _forward(self, action: Action, step: _Step) -> None:
        """Forward of (microbatch, chunk); the last virtual stage adds its loss / M."""
        key = (action.microbatch, action.chunk)
        here = self.schedule.virtual_stage(self.stage, action.chunk)
        module = self.chunks[action.chunk]
        if here == 0:
            x = step.inputs[action.microbatch]
        elif ("act", *key) in step.received:
            x = step.received.pop(("act", *key)).requires_grad_()
        else:  # the previous chunk ran on this same stage (one-stage interleaving, the V)
            previous = self.schedule.place(here - 1)[1]
            x = step.stage_outputs[(action.microbatch, previous)].detach()
            x.requires_grad_()
        step.stage_inputs[key] = x
        with _autocast(step.device, step.autocast_dtype):
            if here != self.last_virtual:
                out = module(x, tokens=step.inputs[action.microbatch])
            else:  # the head's part returns the loss (`Transformer.head`)
                out = module(x, step.targets[action.microbatch],
                             tokens=step.inputs[action.microbatch])
                if step.loss_weights is not None:
                    out = weigh(out, step.loss_weights[action.microbatch])
                out = out / len(step.inputs)
                step.loss_total += out.detach()
        step.stage_outputs[key] = out

    def _backward(self, action: Action, step: _Step) -> None:
        """Backward of (microbatch, chunk); its input gradient goes to the previous chunk
        (kept here when that chunk is on this stage, else queued for its send)."""
        key = (action.microbatch, action.chunk)
        here = self.schedule.virtual_stage(self.stage, action.chunk)
        out = step.stage_outputs.pop(key)
        grad = None
        if here == self.last_virtual:
            out = out * step.loss_scale if step.loss_scale != 1.0 else out
        else:
            grad = step.received.pop(("grad", *key), None)
            if grad is None:
                grad = step.local_grads.pop(key)
            grad = grad.to(out.dtype)
        x = step.stage_inputs.pop(key)
        if self.split:
            # The first chunk's input is token ids: nobody waits for a gradient there, so
            # its B does nothing and its W runs the whole backward.
            weights = [p for p in self.chunks[action.chunk].parameters() if p.requires_grad]
            x_grad, step.weight_grads[key] = backward_input(out, grad, x if here else None,
                                                            weights)
        else:
            torch.autograd.backward(out, grad)
            x_grad = x.grad
        if here > 0 and self.schedule.place(here - 1)[0] == self.stage:
            previous = self.schedule.place(here - 1)[1]
            step.local_grads[(action.microbatch, previous)] = x_grad
        elif here > 0:
            step.input_grads[key] = x_grad

    def _communicate(self, batch: list[int], step: _Step) -> None:
        """Post one run of consecutive send/recv actions together; their receives are waited
        for by the computes that need them (`_await_input`)."""
        started = time.perf_counter()
        ops: list[dist.P2POp] = []
        recvs: list[tuple[Action, int, torch.Tensor]] = []  # (action, index into ops, buffer)
        for position in batch:
            action = self.actions[position]
            key = self.schedule.message_key(action)
            if position in step.posted:  # posted ahead: only its wait is left
                work, buffer, posted_s = step.posted.pop(position)
                step.inflight[key] = (work, buffer, posted_s, action)
                continue
            peer = self.stage_ranks[action.peer]
            tag = self.schedule.message_tag(action)
            if action.kind == "send":
                pair = (action.microbatch, action.chunk)
                if action.tensor == "act":
                    tensor = step.stage_outputs[pair].detach().to(self.dtype)
                else:
                    tensor = step.input_grads.pop(pair)
                ops.append(dist.P2POp(dist.isend, tensor.contiguous(), peer, tag=tag))
            else:
                buffer = torch.empty(step.shape, dtype=self.dtype, device=step.device)
                ops.append(dist.P2POp(dist.irecv, buffer, peer, tag=tag))
                recvs.append((action, len(ops) - 1, buffer))
        works = op_handles(ops, batch_isend_irecv(ops) if ops else [])
        # a send's tensor is kept until the send completes: those done are let go here,
        # so a stage holds its few sends in flight, not every one of the step's
        step.pending_sends = [sent for sent in step.pending_sends
                              if not sent[0].is_completed()]
        for op, work in zip(ops, works, strict=True):
            if op.op is dist.isend:
                step.pending_sends.append((work, op.tensor, op.peer))
        for action, index, buffer in recvs:
            step.inflight[self.schedule.message_key(action)] = (works[index], buffer, started,
                                                                action)
        for position in batch:
            if self.actions[position].kind == "send":
                self._record(self.actions[position], started)

    def _await_input(self, action: Action, step: _Step) -> None:
        """Wait for the message this compute needs, if it comes from another stage."""
        key = input_message(self.schedule, action)
        if key is None:
            return
        work, buffer, posted_s, recv = step.inflight.pop(key)
        started = time.perf_counter()
        with WATCH.waiting("recv", peer=self.stage_ranks[recv.peer], axis="pp"):
            work.wait()
        step.received[(recv.tensor, recv.microbatch, recv.chunk)] = buffer
        self._record(recv, started, posted_s)

    def _post_ahead(self, position: int, step: _Step) -> None:
        """Post the irecvs of the next `recv_ahead` communication points after `position`."""
        groups = [g for g in self.recv_groups if g and g[0] >= position][:self.recv_ahead]
        for index in (i for group in groups for i in group):
            if index in step.posted:
                continue
            action = self.actions[index]
            buffer = torch.empty(step.shape, dtype=self.dtype, device=step.device)
            peer = self.stage_ranks[action.peer]
            with WATCH.waiting("recv", peer=peer, axis="pp"):  # fails at once if the peer left
                work = dist.irecv(buffer, peer, tag=self.schedule.message_tag(action))
            step.posted[index] = (work, buffer, time.perf_counter())

    def _record(self, action: Action, started: float, posted_s: float | None = None) -> None:
        event = {"rank": self.rank, "stage": self.stage, "kind": action.kind,
                 "microbatch": action.microbatch, "chunk": action.chunk,
                 "start_s": started, "end_s": time.perf_counter()}
        if action.tensor is not None:
            event["tensor"] = action.tensor  # "act" or "grad" of a send / recv
        if posted_s is not None:
            event["posted_s"] = posted_s
        self.trace.append(event)


def _autocast(device: torch.device, dtype: torch.dtype | None
              ) -> contextlib.AbstractContextManager[object]:
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)
