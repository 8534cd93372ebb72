"""A real ring all-reduce built from point-to-point messages, that can show its work.

`dist.all_reduce` hides its algorithm; this one runs the schedule of
`paraxis.plan.ring_steps.ring_schedule` with `isend`/`irecv` between ring neighbours, so the
chunk states it records after each step can be compared, exactly, with the simulator's.
It is a teaching and testing tool: the library's collectives remain the fast path.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from paraxis.dist.groups import batch_isend_irecv
from paraxis.dist.watchdog import WATCH
from paraxis.plan.ring_steps import REDUCE_SCATTER, chunk_bounds, ring_schedule
from paraxis.spec.errors import ParaxisError


def ring_all_reduce(tensor: torch.Tensor, group: dist.ProcessGroup | None = None,
                    record: bool = False) -> list[torch.Tensor]:
    """Sum `tensor` (1-D, contiguous) over `group` in place, ring by ring.

    Returns, when `record`, a clone of this rank's whole vector after each of the 2(N-1)
    steps (else an empty list).
    """
    if tensor.dim() != 1 or not tensor.is_contiguous():
        raise ParaxisError("ring_all_reduce takes a contiguous 1-D tensor; flatten it first")
    ranks = dist.get_world_size(group)
    me = dist.get_rank(group)
    if tensor.numel() < ranks:
        raise ParaxisError(f"a tensor of {tensor.numel()} elements cannot be cut into {ranks} "
                           "ring chunks; pad it to at least one element per rank")
    # Group-local ring neighbours as global ranks: send/recv address the default group.
    right = dist.get_global_rank(group, (me + 1) % ranks) if group else (me + 1) % ranks
    left = dist.get_global_rank(group, (me - 1) % ranks) if group else (me - 1) % ranks
    chunks = [tensor[a:b] for a, b in chunk_bounds(tensor.numel(), ranks)]
    states: list[torch.Tensor] = []
    for phase, transfers in ring_schedule(ranks):
        send_chunk = transfers[me].chunk
        recv_chunk = transfers[(me - 1) % ranks].chunk  # what my left neighbour sends me
        incoming = torch.empty_like(chunks[recv_chunk])
        # Post both as one group before waiting: every rank sends and receives at once. A
        # blocking send first would deadlock a ring whose transport does not buffer, and NCCL
        # runs a pair's messages in order on one stream: with 2 ranks both would send first.
        ops = [dist.P2POp(dist.isend, chunks[send_chunk].clone(), right, group=group),
               dist.P2POp(dist.irecv, incoming, left, group=group)]
        with WATCH.waiting("recv", peer=left, axis="ring"):
            for work in batch_isend_irecv(ops):
                work.wait()
        if phase == REDUCE_SCATTER:
            chunks[recv_chunk].add_(incoming)
        else:
            chunks[recv_chunk].copy_(incoming)
        if record:
            states.append(tensor.clone())
    return states
