"""Context parallelism as pictures: who holds which chunk of the sequence, who computes
which causal attention block, and how K/V reach the queries (ring or all-gather).

Everything is drawn from `paraxis.context_parallel.balance`, the functions the runtime
itself runs: `rank_chunks` (the zig-zag split `chunks.local_part` and `chunks.positions`
cut), `ring_source` and `ring_blocks` (whose K/V a rank holds at each ring step, and the
kernel calls it makes against them, as `ring.py` loops over them), `prefix_blocks` (the
all-gather variant's calls) and `pairs_per_rank` (the count the kernels are tested
against). The block matrix is those kernel calls unfolded onto (query chunk, key chunk)
cells, so a test can check that the picture adds up to `pairs_per_rank`.

    plot_chunks(seq_len=4096, cp=4)        # the split, the block matrix, pairs per rank
    plot_kv_exchange(cp=4, "ring")         # one ring per step: K/V on, dK/dV behind
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Circle, FancyArrowPatch, Patch, Polygon, Rectangle
from matplotlib.ticker import FuncFormatter

from paraxis.context_parallel.balance import (
    VARIANTS,
    Block,
    blocks_between,
    check_split,
    pairs_per_rank,
    prefix_blocks,
    rank_chunks,
    ring_blocks,
    ring_source,
)
from paraxis.errors import ParaxisError
from paraxis.viz.style import OKABE_ITO, RANK_COLOURS, new_figure

MAX_LABELLED_CP = 8  # beyond this, cells and ring nodes are too small for text
MAX_RING_CP = 16  # one ring panel per step: more steps than this no longer fit a page


@dataclass(frozen=True)
class Cell:
    """One (query chunk, key chunk) block of the causal attention matrix, as computed."""

    rank: int  # the rank that computes it: the one holding the query chunk
    step: int | None  # the ring step it is computed at (None: the all-gather's one pass)
    half: bool  # on the diagonal: causal inside, about half its pairs computed


def check_variant(variant: str) -> str:
    if variant not in VARIANTS:
        raise ParaxisError(f"unknown context-parallel attention {variant!r}; use one of "
                           f"{', '.join(VARIANTS)}")
    return variant


def _check_cp(cp: int) -> int:
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
    diagonal: the runtime's kernel calls (`ring_blocks` or `prefix_blocks`) unfolded."""
    _check_cp(cp)
    check_variant(variant)
    every_chunk = tuple(range(2 * cp))
    cells: dict[tuple[int, int], Cell] = {}
    for rank in range(cp):
        if variant == "ring":
            calls = [(step, rank_chunks(ring_source(rank, step, cp), cp), block)
                     for step in range(cp) for block in ring_blocks(rank, step, cp)]
        else:  # all-gather: keys are the whole sequence, in sequence order
            calls = [(None, every_chunk, block) for block in prefix_blocks(rank, cp)]
        for step, key_chunks, block in calls:
            for q, k, half in _unfold(block, rank_chunks(rank, cp), key_chunks):
                if (q, k) in cells:
                    raise AssertionError(f"block (q{q}, k{k}) computed twice")
                cells[(q, k)] = Cell(rank, step, half)
    return cells


def cell_pairs(cells: dict[tuple[int, int], Cell], seq_len: int, cp: int) -> list[int]:
    """(query, key) pairs per rank the cells add up to: a full cell L*L, a diagonal one
    L(L+1)/2 (the causal square, as `Block.pairs` counts it)."""
    chunk_len = check_split(seq_len, cp)
    pairs = [0] * cp
    for cell in cells.values():
        pairs[cell.rank] += chunk_len * (chunk_len + 1) // 2 if cell.half else chunk_len ** 2
    return pairs


def contiguous_pairs(seq_len: int, cp: int) -> list[int]:
    """The pairs per rank if rank r held chunks 2r and 2r+1 (one contiguous piece): what the
    zig-zag split avoids. Counted by `blocks_between`, the rule the zig-zag's calls use."""
    chunk_len = check_split(seq_len, cp)
    held = [(2 * r, 2 * r + 1) for r in range(cp)]
    return [sum(block.pairs(chunk_len) for other in held for block in blocks_between(mine, other))
            for mine in held]


def _colour(rank: int) -> str:
    return RANK_COLOURS[rank % len(RANK_COLOURS)]


def _ink(colour: str) -> str:
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
    """"q7×k3,4": the query chunks x key chunks a rank's calls cover (calls on the same query
    rows joined), one line per row group; "skip" when it makes none."""
    rows: dict[tuple[int, int], list[int]] = {}
    for block in blocks:
        keys = rows.setdefault((block.q_start, block.q_stop), [])
        keys.extend(key_chunks[block.k_start:block.k_stop])
    return "\n".join(f"q{_chunk_list(list(query_chunks[a:b]))}×k{_chunk_list(sorted(keys))}"
                     for (a, b), keys in rows.items()) or "skip"


# ----------------------------------------------------------------- the chunk assignment


def plot_chunks(seq_len: int, cp: int, variant: str = "ring") -> Figure:
    """The zig-zag split, the causal block matrix coloured by the rank that computes each
    block, and the (query, key) pairs per rank against a contiguous split's."""
    chunk_len = check_split(seq_len, _check_cp(cp))
    cells = block_cells(cp, variant)
    n = 2 * cp
    side = min(7.0, 2.6 + 0.45 * n)
    fig, axes = plt.subplot_mosaic([["seq", "seq"], ["matrix", "pairs"]],
                                   figsize=(side + 5.2, side + 2.4), layout="constrained",
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
        ax.add_patch(Rectangle((chunk, 0), 1, 1, facecolor=_colour(rank), edgecolor="white",
                               linewidth=1.5))
        if labelled:
            ax.text(chunk + 0.5, 0.5, f"r{rank}", ha="center", va="center", fontsize=8,
                    fontweight="bold", color=_ink(_colour(rank)))
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
    for q in range(n):
        for k in range(n):
            ax.add_patch(Rectangle((k, q), 1, 1, facecolor="white", edgecolor="#cccccc",
                                   linewidth=0.5))
    for (q, k), cell in cells.items():
        colour = _colour(cell.rank)
        if cell.half:  # the causal part of a diagonal block: key <= query, lower left
            ax.add_patch(Polygon([(k, q), (k, q + 1), (k + 1, q + 1)], facecolor=colour,
                                 edgecolor="white", linewidth=0.8))
        else:
            ax.add_patch(Rectangle((k, q), 1, 1, facecolor=colour, edgecolor="white",
                                   linewidth=0.8))
        if labelled:
            step = "" if cell.step is None else f"\ns{cell.step}"
            x, y = (k + 0.3, q + 0.72) if cell.half else (k + 0.5, q + 0.5)
            ax.text(x, y, f"r{cell.rank}{step}", ha="center", va="center",
                    fontsize=7 if n <= 8 else 5.5, color=_ink(colour), linespacing=0.9)
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
    how = "r: rank, s: ring step" if variant == "ring" else "r: rank, after one all-gather"
    ax.set_title(f"attention blocks by the rank computing them ({how});\nblank: masked, "
                 "never computed; triangle: diagonal, causal inside", loc="left", fontsize=9)


def _draw_pairs(ax: Axes, seq_len: int, cp: int) -> None:
    zigzag, contiguous = pairs_per_rank(seq_len, cp), contiguous_pairs(seq_len, cp)
    ranks = range(cp)
    ax.bar([r - 0.2 for r in ranks], zigzag, width=0.4, color=[_colour(r) for r in ranks],
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


# ------------------------------------------------------------- how K/V reach the queries


def plot_kv_exchange(cp: int, variant: str = "ring") -> Figure:
    """The ring's steps (`plot_kv_ring`) or the all-gather (`plot_kv_gather`)."""
    check_variant(variant)
    return plot_kv_ring(cp) if variant == "ring" else plot_kv_gather(cp)


def _positions(cp: int) -> list[tuple[float, float]]:
    """The ranks on a unit circle, rank 0 at the top, clockwise (the ring's direction)."""
    if cp == 1:
        return [(0.0, 0.0)]
    return [(math.cos(math.pi / 2 - 2 * math.pi * r / cp),
             math.sin(math.pi / 2 - 2 * math.pi * r / cp)) for r in range(cp)]


def _node_radius(cp: int) -> float:
    return 0.32 if cp <= 2 else min(0.3, 0.6 * math.sin(math.pi / cp))


def _arrow(ax: Axes, a: tuple[float, float], b: tuple[float, float], radius: float,
           colour: str, outside: bool, dashed: bool = False) -> None:
    """An arrow from node a's edge to node b's, bowed outside the ring or inside it."""
    dx, dy = b[0] - a[0], b[1] - a[1]
    length = math.hypot(dx, dy)
    ux, uy = dx / length, dy / length
    # arc3 bows a positive rad to the right of travel: inside the ring, which runs clockwise
    ax.add_patch(FancyArrowPatch(
        (a[0] + ux * radius, a[1] + uy * radius), (b[0] - ux * radius, b[1] - uy * radius),
        arrowstyle="-|>", mutation_scale=11, color=colour, linewidth=1.8,
        linestyle="--" if dashed else "-",
        connectionstyle=f"arc3,rad={-0.35 if outside else 0.35}"))


def _ring_axes(ax: Axes, cp: int, radius: float) -> None:
    reach = (0.0 if cp == 1 else 1.0) + radius + 0.62
    ax.set_xlim(-reach, reach)
    ax.set_ylim(-reach, reach)
    ax.set_aspect("equal")
    ax.set_xticks([])
    ax.set_yticks([])
    for side in ax.spines.values():
        side.set_visible(False)


def _rank_label(ax: Axes, position: tuple[float, float], radius: float, text: str,
                fontsize: float) -> None:
    """Text just outside a node, away from the ring's centre (left of a node on the left)."""
    x, y = position
    norm = math.hypot(x, y)
    ux, uy = (x / norm, y / norm) if norm else (0.0, 1.0)
    ha = "left" if ux > 0.3 else "right" if ux < -0.3 else "center"
    va = "bottom" if uy > 0.3 else "top" if uy < -0.3 else "center"
    ax.text(x + ux * (radius + 0.08), y + uy * (radius + 0.08), text, ha=ha, va=va,
            fontsize=fontsize, linespacing=1.0)


def plot_kv_ring(cp: int) -> Figure:
    """One ring per step: each rank filled with the colour of the K/V it holds (`ring_source`),
    the query x key chunks it computes against them (`ring_blocks`), the K/V it passes on
    for the next step (solid) and, in backward, the dK/dV accumulator of the K/V it held,
    passed on one hop behind (dashed), which after the last step lands on its owner."""
    _check_cp(cp)
    if cp > MAX_RING_CP:
        raise ParaxisError(f"the ring picture draws one panel per step, at most cp = "
                           f"{MAX_RING_CP}; draw cp={cp} with a smaller --cp")
    cols = min(cp, 4)
    rows = -(-cp // cols)
    fig, axes = new_figure(cols * 2.8 + 0.3, rows * 3.1 + 1.5, nrows=rows, ncols=cols,
                           squeeze=False)
    positions, radius = _positions(cp), _node_radius(cp)
    labelled = cp <= MAX_LABELLED_CP
    size = 8 if cp <= 4 else 6.5
    skipped = False
    for step, ax in enumerate(axes.flat):
        if step >= cp:
            ax.set_visible(False)
            continue
        for rank, position in enumerate(positions):
            source = ring_source(rank, step, cp)
            blocks = ring_blocks(rank, step, cp)
            skipped |= not blocks
            fill = _colour(source) if blocks else "white"
            ax.add_patch(Circle(position, radius, facecolor=fill, edgecolor="#333333",
                                linewidth=0.8, hatch="" if blocks else "////"))
            if labelled:
                ax.text(*position, f"KV{source}", ha="center", va="center", fontsize=size - 1,
                        color=_ink(fill))
            calls = blocks_text(blocks, rank_chunks(rank, cp), rank_chunks(source, cp))
            _rank_label(ax, position, radius, f"$\\bf{{r{rank}}}$\n{calls}" if labelled
                        else f"r{rank}", size - 1)
            following = positions[(rank + 1) % cp]
            if step < cp - 1:  # posted now, used at the next step (`ring._Pass`)
                _arrow(ax, position, following, radius, _colour(source), outside=True)
            if step > 0:  # the dK/dV of the K/V held now, on to the next holder
                _arrow(ax, position, following, radius, _colour(source), outside=False,
                       dashed=True)
        _ring_axes(ax, cp, radius)
        ax.set_title(f"step {step}" + (": own chunks, causal" if step == 0 else ""),
                     loc="left", fontsize=9)
        ax.set_xlabel(_step_summary(step, cp), fontsize=8)
    handles = [Line2D([], [], color="#333333", linewidth=1.8,
                      label="K/V passed on for the next step (forward, and again in backward)"),
               Line2D([], [], color="#333333", linewidth=1.8, linestyle="--",
                      label="dK/dV accumulator (backward): one hop behind its K/V")]
    if skipped:
        handles.append(Patch(facecolor="white", hatch="////", edgecolor="#333333",
                             label="no block under the diagonal: step skipped"))
    fig.legend(handles=handles, loc="outside lower center", ncols=1, fontsize=8,
               title="fill and KVj: whose K/V the rank holds (rank j's); qA×kB: its query "
                     "chunks × key chunks computed; arrow colour: whose K/V (or dK/dV)",
               title_fontsize=8)
    sends = f"{cp - 1} sends per pass" if cp > 1 else "nothing to send"
    fig.suptitle(f"Ring attention, cp = {cp}: K/V move one rank on per step; {cp} steps, "
                 f"{sends}", x=0.01, ha="left")
    return fig


def _step_summary(step: int, cp: int) -> str:
    if cp == 1:
        return "one rank: plain causal attention"
    kv = "K/V on →" if step < cp - 1 else "last K/V: none sent"
    grad = ("dK/dV of own K/V kept" if step == 0 else
            "dK/dV reach their owners" if step == cp - 1 else "dK/dV on →")
    return f"{kv}; {grad}"


def plot_kv_gather(cp: int) -> Figure:
    """The all-gather variant: one all-gather of every rank's K/V (forward, and again in
    backward), each rank's calls against the whole sequence (`prefix_blocks`), and the
    reduce-scatter that sums the dK/dV of the whole sequence back onto each chunk's owner."""
    _check_cp(cp)
    fig, axes = new_figure(10.5, 5.2, ncols=2, squeeze=False)
    positions, radius = _positions(cp), _node_radius(cp)
    labelled = cp <= MAX_LABELLED_CP
    every_chunk = tuple(range(2 * cp))
    centre = {"forward": "all-gather\nK/V", "backward": "reduce-scatter\ndK/dV (fp32)"}
    notes = {"forward": "forward: each rank gets all K/V once,\nbackward gathers them again",
             "backward": "backward: each chunk's dK/dV, summed over\nevery rank, lands on "
                         "its owner"}
    for ax, phase in zip(axes[0], ("forward", "backward"), strict=True):
        for rank, position in enumerate(positions):
            ax.add_patch(Circle(position, radius, facecolor=_colour(rank),
                                edgecolor="#333333", linewidth=0.8))
            ax.text(*position, f"r{rank}", ha="center", va="center", fontsize=7,
                    fontweight="bold", color=_ink(_colour(rank)))
            if cp > 1:  # from the node's edge to the collective in the middle, both ways
                edge = (position[0] * (1 - radius), position[1] * (1 - radius))
                ax.add_patch(FancyArrowPatch(edge, (0.0, 0.0), arrowstyle="<|-|>",
                                             mutation_scale=10, color=_colour(rank),
                                             linewidth=1.4, shrinkA=0, shrinkB=26))
            if labelled and phase == "forward":
                calls = blocks_text(prefix_blocks(rank, cp), rank_chunks(rank, cp),
                                    every_chunk)
                _rank_label(ax, position, radius, calls, 6.5)
        if cp > 1:
            ax.text(0, 0, centre[phase], ha="center", va="center", fontsize=7,
                    bbox={"boxstyle": "round", "facecolor": "#f2f2f2", "edgecolor": "#555555"})
        _ring_axes(ax, cp, radius + 0.2)
        ax.set_title(phase, loc="left", fontsize=10)
        ax.set_xlabel(notes[phase], fontsize=8)
    fig.suptitle(f"All-gather context parallelism, cp = {cp}: each rank's queries against "
                 "the whole sequence's K/V", x=0.01, ha="left")
    fig.legend(handles=[Patch(facecolor=_colour(0), edgecolor="#333333",
                              label="a rank (its own K/V and queries)")],
               loc="outside lower center", fontsize=8, title_fontsize=8,
               title="qA×kB-C: query chunk A against key chunks B to C (keys before A in "
                     "full, A itself causally)")
    return fig
