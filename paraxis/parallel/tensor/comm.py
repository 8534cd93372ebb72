"""The communication operators of tensor parallelism, as autograd functions.

Megatron-LM (Shoeybi et al. 2019, sec. 3, fig. 3) builds tensor parallelism on two
conjugate operators:

- `copy_to_tp` ("f"): identity forward, all-reduce backward. Enters a parallel region: the
  replicated input feeds rank-local column-parallel matmuls, so its gradient is the sum of
  every rank's partial gradient.
- `reduce_from_tp` ("g"): all-reduce forward, identity backward. Leaves the region: the
  row-parallel matmul's partial sums become the full output.

Sequence parallelism (Korthikanti et al. 2022, sec. 4.2.2, fig. 5) splits each all-reduce
into its two halves and moves the norms between them, onto sequence shards:

- `gather_from_sequence` ("g" with SP): all-gather forward along the sequence dim,
  reduce-scatter backward.
- `reduce_scatter_to_sequence` ("g-bar"): reduce-scatter forward, all-gather backward.
- `scatter_to_sequence`: keep this rank's sequence chunk forward, all-gather backward.
- `gather_for_replicated`: all-gather forward, keep this rank's chunk backward (the
  conjugate of the one above, around a module every rank runs whole).

The replicated parameters that SP applies to sequence shards (norms, row-parallel biases,
learned positions) get partial gradients, summed over the TP group once a step by the
engine, as Megatron-LM does (`tensor_parallel.partial`).

Tensors are (batch, seq, ...); the sequence dim is 1. Every call records itself in the
active `CommCounter`s. `group=None` means "no TP" and every operator is the identity.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.autograd.function import FunctionCtx

from paraxis.dist.collectives import all_gather_single, reduce_scatter_into
from paraxis.dist.watchdog import WATCH
from paraxis.parallel.tensor.counter import record
from paraxis.spec.errors import ParaxisError

SEQ_DIM = 1


_EAGER: list[list] = []  # [function, its torch.compiler.disable wrapper or None]


def eager_collective(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """`--compile` compiles each block's forward; the collectives in it stay eager (dynamo
    breaks its graph around them rather than tracing the process group and the watchdog).
    The `torch.compiler.disable` wrappers are made by `keep_collectives_eager`, called before
    anything is compiled: making them here would import torch._dynamo into every rank (1.3 s
    and about 70 MB of resident memory a rank) whether it compiles or not."""
    entry = [fn, None]
    _EAGER.append(entry)

    @functools.wraps(fn)
    def call(*args: object, **kwargs: object) -> torch.Tensor:
        return (entry[1] or fn)(*args, **kwargs)
    return call


def keep_collectives_eager() -> None:
    """Make the collectives graph breaks under torch.compile (call before compiling)."""
    for entry in _EAGER:
        entry[1] = entry[1] or torch.compiler.disable(entry[0])


def _size(group: dist.ProcessGroup | None) -> int:
    return 1 if group is None else dist.get_world_size(group)


def _all_reduce(x: torch.Tensor, group: dist.ProcessGroup, phase: str,
                purpose: str = "activation") -> torch.Tensor:
    x = x.contiguous()
    record("all_reduce", x.numel() * x.element_size(), phase, purpose)
    with WATCH.waiting("all_reduce", group):
        dist.all_reduce(x, group=group)
    return x


def _all_gather_seq(x: torch.Tensor, group: dist.ProcessGroup, phase: str) -> torch.Tensor:
    """(b, s/tp, ...) on every rank -> (b, s, ...), rank order along the sequence."""
    tp = _size(group)
    # Collectives concatenate along dim 0, so the sequence dim travels in front (Megatron
    # keeps activations as (seq, batch, hidden) for this reason).
    local = x.transpose(0, SEQ_DIM).contiguous()
    record("all_gather", local.numel() * local.element_size(), phase)
    out = local.new_empty((local.shape[0] * tp, *local.shape[1:]))
    with WATCH.waiting("all_gather", group):
        all_gather_single(out, local, group=group)
    return out.transpose(0, SEQ_DIM).contiguous()


def _reduce_scatter_seq(x: torch.Tensor, group: dist.ProcessGroup, phase: str
                        ) -> torch.Tensor:
    """(b, s, ...) partial sums on every rank -> this rank's summed (b, s/tp, ...)."""
    tp = _size(group)
    full = x.transpose(0, SEQ_DIM).contiguous()
    if full.shape[0] % tp:
        raise ParaxisError(f"sequence parallelism needs the sequence length ({full.shape[0]}) "
                           f"divisible by tp ({tp}); change seq_len or tp")
    record("reduce_scatter", full.numel() * full.element_size(), phase)
    out = full.new_empty((full.shape[0] // tp, *full.shape[1:]))
    with WATCH.waiting("reduce_scatter", group):
        reduce_scatter_into(out, full, group=group)
    return out.transpose(0, SEQ_DIM).contiguous()


def _sequence_chunk(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    tp, rank = _size(group), dist.get_rank(group)
    if x.shape[SEQ_DIM] % tp:
        raise ParaxisError(f"sequence parallelism needs the sequence length "
                           f"({x.shape[SEQ_DIM]}) divisible by tp ({tp}); change seq_len or tp")
    return x.chunk(tp, dim=SEQ_DIM)[rank].contiguous()


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx: FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _all_reduce(grad, ctx.group, "backward"), None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        return _all_reduce(x.clone(), group, "forward")

    @staticmethod
    def backward(ctx: FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class _GatherFromSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return _all_gather_seq(x, group, "forward")

    @staticmethod
    def backward(ctx: FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        # Every rank's consumers saw the whole sequence: their gradients are partial sums.
        return _reduce_scatter_seq(grad, ctx.group, "backward"), None


class _ReduceScatterToSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return _reduce_scatter_seq(x, group, "forward")

    @staticmethod
    def backward(ctx: FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _all_gather_seq(grad, ctx.group, "backward"), None


class _GatherForReplicated(torch.autograd.Function):
    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return _all_gather_seq(x, group, "forward")

    @staticmethod
    def backward(ctx: FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        # Every rank computed the whole sequence's gradient: this rank's chunk is its own.
        return _sequence_chunk(grad, ctx.group), None


class _ScatterToSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx: FunctionCtx, x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        return _sequence_chunk(x, group)

    @staticmethod
    def backward(ctx: FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _all_gather_seq(grad, ctx.group, "backward"), None


@eager_collective
def copy_to_tp(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Identity forward, all-reduce backward (Megatron's f)."""
    return x if _size(group) == 1 else _CopyToTP.apply(x, group)


@eager_collective
def reduce_from_tp(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """All-reduce forward, identity backward (Megatron's g)."""
    return x if _size(group) == 1 else _ReduceFromTP.apply(x, group)


@eager_collective
def gather_from_sequence(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """All-gather along the sequence forward, reduce-scatter backward (SP's g)."""
    return x if _size(group) == 1 else _GatherFromSequence.apply(x, group)


@eager_collective
def reduce_scatter_to_sequence(x: torch.Tensor, group: dist.ProcessGroup | None
                               ) -> torch.Tensor:
    """Reduce-scatter along the sequence forward, all-gather backward (SP's g-bar)."""
    return x if _size(group) == 1 else _ReduceScatterToSequence.apply(x, group)


@eager_collective
def gather_for_replicated(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """All-gather along the sequence forward, this rank's chunk backward: the whole sequence
    for a module that every TP rank runs whole (a mixture of experts' block under SP),
    whose output goes back through `scatter_to_sequence` so every rank's backward sees the
    whole sequence's gradient."""
    return x if _size(group) == 1 else _GatherForReplicated.apply(x, group)


@eager_collective
def scatter_to_sequence(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """This rank's sequence chunk forward, all-gather backward."""
    return x if _size(group) == 1 else _ScatterToSequence.apply(x, group)
