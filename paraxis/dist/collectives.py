"""The single-tensor all-gather and reduce-scatter under the names of the running torch, and
the reduce-scatter as each backend runs it best.

torch 2.13 calls them `all_gather_single` and `reduce_scatter_single` and deprecates the
older `all_gather_into_tensor` and `reduce_scatter_tensor`; torch 2.12 and earlier have only
the older names. Every call site takes them from here, so paraxis runs on both.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from paraxis.dist.groups import through_host
from paraxis.spec.collectives import reduce_scatter_form

all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = (getattr(dist, "reduce_scatter_single", None)
                         or dist.reduce_scatter_tensor)


class SummedInto:
    """An all-to-all in flight: `wait()` adds the blocks it brought, in rank order, into
    `out`."""

    def __init__(self, work: dist.Work | None, arriving: torch.Tensor, out: torch.Tensor) -> None:
        self.work, self.arriving, self.out = work, arriving, out

    def wait(self) -> bool:
        if self.work is not None:
            self.work.wait()
        self.out.copy_(self.arriving[0])
        for block in self.arriving[1:]:
            self.out += block
        return True


def reduce_scatter_into(out: torch.Tensor, full: torch.Tensor,
                        group: dist.ProcessGroup | None = None, async_op: bool = False
                        ) -> dist.Work | SummedInto | None:
    """`out` = this rank's block of the sum over the group of every rank's `full` (dim 0 in
    as many equal blocks as ranks, in rank order), carried as `spec.collectives` says for the
    group's backend. With `async_op` a handle whose `wait()` completes `out`."""
    if reduce_scatter_form(through_host(group)) == "reduce_scatter":
        return reduce_scatter_single(out, full, group=group, async_op=async_op)
    arriving = torch.empty_like(full)  # block r: rank r's part of this rank's sum
    work = dist.all_to_all_single(arriving, full, group=group, async_op=async_op)
    summed = SummedInto(work if async_op else None, arriving.view(-1, *out.shape), out)
    if async_op:
        return summed
    summed.wait()
    return None
