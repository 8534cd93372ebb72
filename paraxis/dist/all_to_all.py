"""A differentiable all-to-all of rows, the one exchange two axes share: expert parallelism
sends tokens to the ranks holding their experts (`moe.expert_parallel`), all-to-all context
parallelism sends head groups to the ranks that attend over them
(`context_parallel.all_to_all`).

`send[j]` consecutive rows go to rank j of the group; `receive[i]` rows arrive from rank i,
in rank order. Backward sends the gradients back the way the rows came (the transposed
splits). Each call reports what it sent to `count(phase, rows, send)`, where each axis keeps
its own figures (the MoE counter, the CP pair counter).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.autograd.function import FunctionCtx

from paraxis.dist.watchdog import WATCH

# (phase, the rows sent, the send splits): what an axis records of one call
Count = Callable[[str, torch.Tensor, list[int]], None]


def exchange(rows: torch.Tensor, send: list[int], receive: list[int],
             group: dist.ProcessGroup | None, phase: str, axis: str | None,
             count: Count) -> torch.Tensor:
    """One all-to-all of `rows` (not differentiable; `AllToAll` is)."""
    rows = rows.contiguous()
    out = rows.new_empty((sum(receive), *rows.shape[1:]))
    count(phase, rows, send)
    with WATCH.waiting("all_to_all", group, axis=axis):
        dist.all_to_all_single(out, rows, output_split_sizes=receive,
                               input_split_sizes=send, group=group)
    return out


class AllToAll(torch.autograd.Function):
    """`exchange` forward; backward, the gradients back by the transposed splits."""

    @staticmethod
    def forward(ctx: FunctionCtx, rows: torch.Tensor, send: list[int], receive: list[int],
                group: dist.ProcessGroup | None, axis: str | None,
                count: Count) -> torch.Tensor:
        ctx.send, ctx.receive, ctx.group, ctx.axis, ctx.count = send, receive, group, axis, count
        return exchange(rows, send, receive, group, "forward", axis, count)

    @staticmethod
    def backward(ctx: FunctionCtx, grad: torch.Tensor
                 ) -> tuple[torch.Tensor, None, None, None, None, None]:
        back = exchange(grad, ctx.receive, ctx.send, ctx.group, "backward", ctx.axis,
                        ctx.count)
        return back, None, None, None, None, None
