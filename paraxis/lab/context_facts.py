"""The context-parallelism widget's figures: who holds which chunk of the sequence, who
computes which block of causal attention and at which ring step, and what each way of
moving K/V sends and keeps, for every setting of the widget's sliders.

All from the functions the runtime runs and the pictures draw: `context_parallel.balance`
(`rank_chunks`, `ring_source`, `ring_blocks`, `pairs_per_rank`, `sent_bytes_per_rank`,
`saved_bytes_per_rank`) and `viz.context` (`block_cells`, the kernel calls unfolded onto
(query chunk, key chunk) cells; `contiguous_pairs`, what the zig-zag split avoids).
"""

from __future__ import annotations

from paraxis.context_parallel.balance import (
    VARIANTS,
    pairs_per_rank,
    rank_chunks,
    ring_blocks,
    ring_source,
    saved_bytes_per_rank,
    sent_bytes_per_rank,
)
from paraxis.viz.context import block_cells, blocks_text, contiguous_pairs
from paraxis.viz.style import RANK_COLOURS

CP_DEGREES = [2, 4, 8]
SEQ_LENS = [8192, 32768, 131072]
# The attention priced per layer: Llama 3 8B's (32 query heads, 8 K/V heads of 128), one
# sequence, bf16 (Dubey et al. 2024, Table 3).
SHAPE = {"batch": 1, "heads": 32, "kv_heads": 8, "head_dim": 128, "bytes": 2}


def ring_steps(cp: int) -> list[list[dict]]:
    """Per ring step, per rank: whose K/V it holds and the blocks it computes against them
    ("q0,7×k6": its query chunks against those key chunks; "skip": none)."""
    return [[{"source": ring_source(rank, step, cp),
              "blocks": blocks_text(ring_blocks(rank, step, cp), rank_chunks(rank, cp),
                                    rank_chunks(ring_source(rank, step, cp), cp))}
             for rank in range(cp)] for step in range(cp)]


def costs(seq_len: int, cp: int) -> dict:
    """Pairs per rank (zig-zag, contiguous) and, per variant, the bytes one rank sends
    (forward, backward) and saves for backward in one layer; one device's saved bytes."""
    shape = [SHAPE[k] for k in ("batch", "heads", "kv_heads")]
    tail = [SHAPE["head_dim"], cp, SHAPE["bytes"]]
    return {"zigzag": pairs_per_rank(seq_len, cp), "contiguous": contiguous_pairs(seq_len, cp),
            "sent": {v: sent_bytes_per_rank(v, *shape, seq_len, *tail) for v in VARIANTS},
            "saved": {v: saved_bytes_per_rank(*shape, seq_len, *tail, variant=v)
                      for v in VARIANTS},
            "one_device_saved": saved_bytes_per_rank(*shape, seq_len, SHAPE["head_dim"], 1,
                                                     SHAPE["bytes"])}


def context_facts() -> dict:
    settings = {}
    for cp in CP_DEGREES:
        cells = {v: [[q, k, cell.rank, cell.step, cell.half]
                     for (q, k), cell in sorted(block_cells(cp, v).items())] for v in VARIANTS}
        settings[str(cp)] = {"chunks": [list(rank_chunks(r, cp)) for r in range(cp)],
                             "cells": cells, "steps": ring_steps(cp),
                             "costs": {str(s): costs(s, cp) for s in SEQ_LENS}}
    return {"cp": CP_DEGREES, "seq_lens": SEQ_LENS, "variants": list(VARIANTS),
            "shape": SHAPE, "colours": RANK_COLOURS, "settings": settings}
