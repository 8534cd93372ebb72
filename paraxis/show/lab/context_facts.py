"""The context-parallelism widget's figures: who holds which chunk of the sequence, who
computes which block of causal attention and at which ring step, and what each way of
moving K/V sends and keeps, for every setting of the widget's sliders.

All from the functions the runtime runs and the pictures draw: `context_parallel.balance`
(`rank_chunks`, `ring_source`, `ring_blocks`, `pairs_per_rank`, `saved_bytes_per_rank`),
`plan.context.wire_bytes_per_rank` (what the planner prices) and `viz.context`
(`block_cells`, the kernel calls unfolded onto (query chunk, key chunk) cells;
`contiguous_pairs`, what the zig-zag split avoids).
"""

from __future__ import annotations

from paraxis.plan.context import wire_bytes_per_rank
from paraxis.show.viz.context import block_cells, blocks_text, contiguous_pairs
from paraxis.show.viz.style import RANK_COLOURS
from paraxis.spec.cp_balance import (
    VARIANTS,
    pairs_per_rank,
    rank_chunks,
    ring_blocks,
    ring_source,
    saved_bytes_per_rank,
)
from paraxis.spec.model_config import PRESETS

CP_DEGREES = [2, 4, 8]
SEQ_LENS = [8192, 32768, 131072]
# The attention priced per layer: Llama 3 8B's (32 query heads, 8 K/V heads of 128), one
# sequence, bf16.
MODEL = "llama3-8b"
SHAPE = {"batch": 1, "heads": PRESETS[MODEL].n_heads, "kv_heads": PRESETS[MODEL].n_kv_heads,
         "head_dim": PRESETS[MODEL].head_dim, "bytes": 2}


def ring_steps(cp: int) -> list[list[dict]]:
    """Per ring step, per rank: whose K/V it holds and the blocks it computes against them
    ("q1,6×k0": its query chunks against those key chunks; "skip": none)."""
    steps = []
    for step in range(cp):
        sources = [ring_source(rank, step, cp) for rank in range(cp)]
        steps.append([{"source": source,
                       "blocks": blocks_text(ring_blocks(rank, step, cp), rank_chunks(rank, cp),
                                             rank_chunks(source, cp))}
                      for rank, source in enumerate(sources)])
    return steps


def costs(seq_len: int, cp: int) -> dict:
    """Pairs per rank (zig-zag, contiguous) and, per variant, the bytes that leave one rank
    (forward, backward) and that it keeps for backward in one layer's attention core; one
    device's kept bytes."""
    shape = {"batch": SHAPE["batch"], "heads": SHAPE["heads"], "kv_heads": SHAPE["kv_heads"],
             "seq_len": seq_len, "head_dim": SHAPE["head_dim"],
             "bytes_per_element": SHAPE["bytes"]}
    return {"zigzag": pairs_per_rank(seq_len, cp), "contiguous": contiguous_pairs(seq_len, cp),
            "sent": {v: wire_bytes_per_rank(v, cp=cp, **shape) for v in VARIANTS},
            "saved": {v: saved_bytes_per_rank(cp=cp, variant=v, **shape) for v in VARIANTS},
            "one_device_saved": saved_bytes_per_rank(cp=1, **shape)}


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
