"""Two-level context parallelism: an all-to-all of heads inside small groups, the ring (or
the all-gather) across them.

Why: the all-to-all variant (DeepSpeed-Ulysses) is cheap on an all-to-all network such as
NVLink inside a node, but its degree is bounded by the heads and every token's q, k, v
cross it; the ring carries only K/V and hides it behind compute, which suits the slower
links between nodes. With cp = a x r, a layer first trades heads for sequence inside each
group of a consecutive cp ranks (`cp_a2a`, a node's GPUs when tp is small), then runs the
ring or the all-gather across the r groups, then trades back: Megatron-LM's
`cp_comm_type="a2a+p2p"` with `hierarchical_context_parallel_sizes`, and "USP" (Fang and
Zhao 2024, "USP: A Unified Sequence Parallelism Approach", arXiv:2405.07719).

Why it composes exactly: rank g*a + i holds chunks g*a + i and 2*cp-1-(g*a + i) of the 2*cp
zig-zag chunks (`balance.rank_chunks`). After the all-to-all, rank (g, i) holds, for heads/a
heads, what its group's a ranks held; put in the order `chunks.full_sequence` gives a
ranks, that is fine chunks g*a .. g*a+a-1 and then their mirror images: coarse chunks g and
2r-1-g of the 2r chunks of a*L tokens, the zig-zag local part of rank g of r. So the ring
(or the all-gather) over the r ranks of the same index i in every group runs unchanged on
chunks a times longer, and the result goes back by the reverse all-to-all
(`chunks.by_rank`). Packed documents need only the coarser chunk table
(`ChunkDocuments.coarser`).

Cost per rank and layer: the all-to-all's q, k, v and output as the all-to-all variant
moves them but over a ranks (its (a-1)/a leaves the rank), and the ring's K/V of heads/a
heads over r ranks: the hops are as large as a ring over cp ranks sends but a-fold fewer.
Heads: the query heads a rank holds divide by a, its K/V heads divide by a or divide it
(repeated as the all-to-all variant does: its `to_head_split` and `from_head_split` are the
two exchanges here).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist

from paraxis.parallel.context.all_gather import all_gather_attention
from paraxis.parallel.context.all_to_all import from_head_split, to_head_split
from paraxis.parallel.context.kernel import ChunkDocuments, check_qkv
from paraxis.parallel.context.ring import ring_attention

ACROSS = {"ring": ring_attention, "all_gather": all_gather_attention}


class CpLevels(NamedTuple):
    """The two groups of two-level cp: this rank's all-to-all group (its a consecutive cp
    ranks) and the group across (the rank of the same index in each all-to-all group,
    whose rank there is its group's index)."""

    a2a: dist.ProcessGroup | None
    across: dist.ProcessGroup | None


def hierarchical_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           levels: CpLevels, variant: str = "ring",
                           scale: float | None = None,
                           documents: ChunkDocuments | None = None) -> torch.Tensor:
    """Causal attention of this rank's queries over the whole sequence split across the cp
    ranks of `levels`; the contract of `ring.ring_attention`. `variant` ("ring" or
    "all_gather") runs across the all-to-all groups."""
    check_qkv(q, k, v)
    a = dist.get_world_size(levels.a2a)
    # the group's chunks for heads/a heads: the coarse zig-zag pair of `levels.across`
    q_heads, k_heads, v_heads = to_head_split(q, k, v, levels.a2a)
    coarse = None if documents is None else documents.coarser(a)
    out = ACROSS[variant](q_heads, k_heads, v_heads, levels.across, scale, coarse, share=a)
    return from_head_split(out, levels.a2a)
