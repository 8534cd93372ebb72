"""Ring attention: causal attention over a sequence split across the cp ranks of a group.

Why: activation memory grows with the sequence, and tensor parallelism's sequence
parallelism divides it only by the TP degree. Splitting the sequence itself over cp ranks
divides every activation by cp; attention is the one layer that mixes tokens across ranks,
and ring attention (Liu et al. 2023, "Ring Attention with Blockwise Transformers") computes
it exactly without ever holding the whole sequence's K and V: each rank keeps its queries,
and the K/V blocks travel around the ring of cp ranks, one hop per step, while each rank
computes its queries against the block at hand and merges the partial results with their
log-sum-exp (`kernel.merge`). Megatron-LM's context parallelism runs the same ring with the
zig-zag split that balances causal work (`spec/cp_balance.py`).

Each rank holds chunks i and 2*cp-1-i (its local sequence); at step t it holds the K/V of
rank i-t. Blocks above the causal diagonal are skipped, the diagonal one (step 0, its own
chunks) runs causal, the others run unmasked, one flash call each (`balance.ring_blocks`).

Overlap: step t's K/V message for step t+1 is posted before step t computes, and waited
for only when step t+1 needs it: the transfer runs behind the block's compute. A hop is one
`all_to_all_single` whose only non-empty parts go to the next rank and come from the
previous one (what PyTorch's own ring template does, `_AllToAllRotater`). On gloo a
collective runs on the process group's worker threads, while `isend`/`irecv` pairs
(`batch_isend_irecv`) cost the computing thread more: on short sequences, where the hops'
latency is not hidden, the ring ran faster this way on this 2-core machine, and on long ones
(seq 2048 and more) the two tie (`python -m bench --only cp` times the ring next to
PyTorch's). Every rank posts its hops in the same order (K/V of step t, then in backward
dK/dV of step t), as collectives require.

Memory (what a rank saves for backward): its q, its own k, v (kv-head width), the merged
output and an fp32 log-sum-exp per head and query: exactly what single-device flash attention
saves for s/cp tokens. No received K/V block is kept: backward passes them around again.

Communication per rank and layer, for local K/V of B = 2 * batch * kv_heads * (s/cp) *
head_dim elements (K and V): forward (cp-1) messages of B elements; backward (cp-1) of B
again (K/V) plus cp-1 of B fp32 elements (the dK/dV accumulators, which visit every other
rank once and come home). Grouped-query attention shrinks B by heads/kv_heads: K/V never
travel at the query-head width.

Backward: each rank computes, per block, dq for its rows (kept) and dk, dv for the block's
keys, from the merged out and lse (exact, `kernel`). The dK/dV of a K/V block are summed
along the ring: the accumulator starts at the first rank the block visits after its owner,
travels one hop behind the block, each holder adds its share, and after cp-1 hops it
arrives back at the owner, which adds its own share (computed at step 0).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.autograd.function import FunctionCtx

from paraxis.dist.watchdog import WATCH
from paraxis.parallel.context.kernel import (
    BlockIds,
    ChunkDocuments,
    backward_blocks,
    check_qkv,
    empty_result,
    forward_blocks,
)
from paraxis.spec.cp_balance import heads_share, record, ring_blocks, ring_source


class _Pass:
    """`tensor` passed one rank on around the ring (sent to the next rank, the previous
    rank's received), posted now; `wait()` returns what arrived."""

    def __init__(self, tensor: torch.Tensor, group: dist.ProcessGroup | None,
                 phase: str) -> None:
        cp, rank = dist.get_world_size(group), dist.get_rank(group)
        self.work: dist.Work | None = None
        self.received = tensor  # a ring of one rank passes a tensor to itself
        self.group, previous, following = group, (rank - 1) % cp, (rank + 1) % cp
        self.source = previous if group is None else dist.get_global_rank(group, previous)
        if cp == 1:
            return
        self.sent = tensor  # kept alive until the hop has completed
        self.received = torch.empty_like(tensor)
        size = tensor.numel()
        record(phase, sent_bytes=size * tensor.element_size())
        self.work = dist.all_to_all_single(
            self.received.view(-1), tensor.view(-1),
            output_split_sizes=[size if peer == previous else 0 for peer in range(cp)],
            input_split_sizes=[size if peer == following else 0 for peer in range(cp)],
            group=group, async_op=True)

    def wait(self) -> torch.Tensor:
        with WATCH.waiting("recv", self.group, peer=self.source, axis="cp"):
            if self.work is not None:
                self.work.wait()
        return self.received


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: FunctionCtx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                group: dist.ProcessGroup | None, scale: float,
                documents: ChunkDocuments | None, share: int) -> torch.Tensor:
        chunk_len = check_qkv(q, k, v)
        cp, rank = dist.get_world_size(group), dist.get_rank(group)
        out, lse = empty_result(q)
        kv = torch.stack([k, v])  # K and V travel as one message a step
        with heads_share(share):
            for step in range(cp):
                arriving = _Pass(kv, group, "forward") if step < cp - 1 else None
                forward_blocks(q, kv, ring_blocks(rank, step, cp), chunk_len, scale, out, lse,
                               step_ids(documents, rank, step, cp))
                if arriving is not None:
                    kv = arriving.wait()
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.scale, ctx.chunk_len, ctx.documents = group, scale, chunk_len, documents
        ctx.share = share
        return out

    @staticmethod
    def backward(ctx: FunctionCtx, grad_out: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None, None, None, None]:
        with heads_share(ctx.share):
            return _RingAttention._backward(ctx, grad_out)

    @staticmethod
    def _backward(ctx: FunctionCtx, grad_out: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None, None, None, None]:
        q, k, v, out, lse = ctx.saved_tensors
        group, scale, chunk_len = ctx.group, ctx.scale, ctx.chunk_len
        cp, rank = dist.get_world_size(group), dist.get_rank(group)
        grad_out = grad_out.contiguous()
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        kv = torch.stack([k, v])
        own_grad = torch.zeros(0)  # this rank's share of its own K/V's gradient (step 0)
        accumulator: _Pass | None = None  # the dK/dV of the K/V at hand, from earlier holders
        for step in range(cp):
            arriving = _Pass(kv, group, "backward") if step < cp - 1 else None
            grad_kv = torch.zeros(kv.shape, dtype=torch.float32, device=kv.device)
            backward_blocks(grad_out, q, kv, out, lse, ring_blocks(rank, step, cp), chunk_len,
                            scale, dq, grad_kv, step_ids(ctx.documents, rank, step, cp))
            if step == 0:
                own_grad = grad_kv  # stays here; the other ranks' shares come home at the end
            else:
                if accumulator is not None:
                    grad_kv += accumulator.wait()
                # One hop behind its K/V block: from the last step it reaches the block's owner.
                accumulator = _Pass(grad_kv, group, "backward")
            if arriving is not None:
                kv = arriving.wait()
        grad_kv = own_grad if accumulator is None else own_grad + accumulator.wait()
        return (dq.to(q.dtype), grad_kv[0].to(k.dtype), grad_kv[1].to(v.dtype), None, None,
                None, None)


def step_ids(documents: ChunkDocuments | None, rank: int, step: int, cp: int
             ) -> BlockIds | None:
    """The document ids of this rank's queries and of the K/V it holds at ring step `step`
    (None: no packing)."""
    if documents is None:
        return None
    return documents.at(rank, ring_source(rank, step, cp), cp)


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   group: dist.ProcessGroup | None = None, scale: float | None = None,
                   documents: ChunkDocuments | None = None, share: int = 1) -> torch.Tensor:
    """Causal attention of this rank's queries over the whole sequence, split across `group`
    (None: the world) by the zig-zag split (`chunks.local_part`).

    q: (batch, heads, 2L, head_dim), k, v: (batch, kv_heads, 2L, head_dim), this rank's
    local sequence (chunks r and 2*cp-1-r of length L, RoPE already applied at their global
    positions). Returns (batch, heads, 2L, head_dim), what `F.scaled_dot_product_attention(
    ..., is_causal=True, enable_gqa=True)` on the whole sequence gives at these positions;
    differentiable in q, k, v. `scale` defaults to 1/sqrt(head_dim). `documents`: packed
    documents (`kernel.ChunkDocuments`, from `packing.split_documents`); attention then
    stays within each document. `share`: this rank runs 1/share of the heads (two-level
    cp), so its pairs count as a share-th (`balance.heads_share`)."""
    return _RingAttention.apply(q, k, v, group, q.shape[-1] ** -0.5 if scale is None else scale,
                                documents, share)
