"""The training step's contract with a parallel runtime (`Engine`), and its single-device form.

A training loop needs four things from a runtime, whatever the layout:

    loss = engine.forward_backward(inputs, targets)   # this dp rank's share of the batch
    norm = engine.clip_grad_norm(max_norm)            # global norm, over every shard
    engine.optimizer_step(lr)
    engine.zero_grad()

and checkpointing, tracing and reporting need a few more (`Engine` lists them all).
`LocalEngine` is the reference: one process holds the whole model, splits its batch into
`layout.microbatches` microsteps (gradient accumulation) and runs AdamW. The parallel
engines (`data_parallel.DataParallelEngine`, `pipeline_parallel.engine.PipelineEngine`)
subclass it and change only what their axis changes.

Document packing (`paraxis.parallel.context.packing`) reaches the engine in two places:
`microbatches` masks
the targets after each end-of-document input, and each microbatch's mean loss is weighed by
its count of unmasked targets (`packing.loss_weights`), so that every layout's loss is the
mean over the global batch's unmasked targets, as on one device.
"""

from __future__ import annotations

import contextlib
import functools
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from paraxis.dist.params import local_norm_squares
from paraxis.engine.optimizer import (
    clip_factor,
    init_adam_state,
    make_adamw,
    optimizer_tensors,
    step_unless_nonfinite,
    storage_bytes,
)
from paraxis.model.checkpoint.entries import (
    Checkpointable,
    Entry,
    LossScale,
    Place,
    buffer_entries,
    whole_entries,
)
from paraxis.model.transformer import single_device_buffers, single_device_parameters
from paraxis.parallel.context.packing import counted_targets, loss_weights, mask_targets, weigh
from paraxis.parallel.experts.layer import MoE, moe_layers, set_aux_loss_scale
from paraxis.spec.layout import Layout
from paraxis.spec.optimizer import DEFAULT_ADAMW, AdamW

if TYPE_CHECKING:
    from paraxis.dist.groups import ParallelGroups


class Engine(Checkpointable, Protocol):
    """What the training loop, checkpoints, traces and reports may ask of a runtime.

    A Protocol rather than a base class: callers depend on these names only, and an engine
    that shares no code with `LocalEngine` (one wrapping another library, say) fits as long
    as it has them. The engines here do share code, by subclassing `LocalEngine`.
    """

    model: nn.Module  # this rank's modules (a Transformer, or a stage's parts)

    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        """This rank's parameters under their single-device names, each once."""
        ...

    def forward_backward(self, inputs: torch.Tensor, targets: torch.Tensor) -> float: ...

    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor, lr: float,
                   max_norm: float) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole step without waiting for the device: (loss, gradient norm) on it."""
        ...

    def evaluate(self, inputs: torch.Tensor, targets: torch.Tensor) -> float: ...

    def no_sync(self, last: bool) -> contextlib.AbstractContextManager[Any]: ...

    def clip_grad_norm(self, max_norm: float) -> float: ...

    def skipped_overflow(self) -> bool: ...

    def optimizer_step(self, lr: float) -> None: ...

    def zero_grad(self) -> None: ...

    def trace_events(self) -> list[dict[str, Any]]:
        """The last step's recorded actions (Chrome trace events); empty if none recorded."""
        ...

    def memory_report(self) -> dict[str, int]:
        """Bytes this rank holds, by kind (params, grads, optimizer)."""
        ...


class LocalEngine:
    """The whole model in one process: the reference every layout is compared with."""

    _nonfinite: torch.Tensor | None = None  # set by `train_step` for its optimizer step

    def __init__(self, model: nn.Module, layout: Layout, adamw: AdamW = DEFAULT_ADAMW,
                 end_of_document: int | None = None) -> None:
        """end_of_document: pack documents ending at this id (it masks and weighs the loss;
        `paraxis.parallel.context.packing`); None: no packing."""
        self.model = model
        self.layout = layout
        self.end_of_document = end_of_document
        self.autocast_dtype: torch.dtype | None = None  # fp32 compute
        self.groups: ParallelGroups | None = None
        self.loss_scaler: LossScale | None = None
        self.optimizer = make_adamw(model.parameters(), adamw)
        init_adam_state(self.optimizer)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @functools.cached_property
    def moe_layers(self) -> list[MoE]:
        """The model's MoE blocks (none in a dense model), found at the first step."""
        return moe_layers(self.model)

    def microbatches(self, inputs: torch.Tensor, targets: torch.Tensor
                     ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The microbatches of this share; packing masks their targets."""
        count = self.layout.microbatches
        if self.end_of_document is not None:
            targets = mask_targets(inputs, targets, self.end_of_document)
        return list(zip(inputs.chunk(count), targets.chunk(count), strict=True))

    def loss_weights(self, micro: list[tuple[torch.Tensor, torch.Tensor]]
                     ) -> list[float] | None:
        """Packing: each microbatch's weight (`packing.loss_weights`); None otherwise."""
        if self.end_of_document is None:
            return None
        counts = counted_targets([y for _, y in micro])
        total = self.count_over_replicas(sum(counts))
        return loss_weights(counts, total, self.layout.dp * self.layout.cp)

    def count_over_replicas(self, count: int) -> int:
        """The sum of `count` over the ranks sharing the batch (dp x cp): one here."""
        return count

    def train_step(self, inputs: torch.Tensor, targets: torch.Tensor, lr: float,
                   max_norm: float) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward and backward, clipping and the AdamW step, queued on the device without
        the host waiting for it: the loss and the gradient norm come back as tensors there,
        to be read once the whole step is queued (a GPU then never idles while the host
        reads a number mid-step). A step whose loss or norm is not finite leaves the
        weights and AdamW's state as they were, decided on the device (the fused kernel's
        `found_inf`); the caller learns of it when it reads the two numbers. The caller
        still calls `zero_grad` after."""
        loss = self.forward_backward_on_device(inputs, targets)
        norm = self.clip_grad_norm_on_device(max_norm)
        self._nonfinite = ~(torch.isfinite(loss.to(norm.device)) & torch.isfinite(norm))
        try:
            self.optimizer_step(lr)
        finally:
            self._nonfinite = None
        return loss, norm

    def forward_backward(self, inputs: torch.Tensor, targets: torch.Tensor) -> float:
        """Accumulate gradients over the microbatches; return the mean loss (waiting for the
        device to compute it: `train_step` does not wait)."""
        return float(self.forward_backward_on_device(inputs, targets))

    def forward_backward_on_device(self, inputs: torch.Tensor, targets: torch.Tensor
                                   ) -> torch.Tensor:
        """`forward_backward`, its mean loss left on the device (fp64, 0-d)."""
        micro = self.microbatches(inputs, targets)
        weights = self.loss_weights(micro)
        losses = []
        # an MoE's aux loss starts its gradient as the loss does: / microbatches, * fp16 scale
        set_aux_loss_scale(self.moe_layers, self.loss_scale() / len(micro))
        for index, (x, y) in enumerate(micro):
            with self.no_sync(last=index == len(micro) - 1):
                loss = self.loss(x, y)
                if weights is not None:
                    loss = weigh(loss, weights[index])
                if len(micro) > 1:  # mean over microbatches = batch mean
                    loss = loss / len(micro)
                self.backward(loss)
            losses.append(loss.detach())
        self.finish_grad_sync()
        # one microbatch: its loss as it is, without a kernel for a sum of one
        total = losses[0].double() if len(losses) == 1 else torch.stack(losses).double().sum()
        return self.reduce_loss(total)

    @torch.no_grad()
    def evaluate(self, inputs: torch.Tensor, targets: torch.Tensor) -> float:
        """Mean loss on this dp rank's share of a held-out batch; no gradients, no update."""
        micro = self.microbatches(inputs, targets)
        weights = self.loss_weights(micro) or [1.0] * len(micro)
        total = torch.stack([weigh(self.loss(x, y), w).double() for (x, y), w in
                             zip(micro, weights, strict=True)]).sum() / len(micro)
        return float(self.reduce_loss(total))

    def backward(self, loss: torch.Tensor) -> None:
        """Mixed-precision engines scale the loss here (fp16 loss scaling)."""
        loss.backward()

    def loss_scale(self) -> float:
        """fp16's dynamic loss scale (1: none), by which `backward` multiplies the loss."""
        return self.loss_scaler.scale if self.loss_scaler is not None else 1.0

    def finish_grad_sync(self) -> None:
        """Data-parallel engines wait for their in-flight gradient reductions here."""

    def loss(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if self.autocast_dtype is None:
            return self.model(inputs, targets)
        with torch.autocast(self.device.type, dtype=self.autocast_dtype):
            return self.model(inputs, targets)

    def no_sync(self, last: bool) -> contextlib.AbstractContextManager[Any]:
        """Data-parallel engines communicate only on the last microstep."""
        return contextlib.nullcontext()

    def reduce_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The mean of this rank's loss (a 0-d tensor) over the ranks sharing the batch."""
        return loss

    def grad_norm_squared(self) -> torch.Tensor:
        """Squared global gradient norm; parallel engines reduce it over their groups
        (`paraxis.dist.params.global_norm_squared`)."""
        sharded, replicated = local_norm_squares(list(self.model.parameters()))
        return sharded + replicated

    def clip_grad_norm(self, max_norm: float) -> float:
        """Global L2 norm of all gradients; scale them down to `max_norm` when above it."""
        return float(self.clip_grad_norm_on_device(max_norm))

    def clip_grad_norm_on_device(self, max_norm: float) -> torch.Tensor:
        """`clip_grad_norm`, the norm left on the device and the clipping decided there."""
        norm = self.grad_norm_squared().sqrt()
        if max_norm > 0:
            grads = [p.grad for group in self.optimizer.param_groups for p in group["params"]
                     if p.grad is not None]
            torch._foreach_mul_(grads, clip_factor(norm, max_norm))
        return norm

    def skipped_overflow(self) -> bool:
        """True when fp16 loss scaling found inf/NaN gradients this step and skips the
        update itself (an expected event, not a numerical fault)."""
        return False

    def optimizer_step(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        step_unless_nonfinite(self.optimizer, self._nonfinite)

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    # ------------------------------------------------------ checkpoints, traces, reports

    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        return single_device_parameters(self.model)

    def place(self) -> Place:
        """This rank's TP slice and replica (dp x cp; for experts, among the ranks holding
        the same ones), for its checkpoint entries."""
        if self.groups is None:
            return Place()
        return Place(self.groups.tp_rank, self.layout.tp, self.groups.replica_rank,
                     self.groups.expert_dp_rank, self.groups.replicate_rank)

    def checkpoint_entries(self) -> list[Entry]:
        """Whole parameters and their AdamW moments (no ZeRO: every dp rank holds all), and
        the model's buffers."""
        trainable = [(n, p) for n, p in self.named_parameters() if p.requires_grad]
        return whole_entries(trainable, self.optimizer.state, self.place()) + \
            self.buffer_entries()

    def buffer_entries(self) -> list[Entry]:
        """The training state the model keeps in buffers (an MoE block's routing bias)."""
        return buffer_entries(single_device_buffers(self.model), self.place())

    def trace_events(self) -> list[dict[str, Any]]:
        return []

    def memory_report(self) -> dict[str, int]:
        """Bytes this rank holds for parameters, gradients and optimizer states, counted from
        tensor storages (each storage once)."""
        params = [p.data for p in self.model.parameters()]
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        return {"params": storage_bytes(params), "grads": storage_bytes(grads),
                "optimizer": storage_bytes(optimizer_tensors(self.optimizer))}
