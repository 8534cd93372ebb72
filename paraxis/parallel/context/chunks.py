"""The balanced split of a sequence over the context-parallel ranks, on tensors.

Rank i of cp holds chunks i and 2*cp-1-i of the 2*cp equal chunks (why: `spec/cp_balance.py`),
concatenated in that order: its local sequence. The token at local position j therefore sits
at global position `positions(seq_len, rank, cp)[j]`, which is what RoPE must rotate it by
(`paraxis.model.transformer.rotary` assumes arange(seq) and needs these instead under cp).

    local = local_part(tokens, rank, cp)            # (batch, s/cp, ...) of (batch, s, ...)
    pos = positions(s, rank, cp)                    # (s/cp,) global positions of those tokens
    whole = full_sequence([part_0, ..., part_cp-1]) # back to (batch, s, ...)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from paraxis.spec.cp_balance import check_split, rank_chunks

SEQ_DIM = 1  # (batch, seq, ...), as paraxis.model.transformer's activations


def local_part(x: torch.Tensor, rank: int, cp: int, dim: int = SEQ_DIM) -> torch.Tensor:
    """Rank `rank`'s local sequence of `x`: its two chunks along `dim`, concatenated."""
    check_split(x.shape[dim], cp)
    chunks = x.chunk(2 * cp, dim=dim)
    return torch.cat([chunks[c] for c in rank_chunks(rank, cp)], dim=dim)


def full_sequence(parts: Sequence[torch.Tensor], dim: int = SEQ_DIM) -> torch.Tensor:
    """The whole sequence from every rank's local part (`parts[r]` from rank r), in order."""
    cp = len(parts)
    chunks: list[torch.Tensor | None] = [None] * (2 * cp)
    for rank, part in enumerate(parts):
        first, second = rank_chunks(rank, cp)
        chunks[first], chunks[second] = part.chunk(2, dim=dim)
    return torch.cat(chunks, dim=dim)  # type: ignore[arg-type]


def by_rank(x: torch.Tensor, cp: int, dim: int = SEQ_DIM) -> torch.Tensor:
    """Every rank's local part of `x`, stacked in front: (cp, ...). The layout a
    reduce-scatter over the cp group takes to hand each rank its own part."""
    return torch.stack([local_part(x, rank, cp, dim) for rank in range(cp)])


def positions(seq_len: int, rank: int, cp: int,
              device: torch.device | str | None = None) -> torch.Tensor:
    """The global positions (int64) of rank `rank`'s local tokens, in local order."""
    chunk_len = check_split(seq_len, cp)
    return torch.cat([torch.arange(c * chunk_len, (c + 1) * chunk_len, device=device)
                      for c in rank_chunks(rank, cp)])
