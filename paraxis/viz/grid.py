"""The 3D rank grid: every rank's (dp, tp, pp) coordinates and the node it runs on.

Drawn from `Layout.coords`, the same function the runtime builds its process groups from:
one panel per pipeline stage, data-parallel replicas as rows, tensor-parallel ranks as
columns. Nodes are `gpus_per_node` consecutive ranks (what torchrun's --nproc-per-node
gives), outlined and shaded, so a TP group that crosses a node boundary shows at once.
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
    """One row per rank: rank, dp, tp, pp, node (the table under the picture)."""
    return [{"rank": r, "dp": c.dp_rank, "tp": c.tp_rank, "pp": c.pp_rank,
             "node": node_of(r, gpus_per_node)}
            for r, c in ((r, layout.coords(r)) for r in range(layout.world_size))]


def plot_rank_grid(layout: Layout, gpus_per_node: int = 8) -> Figure:
    pp, dp, tp = layout.pp, layout.dp, layout.tp
    cell = 0.9 if layout.world_size <= 64 else 0.5
    fig, axes = new_figure(max(6.0, min(15.0, pp * max(tp * cell + 0.6, 2.6) + 1.0)),
                           max(2.6, min(10.0, dp * cell * 0.8 + 1.9)), ncols=pp, squeeze=False)
    labelled = layout.world_size <= MAX_LABELLED_RANKS
    nodes = -(-layout.world_size // gpus_per_node)
    for p, ax in enumerate(axes[0]):
        for d in range(dp):
            for t in range(tp):
                rank = layout.rank(d, t, p)
                node = node_of(rank, gpus_per_node)
                ax.add_patch(Rectangle((t, d), 1, 1, facecolor=_NODE_SHADES[node % 2],
                                       edgecolor="#555555", linewidth=0.6))
                if labelled:
                    ax.text(t + 0.5, d + 0.38, f"rank {rank}", ha="center", va="center",
                            fontsize=8 if tp <= 8 else 6, fontweight="bold")
                    ax.text(t + 0.5, d + 0.72, f"dp{d} tp{t} pp{p}\nnode {node}",
                            ha="center", va="center", fontsize=6 if tp <= 8 else 4.5,
                            color="#333333")
        # Node boundaries: a thick line wherever the next cell (row-major, the rank order
        # inside a stage) belongs to another node.
        for d in range(dp):
            for t in range(tp):
                rank = layout.rank(d, t, p)
                if t + 1 < tp and node_of(layout.rank(d, t + 1, p), gpus_per_node) != \
                        node_of(rank, gpus_per_node):
                    ax.plot([t + 1, t + 1], [d, d + 1], color="black", linewidth=2.5)
                if d + 1 < dp and node_of(layout.rank(d + 1, t, p), gpus_per_node) != \
                        node_of(rank, gpus_per_node):
                    ax.plot([t, t + 1], [d + 1, d + 1], color="black", linewidth=2.5)
        ax.set_xlim(0, tp)
        ax.set_ylim(dp, 0)
        ax.set_aspect("equal")
        ax.set_xticks([t + 0.5 for t in range(tp)], [str(t) for t in range(tp)])
        ax.set_yticks([d + 0.5 for d in range(dp)], [str(d) for d in range(dp)])
        ax.set_xlabel("tp_rank (a row = one TP group)", color=AXIS_COLOUR["tp"])
        if p == 0:
            ax.set_ylabel("dp_rank (replica)", color=AXIS_COLOUR["dp"])
        ax.set_title(f"pipeline stage {p}", color=AXIS_COLOUR["pp"])
        for side in ax.spines.values():
            side.set_color(AXIS_COLOUR["pp"])
            side.set_linewidth(2)
    handles = [Patch(facecolor=_NODE_SHADES[0], edgecolor="#555555", label="node 0, 2, …"),
               Patch(facecolor=_NODE_SHADES[1], edgecolor="#555555", label="node 1, 3, …"),
               Patch(facecolor="white", edgecolor="black", linewidth=2.5,
                     label="node boundary")] if nodes > 1 else \
        [Patch(facecolor=_NODE_SHADES[0], edgecolor="#555555", label="node 0")]
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles),
               title=f"{gpus_per_node} GPUs per node, {nodes} node(s); a pipeline group is "
                     "the same cell in every stage", title_fontsize=8)
    fig.suptitle(f"3D rank grid: {layout.world_size} ranks = dp {dp} × tp {tp} × pp {pp}",
                 x=0.01, ha="left")
    return fig
