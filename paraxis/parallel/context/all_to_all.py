"""All-to-all context parallelism (DeepSpeed-Ulysses): split the heads, not the sequence,
for the length of the attention core.

Outside attention every rank holds s/cp tokens of every head, as with the other variants.
Around the core, one all-to-all hands rank j all s tokens of head group j (heads/cp query
heads with their K/V heads); each rank runs ordinary causal attention over the whole
sequence for its heads, one unsplit kernel call, no blocks to merge; a second all-to-all
hands the output back: s/cp tokens of every head (Jacobs et al. 2023, "DeepSpeed Ulysses",
arXiv:2309.14509; Megatron-LM's `cp_comm_type="a2a"`).

Why a third variant: the ring and the all-gather move only K/V, but each rank receives the
whole sequence's K/V per layer whatever cp is. An all-to-all sends (cp-1)/cp of the rank's
own q, k, v and output: a volume per rank that falls with cp, carried by every link at once
on an all-to-all network (NVLink inside a node). The attention itself runs at the kernel's
full-sequence rate. What it costs: q and the output travel too (with grouped queries they
outweigh K/V many times), nothing hides the exchange (the core needs all of it), and cp is
bounded by the head count.

The rule: the query heads a rank holds (per TP rank) divide by cp; its K/V heads either
divide by cp or divide cp. In the second case (fewer K/V heads than ranks: Llama 3 70B's 8
kv heads over tp 8 leave 1) each K/V head is repeated to the ranks whose queries read it
before the exchange, and those copies are what travels and what is saved (`kv_heads_sent`).

Order: the local sequence is the zig-zag pair of chunks (`balance.rank_chunks`), RoPE
already applied at the global positions. After the first all-to-all a rank holds every
rank's pair: it puts the chunks in sequence order (`chunks.full_sequence`) so that the
plain causal mask is right, and the output goes back as each rank's pair (`chunks.by_rank`).

Balance: every rank computes the whole causal triangle for heads/cp heads, 1/cp of the work,
exactly the zig-zag split's per-rank count (`balance.pairs_per_rank`), whatever the split.

Memory: the kernel saves q, k, v, the output and the fp32 log-sum-exp for heads/cp heads
over s tokens: the bytes single-device flash attention saves for s/cp tokens of every head,
plus the repeated K/V copies where there are any (`balance.saved_bytes_per_rank`).

Communication per rank and layer: forward one all-to-all of q, k and v together and one of
the output; backward the reverse (the output's gradient, then dq, dk, dv together), in the
activation dtype. Each call's input is the rank's local tensors; (cp-1)/cp of it leaves.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from paraxis.dist.all_to_all import AllToAll
from paraxis.parallel.context.chunks import by_rank, full_sequence
from paraxis.parallel.context.kernel import ChunkDocuments, check_qkv
from paraxis.parallel.context.packing import Documents, packed_attention
from paraxis.spec.cp_balance import check_heads, kv_heads_sent, record

HEAD_DIM, SEQ_DIM = 1, 2  # (batch, heads, seq, head_dim), as the attention core's tensors


def exchange(parts: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """All-to-all of `parts` (cp, ...): part j goes to rank j, and what arrives from rank i
    lands at [i]; backward sends the gradients back the same way (`runtime.all_to_all`).
    The pair counter records each call's whole input."""
    ones = [1] * parts.shape[0]
    return AllToAll.apply(parts, ones, ones, group, "cp", _record)


def _record(phase: str, parts: torch.Tensor, send: list[int]) -> None:
    record(phase, sent_bytes=parts.numel() * parts.element_size())


def by_head_group(x: torch.Tensor, cp: int) -> torch.Tensor:
    """(batch, heads, L, d) -> (cp, batch, heads/cp, L, d): head group j at [j]."""
    return x.unflatten(HEAD_DIM, (cp, -1)).movedim(HEAD_DIM, 0)


def repeat_kv(x: torch.Tensor, cp: int) -> torch.Tensor:
    """K or V with each head repeated for the ranks whose queries read it: kv_heads_sent
    heads (a view's copy, whose backward sums the copies' gradients)."""
    batch, kv_heads, seq, head_dim = x.shape
    copies = kv_heads_sent(kv_heads, cp) // kv_heads
    if copies == 1:
        return x
    return x.unsqueeze(2).expand(batch, kv_heads, copies, seq, head_dim).reshape(
        batch, kv_heads * copies, seq, head_dim)


def all_to_all_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         group: dist.ProcessGroup | None = None, scale: float | None = None,
                         documents: ChunkDocuments | None = None) -> torch.Tensor:
    """Causal attention of this rank's queries over the whole sequence split across `group`;
    the same contract as `ring.ring_attention`, computed on a head split. Packed documents:
    the whole sequence's ids (`documents.ids`) give the kernel its document mask
    (`packing.packed_attention`)."""
    check_qkv(q, k, v)  # on GPU 16-bit, as the others: SDPA's flash kernel (fp32 would
    # fall back to the math kernel with grouped K/V, an s x s matrix per head)
    cp = dist.get_world_size(group)
    q_heads, k_heads, v_heads = to_head_split(q, k, v, group)
    seq = q.shape[SEQ_DIM] * cp
    pairs = seq * (seq + 1) // 2 // cp  # heads/cp heads' whole triangle
    record("forward", pairs=pairs)
    if documents is None:
        out = F.scaled_dot_product_attention(q_heads, k_heads, v_heads, is_causal=True,
                                             scale=scale, enable_gqa=True)
    else:  # the mask needs the ids alone (positions are RoPE's, applied before)
        packed = Documents(documents.ids, documents.ids)  # positions: unused
        out = packed_attention(q_heads, k_heads, v_heads, packed, True, scale)
    if out.requires_grad:  # backward computes the same pairs again
        out.register_hook(lambda grad: record("backward", pairs=pairs))
    return from_head_split(out, group)


def to_head_split(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  group: dist.ProcessGroup | None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The first all-to-all over `group` (n ranks): this rank's local q, k, v (every head,
    its zig-zag pair of chunks) -> heads/n heads (K/V repeated where fewer than n) of every
    rank's chunks, in `chunks.full_sequence` order. Also two-level cp's inner step."""
    ranks, heads = dist.get_world_size(group), q.shape[HEAD_DIM]
    check_heads("all_to_all", heads, k.shape[1], ranks)
    k, v = repeat_kv(k, ranks), repeat_kv(v, ranks)
    widths = [heads // ranks, k.shape[1] // ranks, v.shape[1] // ranks]
    parts = torch.cat([by_head_group(t, ranks) for t in (q, k, v)], dim=HEAD_DIM + 1)
    arrived = exchange(parts, group)  # [i]: rank i's tokens, my heads
    whole = full_sequence(list(arrived.unbind(0)), dim=SEQ_DIM)
    q_heads, k_heads, v_heads = whole.split(widths, dim=HEAD_DIM)
    return q_heads, k_heads, v_heads


def from_head_split(out: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """The second all-to-all: the output of heads/n heads over the group's chunks back to
    this rank's chunks of every head, laid out token by token (as `kernel.empty_result`)."""
    ranks = dist.get_world_size(group)
    back = exchange(by_rank(out, ranks, dim=SEQ_DIM), group)  # [j]: head group j
    # (ranks, batch, heads/n, seq, dim) -> (batch, seq, heads, dim), then heads second
    batch, _, seq, dim = back.shape[1:]
    rows = back.permute(1, 3, 0, 2, 4).contiguous().view(batch, seq, -1, dim)
    return rows.transpose(1, 2)
