"""All-gather context parallelism: every rank gathers the whole sequence's K/V once a layer.

Why a second variant: the ring sends K/V in cp-1 point-to-point steps, each of which must
hide behind one block's compute. With grouped-query attention K/V are small (Llama 3 70B:
8 kv heads for 64 query heads, 1/8 of the queries' width), and one all-gather of them per
layer costs little, runs as a single well-tuned collective, and leaves the attention as a
few large kernel calls. Llama 3's long-context training gathered K/V this way (Dubey et al.
2024, Sec. 3.3.2: "all-gather based context parallelism", with the same 2*cp-chunk causal
balance); Megatron-LM offers it beside the ring (its `cp_comm_type="all_gather"`).

Forward: post the all-gather of the local K/V (kv-head width), and while it is in flight
compute the rank's own K/V, the causal diagonal block, which needs nothing from the others;
then, against each other rank's K/V as they arrive in the gathered buffer (rank by rank), the
one rectangle below the diagonal (`balance.ring_blocks`: the ring's blocks, here all at
hand at once). Nothing above the diagonal is computed, each rank computes exactly the pairs
the ring computes, and the partial results merge by log-sum-exp. The gathered buffer is
used as it lands (rank-major): no copy puts it in sequence order.

Backward: gather again (blocking: every block but the diagonal needs it), compute the other
ranks' blocks, their dK/dV landing in a rank-major fp32 buffer, post the reduce-scatter
that hands each owner its summed share, and compute the diagonal block while it runs; the
rank's own share is added when the reduce-scatter has returned (its own slot carries zeros).
So each pass hides one collective behind the diagonal block's compute. On gloo the
reduce-scatter is an all-to-all of the same parts, each owner summing the cp it receives
(`spec.collectives`: gloo's own reduce-scatter is slower).

Memory: a rank saves what the ring saves (its q, own k, v, the merged output, the fp32
log-sum-exp) and not the gathered K/V, which backward gathers again: the saved bytes fall
with cp. While the layer runs, the gathered K/V (cp times the local K/V) exist briefly.

Communication per rank and layer, for local K/V of B elements (as in `ring.py`): forward
one all-gather of B per rank (each receives (cp-1) * B); backward one more all-gather, and a
reduce-scatter of the fp32 dK/dV of the whole sequence (cp * B elements in, B out) that sums
every rank's share of each rank's K/V gradient onto its owner.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.autograd.function import FunctionCtx

from paraxis.dist.collectives import SummedInto, all_gather_single, reduce_scatter_into
from paraxis.dist.watchdog import WATCH
from paraxis.parallel.context.kernel import (
    ChunkDocuments,
    backward_blocks,
    check_qkv,
    empty_result,
    forward_blocks,
)
from paraxis.parallel.context.ring import step_ids
from paraxis.spec.cp_balance import heads_share, record, ring_blocks, ring_source


class _Collective:
    """One collective over the cp group, posted now; `wait()` returns its output."""

    def __init__(self, name: str, output: torch.Tensor, work: dist.Work | SummedInto,
                 group: dist.ProcessGroup | None) -> None:
        self.name, self.output, self.work, self.group = name, output, work, group

    def wait(self) -> torch.Tensor:
        with WATCH.waiting(self.name, self.group, axis="cp"):
            self.work.wait()
        return self.output


def _gather_kv(kv: torch.Tensor, group: dist.ProcessGroup | None, phase: str) -> _Collective:
    """Every rank's stacked K/V, (cp, 2, batch, kv_heads, 2L, head_dim): rank r's at [r]."""
    cp = dist.get_world_size(group)
    gathered = kv.new_empty((cp, *kv.shape))
    record(phase, sent_bytes=kv.numel() * kv.element_size())
    # Collectives concatenate along dim 0 (gloo takes no stacked form).
    work = all_gather_single(gathered.flatten(0, 1), kv, group=group, async_op=True)
    return _Collective("all_gather", gathered, work, group)


def _reduce_scatter_kv(parts: torch.Tensor, group: dist.ProcessGroup | None) -> _Collective:
    """This rank's (2, batch, kv_heads, 2L, head_dim) dK/dV summed over the group, from every
    rank's rank-major fp32 dK/dV `parts` (cp, 2, ...)."""
    mine = parts.new_empty(parts.shape[1:])
    record("backward", sent_bytes=parts.numel() * parts.element_size())
    work = reduce_scatter_into(mine, parts.flatten(0, 1), group=group, async_op=True)
    return _Collective("reduce_scatter", mine, work, group)


class _AllGatherAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: FunctionCtx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                group: dist.ProcessGroup | None, scale: float,
                documents: ChunkDocuments | None, share: int) -> torch.Tensor:
        chunk_len = check_qkv(q, k, v)
        cp, rank = dist.get_world_size(group), dist.get_rank(group)
        kv = torch.stack([k, v])
        out, lse = empty_result(q)
        with heads_share(share):
            gathering = _gather_kv(kv, group, "forward")
            forward_blocks(q, kv, ring_blocks(rank, 0, cp), chunk_len, scale, out, lse,
                           step_ids(documents, rank, 0, cp))
            gathered = gathering.wait()
            for step in range(1, cp):
                forward_blocks(q, gathered[ring_source(rank, step, cp)],
                               ring_blocks(rank, step, cp), chunk_len, scale, out, lse,
                               step_ids(documents, rank, step, cp))
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.scale, ctx.chunk_len, ctx.documents = group, scale, chunk_len, documents
        ctx.share = share
        return out

    @staticmethod
    def backward(ctx: FunctionCtx, grad_out: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None, None, None, None]:
        with heads_share(ctx.share):
            return _AllGatherAttention._backward(ctx, grad_out)

    @staticmethod
    def _backward(ctx: FunctionCtx, grad_out: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None, None, None, None]:
        q, k, v, out, lse = ctx.saved_tensors
        group, scale, chunk_len = ctx.group, ctx.scale, ctx.chunk_len
        cp, rank = dist.get_world_size(group), dist.get_rank(group)
        grad_out = grad_out.contiguous()
        kv = torch.stack([k, v])
        gathered = _gather_kv(kv, group, "backward").wait()
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        parts = torch.zeros(gathered.shape, dtype=torch.float32, device=q.device)
        for step in range(1, cp):
            source = ring_source(rank, step, cp)
            backward_blocks(grad_out, q, gathered[source], out, lse, ring_blocks(rank, step, cp),
                            chunk_len, scale, dq, parts[source],
                            step_ids(ctx.documents, rank, step, cp))
        del gathered
        scattering = _reduce_scatter_kv(parts, group)
        own = torch.zeros(kv.shape, dtype=torch.float32, device=q.device)
        backward_blocks(grad_out, q, kv, out, lse, ring_blocks(rank, 0, cp), chunk_len, scale,
                        dq, own, step_ids(ctx.documents, rank, 0, cp))
        grad_kv = scattering.wait() + own
        return (dq.to(q.dtype), grad_kv[0].to(k.dtype), grad_kv[1].to(v.dtype), None, None,
                None, None)


def all_gather_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         group: dist.ProcessGroup | None = None, scale: float | None = None,
                         documents: ChunkDocuments | None = None, share: int = 1
                         ) -> torch.Tensor:
    """Causal attention of this rank's queries over the whole sequence split across `group`;
    the same contract as `ring.ring_attention`, computed against gathered K/V."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return _AllGatherAttention.apply(q, k, v, group, scale, documents, share)
