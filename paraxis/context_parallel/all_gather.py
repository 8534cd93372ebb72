"""All-gather context parallelism: every rank gathers the whole sequence's K/V once a layer.

Why a second variant: the ring sends K/V in cp-1 point-to-point steps, each of which must
hide behind one block's compute. With grouped-query attention K/V are small (Llama 3 70B:
8 kv heads for 64 query heads, 1/8 of the queries' width), and one all-gather of them per
layer costs little, runs as a single well-tuned collective, and leaves the attention as a
few large kernel calls. Llama 3's long-context training gathered K/V this way (Dubey et al.
2024, Sec. 3.3.2: "all-gather based context parallelism", with the same 2*cp-chunk causal
balance); Megatron-LM offers it beside the ring (its `cp_comm_type="all_gather"`).

Forward: all-gather the local K/V (kv-head width), reorder them into sequence order, then
per local query chunk g run two flash calls: the keys of chunks [0, g) unmasked and chunk g
causal (`balance.prefix_blocks`); nothing above the diagonal is computed, and each rank
computes exactly the pairs the ring computes. The partial results merge by log-sum-exp.

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

from paraxis.context_parallel.balance import prefix_blocks, record
from paraxis.context_parallel.chunks import by_rank, full_sequence
from paraxis.context_parallel.kernel import (
    backward_blocks,
    check_qkv,
    empty_result,
    forward_blocks,
)
from paraxis.runtime.watchdog import WATCH

SEQ = -2  # the sequence dim of (..., seq, head_dim)


def _gather_kv(k: torch.Tensor, v: torch.Tensor, group: dist.ProcessGroup | None,
               phase: str) -> torch.Tensor:
    """(2, batch, kv_heads, s, head_dim): the whole sequence's K and V, in sequence order."""
    cp = dist.get_world_size(group)
    local = torch.stack([k, v])
    # Collectives concatenate along dim 0 (gloo takes no stacked form): rank r's K/V are
    # gathered[2r:2r+2].
    gathered = local.new_empty((cp * 2, *local.shape[1:]))
    record(phase, sent_bytes=local.numel() * local.element_size())
    with WATCH.waiting("all_gather", group, axis="cp"):
        dist.all_gather_single(gathered, local, group=group)
    return full_sequence(list(gathered.chunk(cp)), dim=SEQ)


def _reduce_scatter_kv(grad_full: torch.Tensor, group: dist.ProcessGroup | None
                       ) -> torch.Tensor:
    """This rank's (2, batch, kv_heads, 2L, head_dim) dK/dV, summed over the group, from
    every rank's dK/dV of the whole sequence (in sequence order)."""
    cp = dist.get_world_size(group)
    parts = by_rank(grad_full, cp, dim=SEQ).flatten(0, 1)  # rank r's at [2r:2r+2]
    mine = parts.new_empty((2, *parts.shape[1:]))
    record("backward", sent_bytes=parts.numel() * parts.element_size())
    with WATCH.waiting("reduce_scatter", group, axis="cp"):
        dist.reduce_scatter_single(mine, parts, group=group)
    return mine


class _AllGatherAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: FunctionCtx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                group: dist.ProcessGroup | None, scale: float) -> torch.Tensor:
        chunk_len = check_qkv(q, k, v)
        cp, rank = dist.get_world_size(group), dist.get_rank(group)
        kv = _gather_kv(k, v, group, "forward")
        out, lse = empty_result(q)
        forward_blocks(q, kv, prefix_blocks(rank, cp), chunk_len, scale, out, lse)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.scale, ctx.chunk_len = group, scale, chunk_len
        return out

    @staticmethod
    def backward(ctx: FunctionCtx, grad_out: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None, None]:
        q, k, v, out, lse = ctx.saved_tensors
        group, scale, chunk_len = ctx.group, ctx.scale, ctx.chunk_len
        cp, rank = dist.get_world_size(group), dist.get_rank(group)
        grad_out = grad_out.contiguous()
        kv = _gather_kv(k, v, group, "backward")
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        grad_kv = torch.zeros(kv.shape, dtype=torch.float32, device=kv.device)
        backward_blocks(grad_out, q, kv, out, lse, prefix_blocks(rank, cp), chunk_len, scale,
                        dq, grad_kv)
        mine = _reduce_scatter_kv(grad_kv, group)
        return dq.to(q.dtype), mine[0].to(k.dtype), mine[1].to(v.dtype), None, None


def all_gather_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         group: dist.ProcessGroup | None = None, scale: float | None = None
                         ) -> torch.Tensor:
    """Causal attention of this rank's queries over the whole sequence split across `group`;
    the same contract as `ring.ring_attention`, computed against gathered K/V."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return _AllGatherAttention.apply(q, k, v, group, scale)
