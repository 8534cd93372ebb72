"""Flat, padded parameter groups and the dp collectives on them.

A `FlatUnit` lays a list of parameters end to end in one 1-D index space, padded to a
multiple of the dp size so that every dp rank owns one equal, contiguous shard (ZeRO,
Rajbhandari et al. 2020, sec. 5: each rank updates 1/N_d of the states). Equal shards are
what reduce-scatter and all-gather need (gloo rejects unequal sizes); the pad
is at most dp-1 elements per unit.

The collectives below take `group=None` to mean "dp has size 1": they degenerate to copies,
so ZeRO with dp=1 runs the same code path without a process group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist
from torch import nn

from paraxis.dist.collectives import all_gather_single, reduce_scatter_single
from paraxis.dist.groups import through_host
from paraxis.engine.optimizer import decays
from paraxis.spec.collectives import zero_form


@dataclass(frozen=True)
class Piece:
    """Where one parameter meets this rank's shard: param[lo:hi] (flattened) is
    shard[shard_lo:shard_hi]."""

    param: nn.Parameter
    lo: int
    hi: int
    shard_lo: int
    shard_hi: int


class FlatUnit:
    """Parameters that communicate together: one bucket (ZeRO-0/1/2) or one block (ZeRO-3).
    The weight-decayed ones (`optimizer.decays`: the matrices) come first, in their given
    order, then the rest: AdamW on fp32 masters then decays one leading range of the unit
    (`kernels.master_adamw`)."""

    def __init__(self, params: list[nn.Parameter], dp_size: int, dp_rank: int,
                 device: torch.device | None = None,
                 group: dist.ProcessGroup | None = None) -> None:
        self.params = ([p for p in params if decays(p)]
                       + [p for p in params if not decays(p)])
        # the decayed parameters' elements, [0, decayed) of the flat index space
        self.decayed = sum(p.numel() for p in params if decays(p))
        # the ranks (dp_size of them) that reduce this unit's gradients and share its
        # states: the replica group, or for experts under expert parallelism the ranks
        # holding the same experts; None: a group of one
        self.group = group
        self.offsets: list[int] = []
        total = 0
        for p in self.params:
            self.offsets.append(total)
            total += p.numel()
        self.numel = total
        self.padded_numel = -(-total // dp_size) * dp_size
        self.shard_numel = self.padded_numel // dp_size
        self.shard_start = dp_rank * self.shard_numel
        self.dtype = params[0].dtype
        # where its flat buffers live: the parameters' device, unless they are still on
        # the meta device and take their storage from those buffers
        self.device = device or params[0].device

    def spans(self) -> list[tuple[nn.Parameter, int, int]]:
        """(param, start, end) of each parameter in the flat index space."""
        return [(p, o, o + p.numel()) for p, o in zip(self.params, self.offsets, strict=True)]

    def pieces(self) -> list[Piece]:
        """The parts of parameters that fall in this rank's shard (padding excluded)."""
        lo_shard, hi_shard = self.shard_start, self.shard_start + self.shard_numel
        out = []
        for p, start, end in self.spans():
            lo, hi = max(start, lo_shard), min(end, hi_shard)
            if lo < hi:
                out.append(Piece(p, lo - start, hi - start, lo - lo_shard, hi - lo_shard))
        return out

    def whole_pieces(self) -> list[Piece]:
        """Every parameter whole, placed in the full flat range: the "shard" of a rank that
        updates all of the unit (ZeRO-0 with fp32 master weights)."""
        return [Piece(p, 0, end - start, start, end) for p, start, end in self.spans()]

    def shard_of(self, full: torch.Tensor) -> torch.Tensor:
        return full[self.shard_start: self.shard_start + self.shard_numel]


# Bytes of ZeRO's parameter gathers and gradient reductions started on this rank, by kind:
# the size of the full (padded) flat tensor each one assembles or reduces, whatever the
# backend moves on the wire for it. Tests and tools/probes/zero3_pipeline.py read and reset it to
# check the planner's count (`plan.zero3.zero3_pipeline_volume`).
VOLUME = {"all_gather": 0, "reduce_scatter": 0}


def _count(kind: str, full: torch.Tensor) -> None:
    VOLUME[kind] += full.numel() * full.element_size()


class Work(Protocol):
    """A collective in flight (torch's `dist.Work`, or `_Done` when there was nothing to do)."""

    def wait(self) -> bool: ...


class _Done:
    """A finished work handle for collectives that had nothing to do (dp = 1)."""

    def wait(self) -> bool:
        return True


def all_reduce_sum(tensor: torch.Tensor, group: dist.ProcessGroup | None) -> Work:
    if group is None:
        return _Done()
    return dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group, async_op=True)


def reduce_scatter_sum(shard: torch.Tensor, full: torch.Tensor,
                       group: dist.ProcessGroup | None) -> Work:
    """`shard` = this rank's part of the sum of every rank's `full`, once the work is done.
    On gloo, `full` itself receives the whole sum (see `_sums_in_place`)."""
    if group is None:
        shard.copy_(full)
        return _Done()
    _count("reduce_scatter", full)
    if _sums_in_place(group):
        mine = full[group_rank(group) * shard.numel():][:shard.numel()]
        return _ThenCopy(dist.all_reduce(full, group=group, async_op=True), mine, shard)
    return reduce_scatter_single(shard, full, op=dist.ReduceOp.SUM, group=group,
                                      async_op=True)


def all_gather(full: torch.Tensor, shard: torch.Tensor,
               group: dist.ProcessGroup | None) -> Work:
    """`full` = every rank's `shard`, end to end, once the work is done. `shard` may be this
    rank's own part of `full` on gloo, not on NCCL."""
    if group is None:
        if full.data_ptr() != shard.data_ptr():
            full.copy_(shard)
        return _Done()
    _count("all_gather", full)
    if _sums_in_place(group):
        lo = group_rank(group) * shard.numel()
        mine = full[lo:lo + shard.numel()]
        if mine.data_ptr() != shard.data_ptr():
            mine.copy_(shard)
        full[:lo].zero_()
        full[lo + shard.numel():].zero_()  # others' parts: x + 0 + ... + 0 is x, exactly
        return dist.all_reduce(full, group=group, async_op=True)
    return all_gather_single(full, shard, group=group, async_op=True)


def _sums_in_place(group: dist.ProcessGroup) -> bool:
    """Whether the ZeRO collectives run as in-place all-reduces (`spec.collectives.zero_form`:
    on gloo, gathering is an all-reduce of the buffer zero-filled around this rank's part,
    reduce-scattering an all-reduce followed by a copy of this rank's part)."""
    return zero_form("reduce_scatter", through_host(group)) == "all_reduce"


class _ThenCopy:
    """A work handle that copies `source` into `target` once its collective is done."""

    def __init__(self, work: Work, source: torch.Tensor, target: torch.Tensor) -> None:
        self.work, self.source, self.target = work, source, target

    def wait(self) -> bool:
        done = self.work.wait()
        self.target.copy_(self.source)
        return done


def group_size(group: dist.ProcessGroup | None) -> int:
    return 1 if group is None else dist.get_world_size(group)


def group_rank(group: dist.ProcessGroup | None) -> int:
    return 0 if group is None else dist.get_rank(group)
