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
(the deadlock Megatron's `send_forward_recv_backward` avoids). Messages carry the schedule's
tag (tensor, microbatch, destination virtual stage), so arrival order does not matter.

Receives posted ahead (`recv_ahead`, gloo only). A recv is waited for where the schedule
puts it, but on gloo its irecv is posted one communication point earlier, before that
point's sends and waits: the message then lands while this stage computes, instead of
starting its transfer only when the stage asks for it. Gloo matches messages by tag, so
posting early cannot reorder them; NCCL matches a pair's messages in the order they were
posted and runs them on one stream, where an early recv could hold back a send its peer is
waiting for, so there it stays 0.

Every action is recorded in `trace` as {"rank", "stage", "kind", "microbatch", "chunk",
"start_s", "end_s"} (perf_counter seconds) for the Chrome trace; a recv also has "posted_s",
when its irecv was posted.
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

from paraxis.pipeline_parallel.split_backward import PendingWeightGrad, backward_input
from paraxis.runtime.watchdog import WATCH
from paraxis.schedules import Action, Schedule


@dataclass
class _Step:
    """Everything one `run` carries from action to action (a fresh one per step)."""

    inputs: list[torch.Tensor]
    targets: list[torch.Tensor]
    shape: tuple[int, ...]  # of the tensor crossing a stage boundary
    device: torch.device
    autocast_dtype: torch.dtype | None
    loss_scale: float  # fp16's dynamic loss scale (1: none)
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
    pending_sends: list[tuple[dist.Work, torch.Tensor, int]] = field(default_factory=list)
    # receives posted ahead: action position -> (work, buffer, perf_counter time of posting)
    posted: dict[int, tuple[dist.Work, torch.Tensor, float]] = field(default_factory=dict)


class PipelineExecutor:
    def __init__(self, schedule: Schedule, stage: int, chunks: list[nn.Module],
                 stage_ranks: list[int], rank: int, dtype: torch.dtype = torch.float32,
                 recv_ahead: int | None = None) -> None:
        self.schedule = schedule
        self.stage = stage
        self.chunks = chunks
        self.stage_ranks = stage_ranks  # global rank of each pipeline stage
        self.rank = rank
        self.dtype = dtype  # of the tensors crossing a stage boundary (the parameters')
        self.actions = schedule.stages[stage]
        self.last_virtual = schedule.num_virtual_stages - 1
        # receives in schedule order, and this stage's final gradient-producing action (B,
        # or W when backward is split; an evaluation schedule has none), where data
        # parallelism syncs
        self.split = schedule.split_backward
        self.recv_positions = [i for i, a in enumerate(self.actions) if a.kind == "recv"]
        grads_in = "W" if self.split else "B"
        self.last_backward = max((i for i, a in enumerate(self.actions) if a.kind == grads_in),
                                 default=-1)
        self.trace: list[dict[str, Any]] = []
        # How many receives beyond the current communication point to post (see above).
        self.recv_ahead = (recv_ahead if recv_ahead is not None
                           else int(dist.is_initialized() and dist.get_backend() == "gloo"))
        # (shape of microbatch token ids) -> shape of the tensor crossing a stage boundary;
        # sequence parallelism replaces it with its sequence-scattered shape.
        self.boundary_shape: Callable[[torch.Size], tuple[int, ...]] = self._residual_shape

    def _residual_shape(self, ids_shape: torch.Size) -> tuple[int, ...]:
        module = self.chunks[0]
        return (*ids_shape, module.cfg.d_model)

    def run(self, inputs: list[torch.Tensor], targets: list[torch.Tensor],
            autocast_dtype: torch.dtype | None = None,
            backward_context: Callable[[bool], Any] | None = None,
            loss_scale: float = 1.0) -> torch.Tensor:
        """One step over the microbatches; returns the summed loss/M on the last stage (its
        share of the batch mean, unscaled) and 0 elsewhere. Gradients accumulate in the
        chunks, multiplied by `loss_scale`.

        backward_context(is_last): wraps each backward; is_last is True for this stage's
        final backward (data parallelism syncs there, as `DataParallelEngine.no_sync` does).
        """
        device = inputs[0].device
        step = _Step(inputs, targets, self.boundary_shape(inputs[0].shape), device,
                     autocast_dtype, loss_scale, torch.zeros((), device=device))
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
            started = time.perf_counter()
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
            self._record(action, started)
            position += 1
        for work, _, peer in step.pending_sends:
            with WATCH.waiting("send", peer=peer, axis="pp"):
                work.wait()
        return step.loss_total

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
        with _autocast(step.device, step.autocast_dtype):
            if here == 0 and self.split and torch.is_grad_enabled():
                # A split B stops at the embedding's output (token ids have no gradient);
                # W then computes the embedding's gradient with the others.
                x = module.embed(x)
                out = module.after_embedding(x)
            else:
                out = module(x)
            step.stage_inputs[key] = x
            if here == self.last_virtual:
                out = module.loss_fn(out, step.targets[action.microbatch]) / len(step.inputs)
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
            weights = [p for p in self.chunks[action.chunk].parameters() if p.requires_grad]
            x_grad, step.weight_grads[key] = backward_input(out, grad, x, weights)
        else:
            torch.autograd.backward(out, grad)
            x_grad = x.grad
        if here > 0 and self.schedule.place(here - 1)[0] == self.stage:
            previous = self.schedule.place(here - 1)[1]
            step.local_grads[(action.microbatch, previous)] = x_grad
        elif here > 0:
            step.input_grads[key] = x_grad

    def _communicate(self, batch: list[int], step: _Step) -> None:
        """Post one run of consecutive send/recv actions together, wait for its receives."""
        started = time.perf_counter()
        ops: list[dist.P2POp] = []
        # (position, index into ops or a work posted ahead, buffer, posted_s)
        recvs: list[tuple[int, int | dist.Work, torch.Tensor, float]] = []
        for position in batch:
            action = self.actions[position]
            if position in step.posted:  # posted ahead: only its wait is left
                recvs.append((position, *step.posted.pop(position)))
                continue
            peer = self.stage_ranks[action.peer]
            tag = self.schedule.message_tag(action)
            key = (action.microbatch, action.chunk)
            if action.kind == "send":
                if action.tensor == "act":
                    tensor = step.stage_outputs[key].detach().to(self.dtype)
                else:
                    tensor = step.input_grads.pop(key)
                ops.append(dist.P2POp(dist.isend, tensor.contiguous(), peer, tag=tag))
            else:
                buffer = torch.empty(step.shape, dtype=self.dtype, device=step.device)
                ops.append(dist.P2POp(dist.irecv, buffer, peer, tag=tag))
                recvs.append((position, len(ops) - 1, buffer, started))
        works = dist.batch_isend_irecv(ops) if ops else []
        for op, work in zip(ops, works, strict=True):
            if op.op is dist.isend:
                step.pending_sends.append((work, op.tensor, op.peer))
        posted_at = {}
        for position, work, buffer, posted_s in recvs:
            action = self.actions[position]
            if isinstance(work, int):
                work = works[work]
            with WATCH.waiting("recv", peer=self.stage_ranks[action.peer], axis="pp"):
                work.wait()
            step.received[(action.tensor, action.microbatch, action.chunk)] = buffer
            posted_at[position] = posted_s
        for position in batch:
            self._record(self.actions[position], started, posted_at.get(position))

    def _post_ahead(self, position: int, step: _Step) -> None:
        """Post the irecvs of the next `recv_ahead` receives after `position`."""
        upcoming = [i for i in self.recv_positions if i >= position][:self.recv_ahead]
        for index in upcoming:
            if index in step.posted:
                continue
            action = self.actions[index]
            buffer = torch.empty(step.shape, dtype=self.dtype, device=step.device)
            work = dist.irecv(buffer, self.stage_ranks[action.peer],
                              tag=self.schedule.message_tag(action))
            step.posted[index] = (work, buffer, time.perf_counter())

    def _record(self, action: Action, started: float, posted_s: float | None = None) -> None:
        event = {"rank": self.rank, "stage": self.stage, "kind": action.kind,
                 "microbatch": action.microbatch, "chunk": action.chunk,
                 "start_s": started, "end_s": time.perf_counter()}
        if posted_s is not None:
            event["posted_s"] = posted_s
        self.trace.append(event)


def _autocast(device: torch.device, dtype: torch.dtype | None
              ) -> contextlib.AbstractContextManager[object]:
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)
