"""The 3D rank grid: every rank's (dp, tp, pp) coordinates and the node it runs on.

Drawn from `Layout.coords`, the same function the runtime builds its process groups from:
one panel per pipeline stage (top to bottom), data-parallel replicas as columns,
tensor-parallel ranks as rows. Nodes are `gpus_per_node` consecutive ranks (what torchrun's
--nproc-per-node gives), shaded alternately and separated by thick lines, so a TP group that
crosses a node boundary shows at once.
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from paraxis.layout import Layout
from paraxis.viz.style import AXIS_COLOUR, new_figure

_NODE_SHADES = ("#e8f1fa", "#fdf0d5")  # alternate nodes: pale blue, pale sand
MAX_LABELLED_RANKS = 256  # beyond this, cells are too small for text


def node_of(rank: int, gpus_per_node: int) -> int:
    return rank // gpus_per_node


def rank_roles(layout: Layout, gpus_per_node: int) -> list[dict[str, int]]:
    """One row per rank: rank, dp, tp, pp, node."""
    return [{"rank": r, "dp": c.dp_rank, "tp": c.tp_rank, "pp": c.pp_rank,
             "node": node_of(r, gpus_per_node)}
            for r, c in ((r, layout.coords(r)) for r in range(layout.world_size))]


def plot_rank_grid(layout: Layout, gpus_per_node: int = 8) -> Figure:
    pp, dp, tp = layout.pp, layout.dp, layout.tp
    cell_w = min(1.25, 12.0 / dp)  # inches per cell, so wide dp still fits a page
    cell_h = min(0.75, 8.0 / (tp * pp))
    fig, axes = new_figure(max(5.5, dp * cell_w + 2.2), pp * (tp * cell_h + 0.75) + 1.6,
                           nrows=pp, squeeze=False)
    labelled = layout.world_size <= MAX_LABELLED_RANKS
    small = cell_w < 0.8 or cell_h < 0.5
    nodes = -(-layout.world_size // gpus_per_node)

    def rank_at(d: int, t: int, p: int) -> int:
        return layout.rank(dp_rank=d, tp_rank=t, pp_rank=p)

    for p, ax in enumerate(axes[:, 0]):
        for d in range(dp):
            for t in range(tp):
                rank = rank_at(d, t, p)
                node = node_of(rank, gpus_per_node)
                ax.add_patch(Rectangle((d, t), 1, 1, facecolor=_NODE_SHADES[node % 2],
                                       edgecolor="#555555", linewidth=0.6))
                if labelled:
                    ax.text(d + 0.5, t + 0.36, f"rank {rank}" if not small else str(rank),
                            ha="center", va="center", fontsize=8, fontweight="bold")
                    if not small:
                        ax.text(d + 0.5, t + 0.72, f"dp{d} tp{t} pp{p} · node {node}",
                                ha="center", va="center", fontsize=6, color="#333333")
                # Node boundaries: a thick line between neighbouring cells on other nodes.
                if d + 1 < dp and node_of(rank_at(d + 1, t, p), gpus_per_node) != node:
                    ax.plot([d + 1, d + 1], [t, t + 1], color="black", linewidth=2.5)
                if t + 1 < tp and node_of(rank_at(d, t + 1, p), gpus_per_node) != node:
                    ax.plot([d, d + 1], [t + 1, t + 1], color="black", linewidth=2.5)
        ax.set_xlim(0, dp)
        ax.set_ylim(tp, 0)
        ax.set_xticks([d + 0.5 for d in range(dp)], [str(d) for d in range(dp)])
        ax.set_yticks([t + 0.5 for t in range(tp)], [str(t) for t in range(tp)])
        ax.set_ylabel("tp_rank", color=AXIS_COLOUR["tp"])
        ax.set_title(f"pipeline stage {p}", color=AXIS_COLOUR["pp"], loc="left")
        for side in ax.spines.values():
            side.set_color(AXIS_COLOUR["pp"])
            side.set_linewidth(2)
    axes[-1, 0].set_xlabel("dp_rank (a column = one TP group; a row = one DP group)",
                           color=AXIS_COLOUR["dp"])
    handles = [Patch(facecolor=_NODE_SHADES[0], edgecolor="#555555", label="even node"),
               Patch(facecolor=_NODE_SHADES[1], edgecolor="#555555", label="odd node"),
               Patch(facecolor="white", edgecolor="black", linewidth=2.5,
                     label="node boundary")][:3 if nodes > 1 else 1]
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles),
               title=f"{gpus_per_node} GPUs per node, {nodes} node(s); a pipeline group is "
                     "the same cell in every stage", title_fontsize=8)
    fig.suptitle(f"3D rank grid: {layout.world_size} ranks = dp {dp} × tp {tp} × pp {pp}",
                 x=0.01, ha="left")
    return fig
