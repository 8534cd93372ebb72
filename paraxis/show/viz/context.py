"""Context parallelism as pictures, part one: who holds which chunk of the sequence, and
who computes which block of causal attention (part two, `show/viz/context_ring.py`: how K/V reach
the queries).

Everything is drawn from `paraxis.spec.cp_balance`, the functions the runtime
itself runs: `rank_chunks` (the zig-zag split `chunks.local_part` and `chunks.positions`
cut), `ring_source` and `ring_blocks` (whose K/V a rank holds at each ring step, and the
kernel calls it makes against them, as `ring.py` loops over them), `gathered_blocks` (the
all-gather variant's calls) and `pairs_per_rank` (the count the kernels are tested
against). The block matrix is those kernel calls unfolded onto (query chunk, key chunk)
cells, so a test can check that the picture adds up to `pairs_per_rank`. Under the
all-to-all variant every rank computes every cell, for its heads/cp heads.

    plot_chunks(seq_len=4096, cp=4)        # the split, the block matrix, pairs per rank
    block_cells(cp=4)[(7, 2)]              # Cell(rank=0, step=2, half=False)
"""

from __future__ import annotations

from dataclasses import dataclass

from matplotlib.axes import Axes
from matplotlib.collections import PatchCollection
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Polygon, Rectangle
from matplotlib.ticker import FuncFormatter

from paraxis.show.viz.style import OKABE_ITO, RANK_COLOURS
from paraxis.spec.cp_balance import (
    VARIANTS,
    Block,
    blocks_between,
    check_split,
    gathered_blocks,
    gathered_chunks,
    pairs_per_rank,
    rank_chunks,
    ring_blocks,
    ring_source,
)
from paraxis.spec.errors import ParaxisError

MAX_LABELLED_CP = 8  # beyond this, cells and ring nodes are too small for text


@dataclass(frozen=True)
class Cell:
    """One (query chunk, key chunk) block of the causal attention matrix, as computed."""

    rank: int | None  # who computes it: the query chunk's holder (None: every rank, each
    # for its heads/cp heads, the all-to-all variant)
    step: int | None  # the ring step it is computed at (None: the all-gather's one pass)
    half: bool  # on the diagonal: causal inside, about half its pairs computed


def check_variant(variant: str) -> str:
    if variant not in VARIANTS:
        raise ParaxisError(f"unknown context-parallel attention {variant!r}; use one of "
                           f"{', '.join(VARIANTS)}")
    return variant


def check_cp(cp: int) -> int:
    if not isinstance(cp, int) or cp < 1:
        raise ParaxisError(f"the context-parallel degree must be a positive integer, got "
                           f"cp={cp!r}")
    return cp


def _unfold(block: Block, query_chunks: tuple[int, ...], key_chunks: tuple[int, ...]
            ) -> list[tuple[int, int, bool]]:
    """A kernel call's (query chunk, key chunk, half) cells. Inside a causal block the local
    order is the global order (a rank's chunks ascend), so the mask falls cell by cell."""
    cells = []
    for qi in range(block.q_start, block.q_stop):
        for ki in range(block.k_start, block.k_stop):
            above = ki - block.k_start > qi - block.q_start
            if block.causal and above:
                continue  # masked entirely inside the causal call
            half = block.causal and ki - block.k_start == qi - block.q_start
            cells.append((query_chunks[qi], key_chunks[ki], half))
    return cells


def block_cells(cp: int, variant: str = "ring") -> dict[tuple[int, int], Cell]:
    """(query chunk, key chunk) -> who computes it, for every block under the causal
    diagonal: the runtime's kernel calls (`ring_blocks` or `gathered_blocks`) unfolded; the
    all-to-all variant's one causal call over the whole sequence, on every rank."""
    check_cp(cp)
    check_variant(variant)
    if variant == "all_to_all":
        return {(q, k): Cell(None, None, q == k) for q in range(2 * cp) for k in range(q + 1)}
    cells: dict[tuple[int, int], Cell] = {}
    for rank in range(cp):
        if variant == "ring":
            calls = [(step, rank_chunks(ring_source(rank, step, cp), cp), block)
                     for step in range(cp) for block in ring_blocks(rank, step, cp)]
        else:  # all-gather: the ring's blocks against the gathered K/V, rank by rank
            calls = [(None, gathered_chunks(cp), block) for block in gathered_blocks(rank, cp)]
        for step, key_chunks, block in calls:
            for q, k, half in _unfold(block, rank_chunks(rank, cp), key_chunks):
                if (q, k) in cells:
                    raise AssertionError(f"block (q{q}, k{k}) computed twice")
                cells[(q, k)] = Cell(rank, step, half)
    return cells


def cell_pairs(cells: dict[tuple[int, int], Cell], seq_len: int, cp: int) -> list[int]:
    """(query, key) pairs per head per rank the cells add up to: a full cell L*L, a diagonal
    one L(L+1)/2 (the causal square, as `Block.pairs` counts it); a cell every rank computes
    for its heads/cp heads counts 1/cp to each."""
    chunk_len = check_split(seq_len, cp)
    pairs = [0] * cp  # times cp, to stay in integers
    for cell in cells.values():
        count = chunk_len * (chunk_len + 1) // 2 if cell.half else chunk_len ** 2
        for rank in range(cp) if cell.rank is None else (cell.rank,):
            pairs[rank] += count * (1 if cell.rank is None else cp)
    return [p // cp for p in pairs]


def contiguous_pairs(seq_len: int, cp: int) -> list[int]:
    """The pairs per rank if rank r held chunks 2r and 2r+1 (one contiguous piece): what the
    zig-zag split avoids. Counted by `blocks_between`, the rule the zig-zag's calls use."""
    chunk_len = check_split(seq_len, cp)
    held = [(2 * r, 2 * r + 1) for r in range(cp)]
    return [sum(block.pairs(chunk_len) for other in held for block in blocks_between(mine, other))
            for mine in held]


def rank_colour(rank: int) -> str:
    return RANK_COLOURS[rank % len(RANK_COLOURS)]


def text_colour(colour: str) -> str:
    """Black text on light fills (yellow, sky), white on dark ones."""
    red, green, blue = to_rgb(colour)
    return "black" if 0.299 * red + 0.587 * green + 0.114 * blue > 0.6 else "white"


def _count(value: int) -> str:
    if value >= 1e6:
        return f"{value / 1e6:.3g}M"
    return f"{value / 1e3:.3g}k" if value >= 1e4 else str(value)


def _chunk_list(chunks: list[int]) -> str:
    """"3,4" or "0-5": a rank's chunk numbers, a run of three or more as a range."""
    if len(chunks) > 2 and chunks == list(range(chunks[0], chunks[-1] + 1)):
        return f"{chunks[0]}-{chunks[-1]}"
    return ",".join(map(str, chunks))


def blocks_text(blocks: list[Block], query_chunks: tuple[int, ...],
                key_chunks: tuple[int, ...]) -> str:
    """"q7×k3,4": the query chunks x key chunks a rank's calls cover (full calls on the same
    query rows joined; a causal call, the rank's own chunks, on its own line, so that no key
    chunk its mask hides reads as computed), one line per group; "skip" when it makes none."""
    rows: dict[tuple[int, int, bool], list[int]] = {}
    for block in blocks:
        keys = rows.setdefault((block.q_start, block.q_stop, block.causal), [])
        keys.extend(key_chunks[block.k_start:block.k_stop])
    return "\n".join(f"q{_chunk_list(list(query_chunks[a:b]))}×k{_chunk_list(sorted(keys))}"
                     for (a, b, _), keys in rows.items()) or "skip"


# ----------------------------------------------------------------- the chunk assignment


def plot_chunks(seq_len: int, cp: int, variant: str = "ring") -> Figure:
    """The zig-zag split, the causal block matrix coloured by the rank that computes each
    block, and the (query, key) pairs per rank against a contiguous split's."""
    chunk_len = check_split(seq_len, check_cp(cp))
    cells = block_cells(cp, variant)
    n = 2 * cp
    side = min(7.0, 2.6 + 0.45 * n)
    fig = Figure(figsize=(max(11.5, side + 5.2), side + 2.4), layout="constrained")
    axes = fig.subplot_mosaic([["seq", "seq"], ["matrix", "pairs"]],
                              height_ratios=[1, side], width_ratios=[side, 4.6])
    holder = {chunk: rank for rank in range(cp) for chunk in rank_chunks(rank, cp)}
    _draw_sequence(axes["seq"], holder, chunk_len)
    _draw_matrix(axes["matrix"], cells, n, variant)
    _draw_pairs(axes["pairs"], seq_len, cp)
    fig.suptitle(f"Context parallelism, cp = {cp}: {seq_len} tokens in 2·cp = {n} chunks of "
                 f"{chunk_len}; rank i holds chunks i and {n - 1}-i", x=0.01, ha="left")
    return fig


def _draw_sequence(ax: Axes, holder: dict[int, int], chunk_len: int) -> None:
    n = len(holder)
    labelled = n <= 2 * MAX_LABELLED_CP
    for chunk, rank in holder.items():
        ax.add_patch(Rectangle((chunk, 0), 1, 1, facecolor=rank_colour(rank), edgecolor="white",
                               linewidth=1.5))
        if labelled:
            ax.text(chunk + 0.5, 0.5, f"r{rank}", ha="center", va="center", fontsize=8,
                    fontweight="bold", color=text_colour(rank_colour(rank)))
    ax.set_xlim(0, n)
    ax.set_ylim(1, 0)
    every = max(1, n // 8)  # at most about nine token labels along the strip
    ticks = list(range(0, n + 1, every))
    ax.set_xticks(ticks, [str(chunk * chunk_len) for chunk in ticks], fontsize=8)
    ax.set_yticks([])
    ax.set_xlabel("token position (a chunk's colour and label: the rank holding it)",
                  fontsize=9)
    ax.set_ylabel("rank", fontsize=9)
    ax.set_title("the sequence, split zig-zag: an early chunk paired with its mirror from "
                 "the end", loc="left", fontsize=10)


def _draw_matrix(ax: Axes, cells: dict[tuple[int, int], Cell], n: int, variant: str) -> None:
    labelled = n <= 2 * MAX_LABELLED_CP
    ax.hlines(range(n + 1), 0, n, color="#cccccc", linewidth=0.5)  # the empty grid
    ax.vlines(range(n + 1), 0, n, color="#cccccc", linewidth=0.5)
    shapes, colours = [], []
    for (q, k), cell in cells.items():
        colour = OKABE_ITO["grey"] if cell.rank is None else rank_colour(cell.rank)
        # a diagonal block's causal part is key <= query: the cell's lower-left triangle
        shapes.append(Polygon([(k, q), (k, q + 1), (k + 1, q + 1)]) if cell.half
                      else Rectangle((k, q), 1, 1))
        colours.append(colour)
        if labelled:
            step = "" if cell.step is None else f"\ns{cell.step}"
            x, y = (k + 0.3, q + 0.72) if cell.half else (k + 0.5, q + 0.5)
            who = "all" if cell.rank is None else f"r{cell.rank}"
            ax.text(x, y, f"{who}{step}", ha="center", va="center",
                    fontsize=7 if n <= 8 else 5.5, color=text_colour(colour), linespacing=0.9)
    # one collection, not a patch per cell: a 16 x 16 matrix draws in a blink
    ax.add_collection(PatchCollection(shapes, facecolors=colours, edgecolors="white",
                                      linewidths=0.8, label="blocks"))
    ax.set_xlim(0, n)
    ax.set_ylim(n, 0)
    ax.set_aspect("equal")
    every = max(1, n // 16)
    ax.set_xticks([k + 0.5 for k in range(0, n, every)], [str(k) for k in range(0, n, every)],
                  fontsize=8)
    ax.set_yticks([q + 0.5 for q in range(0, n, every)], [str(q) for q in range(0, n, every)],
                  fontsize=8)
    ax.set_xlabel("key chunk")
    ax.set_ylabel("query chunk")
    how = {"ring": "r: rank, s: ring step", "all_gather": "r: rank, after the gather",
           "all_to_all": "all: every rank, for its heads/cp heads"}[variant]
    ax.set_title(f"attention blocks by computing rank ({how});\nblank: masked, never "
                 "computed; triangle: causal diagonal", loc="left", fontsize=9)


def _draw_pairs(ax: Axes, seq_len: int, cp: int) -> None:
    zigzag, contiguous = pairs_per_rank(seq_len, cp), contiguous_pairs(seq_len, cp)
    ranks = range(cp)
    ax.bar([r - 0.2 for r in ranks], zigzag, width=0.4, color=[rank_colour(r) for r in ranks],
           edgecolor="white", label="zig-zag split (this one)")
    ax.bar([r + 0.2 for r in ranks], contiguous, width=0.4, facecolor="white",
           edgecolor=OKABE_ITO["grey"], linewidth=1.2, label="contiguous split (for comparison)")
    if cp <= MAX_LABELLED_CP:
        for r, value in enumerate(zigzag):
            ax.text(r - 0.2, value, _count(value), ha="center", va="bottom", fontsize=7,
                    rotation=90 if cp > 4 else 0)
    ax.set_xticks(list(ranks), [str(r) for r in ranks])
    ax.set_xlabel("context-parallel rank")
    ax.set_ylabel("(query, key) pairs per head, one forward")
    ax.set_ylim(0, max(contiguous) * 1.15)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: _count(int(value))))
    mean = sum(zigzag) / cp
    ax.set_title(f"work per rank: max/mean {max(zigzag) / mean:.2f} zig-zag, "
                 f"{max(contiguous) / mean:.2f} contiguous", loc="left", fontsize=9)
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(axis="y", color="#dddddd", linewidth=0.6)
    ax.set_axisbelow(True)
