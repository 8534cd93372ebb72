"""Context parallelism as pictures, part two: how K/V reach the queries.

The ring (`plot_kv_ring`): one ring of the cp ranks per step, each rank showing whose K/V
it holds (`balance.ring_source`) and the query x key chunks it computes against them
(`balance.ring_blocks`, the calls `ring.py` makes), the K/V it passes on to the next rank for
the next step, and the dK/dV accumulators of backward, one hop behind their K/V, which land
on their owners after the last step (as `ring._RingAttention.backward` passes them). The
all-gather (`plot_kv_gather`): the one gather, each rank's calls against the whole sequence
(`balance.gathered_blocks`), and the reduce-scatter of dK/dV. The all-to-all
(`plot_kv_all_to_all`): who holds which (token chunks, head group) piece before and after
the exchange (`all_to_all.py`). Part one (`context.py`) draws the split and the block matrix.
"""

from __future__ import annotations

import math

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Circle, FancyArrowPatch, Patch, Rectangle

from paraxis.show.viz.context import (
    MAX_LABELLED_CP,
    blocks_text,
    check_cp,
    check_variant,
    rank_colour,
    text_colour,
)
from paraxis.show.viz.style import new_figure
from paraxis.spec.cp_balance import (
    gathered_blocks,
    gathered_chunks,
    rank_chunks,
    ring_blocks,
    ring_source,
)
from paraxis.spec.errors import ParaxisError

MAX_RING_CP = 16  # one ring panel per step: more steps than this no longer fit a page


def plot_kv_exchange(cp: int, variant: str = "ring") -> Figure:
    """The ring's steps (`plot_kv_ring`), the all-gather (`plot_kv_gather`) or the
    all-to-all (`plot_kv_all_to_all`)."""
    check_variant(variant)
    return {"ring": plot_kv_ring, "all_gather": plot_kv_gather,
            "all_to_all": plot_kv_all_to_all}[variant](cp)


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
    check_cp(cp)
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
            fill = rank_colour(source) if blocks else "white"
            ax.add_patch(Circle(position, radius, facecolor=fill, edgecolor="#333333",
                                linewidth=0.8, hatch="" if blocks else "////"))
            if labelled:
                ax.text(*position, f"KV{source}", ha="center", va="center", fontsize=size - 1,
                        color=text_colour(fill))
            calls = blocks_text(blocks, rank_chunks(rank, cp), rank_chunks(source, cp))
            _rank_label(ax, position, radius, f"$\\bf{{r{rank}}}$\n{calls}" if labelled
                        else f"r{rank}", size - 1)
            following = positions[(rank + 1) % cp]
            if step < cp - 1:  # posted now, used at the next step (`ring._Pass`)
                _arrow(ax, position, following, radius, rank_colour(source), outside=True)
            if step > 0:  # the dK/dV of the K/V held now, on to the next holder
                _arrow(ax, position, following, radius, rank_colour(source), outside=False,
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
    backward), each rank's calls against the whole sequence (`gathered_blocks`), and the
    reduce-scatter that sums the dK/dV of the whole sequence back onto each chunk's owner."""
    check_cp(cp)
    fig, axes = new_figure(10.5, 5.2, ncols=2, squeeze=False)
    positions, radius = _positions(cp), _node_radius(cp)
    labelled = cp <= MAX_LABELLED_CP
    centre = {"forward": "all-gather\nK/V", "backward": "reduce-scatter\ndK/dV (fp32)"}
    notes = {"forward": "forward: each rank gets all K/V once,\nbackward gathers them again",
             "backward": "backward: each chunk's dK/dV, summed over\nevery rank, lands on "
                         "its owner"}
    for ax, phase in zip(axes[0], ("forward", "backward"), strict=True):
        for rank, position in enumerate(positions):
            ax.add_patch(Circle(position, radius, facecolor=rank_colour(rank),
                                edgecolor="#333333", linewidth=0.8))
            ax.text(*position, f"r{rank}", ha="center", va="center", fontsize=7,
                    fontweight="bold", color=text_colour(rank_colour(rank)))
            if cp > 1:  # from the node's edge to the collective in the middle, both ways
                edge = (position[0] * (1 - radius), position[1] * (1 - radius))
                ax.add_patch(FancyArrowPatch(edge, (0.0, 0.0), arrowstyle="<|-|>",
                                             mutation_scale=10, color=rank_colour(rank),
                                             linewidth=1.4, shrinkA=0, shrinkB=26))
            if labelled and phase == "forward":
                calls = blocks_text(gathered_blocks(rank, cp), rank_chunks(rank, cp),
                                    gathered_chunks(cp))
                _rank_label(ax, position, radius, calls, 6.5)
        if cp > 1:
            ax.text(0, 0, centre[phase], ha="center", va="center", fontsize=7,
                    bbox={"boxstyle": "round", "facecolor": "#f2f2f2", "edgecolor": "#555555"})
        _ring_axes(ax, cp, radius + 0.2)
        ax.set_title(phase, loc="left", fontsize=10)
        ax.set_xlabel(notes[phase], fontsize=8)
    fig.suptitle(f"All-gather context parallelism, cp = {cp}: each rank's queries against "
                 "the whole sequence's K/V", x=0.01, ha="left")
    fig.legend(handles=[Patch(facecolor=rank_colour(0), edgecolor="#333333",
                              label="a rank (its own K/V and queries)")],
               loc="outside lower center", fontsize=8, title_fontsize=8,
               title="qA×kB-C: query chunk A against key chunks B to C (keys before A in "
                     "full, A itself causally)")
    return fig


def plot_kv_all_to_all(cp: int) -> Figure:
    """The all-to-all variant as two grids of (token chunks, head group) pieces, coloured
    by the rank holding each: before the exchange rank r holds its chunks of every head
    (a row), after it rank j holds head group j of every chunk (a column). The output goes
    back the other way; backward runs both exchanges in reverse."""
    check_cp(cp)
    fig, axes = new_figure(10.5, 5.2, ncols=2, squeeze=False)
    labelled = cp <= MAX_LABELLED_CP
    panels = {"before attention (and after, for the output)": lambda row, col: row,
              "during attention": lambda row, col: col}
    for ax, (title, holder) in zip(axes[0], panels.items(), strict=True):
        for row in range(cp):
            for col in range(cp):
                colour = rank_colour(holder(row, col))
                ax.add_patch(Rectangle((col, row), 1, 1, facecolor=colour, edgecolor="white",
                                       linewidth=1.5))
                if labelled:
                    ax.text(col + 0.5, row + 0.5, f"r{holder(row, col)}", ha="center",
                            va="center", fontsize=7, color=text_colour(colour))
        ax.set_xlim(0, cp)
        ax.set_ylim(cp, 0)
        ax.set_aspect("equal")
        every = max(1, cp // 8)
        ax.set_xticks([c + 0.5 for c in range(0, cp, every)],
                      [f"h{c}" for c in range(0, cp, every)], fontsize=8)
        ax.set_yticks([r + 0.5 for r in range(0, cp, every)],
                      [",".join(map(str, rank_chunks(r, cp))) for r in range(0, cp, every)],
                      fontsize=8)
        ax.set_xlabel("head group (heads/cp heads each)", fontsize=8)
        ax.set_ylabel("token chunks (a rank's zig-zag pair)", fontsize=8)
        ax.set_title(title, loc="left", fontsize=10)
    moved = f"sends {cp - 1} of its {cp} pieces" if cp > 1 else "sends nothing"
    fig.suptitle(f"All-to-all context parallelism (Ulysses), cp = {cp}: each rank {moved}\n"
                 "(q, k, v), attends over whole sequences for one head group, and the output "
                 "comes back", x=0.01, ha="left", fontsize=10)
    fig.legend(handles=[Patch(facecolor=rank_colour(0), edgecolor="#333333",
                              label="a piece, coloured and labelled by the rank holding it")],
               loc="outside lower center", fontsize=8)
    return fig
