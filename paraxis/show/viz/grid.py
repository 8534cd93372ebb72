"""The rank grid: every rank's (dp, cp, tp, pp) coordinates and the node it runs on.

Drawn from `Layout.coords`, the same function the runtime builds its process groups from:
one panel per pipeline stage (top to bottom), data-parallel replicas as columns,
tensor-parallel ranks as rows. With context parallelism (cp > 1) each replica's column
splits into cp sub-columns, one per context-parallel rank, the replicas separated by thick
lines in the DP colour: a CP group is one row inside a replica. Nodes are `gpus_per_node`
consecutive ranks (what torchrun's --nproc-per-node gives), shaded alternately and separated
by thick black lines, so a TP or CP group that crosses a node boundary shows at once.
Under hybrid sharding (`Layout.dp_shard`) the columns of each ZeRO shard group are bracketed
above the grid and split from the next group's by a dashed line in the ZeRO colour: ZeRO
shards within a bracket, and the same cell in every bracket holds a copy of the same shard.
"""

from __future__ import annotations

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from paraxis.show.viz.style import AXIS_COLOUR, OKABE_ITO, new_figure
from paraxis.spec.grid import node_of
from paraxis.spec.layout import Layout

_NODE_SHADES = ("#e8f1fa", "#fdf0d5")  # alternate nodes: pale blue, pale sand
ZERO_COLOUR = OKABE_ITO["vermillion"]  # hybrid sharding's shard groups
MAX_LABELLED_RANKS = 256  # beyond this, cells are too small for text


def rank_roles(layout: Layout, gpus_per_node: int) -> list[dict[str, int]]:
    """One row per rank: rank, dp, cp, tp, pp, node, and the copy of its ZeRO shards it
    holds (`Layout.groups("dp_replicate")`; 0 without hybrid sharding)."""
    copy = {rank: group.index(rank) for group in layout.groups("dp_replicate")
            for rank in group}
    return [{"rank": r, "dp": c.dp_rank, "cp": c.cp_rank, "tp": c.tp_rank, "pp": c.pp_rank,
             "node": node_of(r, gpus_per_node), "copy": copy[r]}
            for r, c in ((r, layout.coords(r)) for r in range(layout.world_size))]


def cell_label(layout: Layout, rank: int, gpus_per_node: int) -> str:
    """"dp1 cp0 tp1 pp0 · node 0": a rank's coordinates (`Layout.coords`; cp only when the
    layout has it; with experts, "ep1": its place in its expert-parallel group, the experts it
    holds, from `Layout.groups("ep")` as the runtime builds them) and its node. Under hybrid
    sharding "dp3/g1": dp rank 3 in shard group 1 (the copy of the shards it holds)."""
    coords = layout.coords(rank)
    cp = f" cp{coords.cp_rank}" if layout.cp > 1 else ""
    if layout.hybrid:
        cp = f"/g{coords.dp_rank // layout.shard_size}{cp}"
    ep = ""
    if layout.ep > 1:
        ep = f" ep{next(g for g in layout.groups('ep') if rank in g).index(rank)}"
    return (f"dp{coords.dp_rank}{cp}{ep} tp{coords.tp_rank} pp{coords.pp_rank} · node "
            f"{node_of(rank, gpus_per_node)}")


def plot_rank_grid(layout: Layout, gpus_per_node: int = 8, device: str = "GPU") -> Figure:
    pp, dp, cp, tp = layout.pp, layout.dp, layout.cp, layout.tp
    cols = dp * cp  # cp sub-columns inside each data-parallel replica
    cell_w = min(1.25, 12.0 / cols)  # inches per cell, so a wide grid still fits a page
    cell_h = min(0.75, 8.0 / (tp * pp))
    fig, axes = new_figure(max(5.5, cols * cell_w + 2.2), pp * (tp * cell_h + 0.75) + 1.6,
                           nrows=pp, squeeze=False)
    labelled = layout.world_size <= MAX_LABELLED_RANKS
    small = cell_w < 0.8 or cell_h < 0.5
    nodes = -(-layout.world_size // gpus_per_node)
    # (stage, column, row) -> rank, from the coordinates the runtime uses
    at = {(c.pp_rank, c.dp_rank * cp + c.cp_rank, c.tp_rank): r
          for r, c in ((r, layout.coords(r)) for r in range(layout.world_size))}

    for p, ax in enumerate(axes[:, 0]):
        for x in range(cols):
            for t in range(tp):
                rank = at[(p, x, t)]
                node = node_of(rank, gpus_per_node)
                ax.add_patch(Rectangle((x, t), 1, 1, facecolor=_NODE_SHADES[node % 2],
                                       edgecolor="#555555", linewidth=0.6))
                if labelled:
                    ax.text(x + 0.5, t + 0.36, f"rank {rank}" if not small else str(rank),
                            ha="center", va="center", fontsize=8, fontweight="bold")
                    if not small:
                        ax.text(x + 0.5, t + 0.72, cell_label(layout, rank, gpus_per_node),
                                ha="center", va="center", fontsize=6 if cp == 1 else 5.5,
                                color="#333333")
                # Node boundaries: a thick line between neighbouring cells on other nodes.
                if x + 1 < cols and node_of(at[(p, x + 1, t)], gpus_per_node) != node:
                    ax.plot([x + 1, x + 1], [t, t + 1], color="black", linewidth=2.5)
                if t + 1 < tp and node_of(at[(p, x, t + 1)], gpus_per_node) != node:
                    ax.plot([x, x + 1], [t + 1, t + 1], color="black", linewidth=2.5)
        ax.set_xlim(0, cols)
        ax.set_ylim(tp, 0)
        if cp == 1:
            ax.set_xticks([d + 0.5 for d in range(dp)], [str(d) for d in range(dp)])
        else:
            _mark_replicas(ax, dp, cp, tp, small, pad=16 if layout.hybrid else 3.5)
        if layout.hybrid:
            _mark_shard_groups(ax, layout, small)
        ax.set_yticks([t + 0.5 for t in range(tp)], [str(t) for t in range(tp)])
        ax.set_ylabel("tp_rank", color=AXIS_COLOUR["tp"])
        # under hybrid sharding the shard groups' brackets sit between the title and the grid
        ax.set_title(f"pipeline stage {p}", color=AXIS_COLOUR["pp"], loc="left",
                     pad=34 if layout.hybrid and cp > 1 else 20 if layout.hybrid else 6)
        for side in ax.spines.values():
            side.set_color(AXIS_COLOUR["pp"])
            side.set_linewidth(2)
    if cp == 1:
        axes[-1, 0].set_xlabel("dp_rank (a column = one TP group; a row = one DP group)",
                               color=AXIS_COLOUR["dp"])
    else:
        axes[-1, 0].set_xlabel("dp_rank (top) › cp_rank (bottom): a column = one TP group;\n"
                               "a row inside a replica = one CP group; the same cell in every "
                               "replica = one DP group", color=AXIS_COLOUR["dp"], fontsize=9)
    handles = [Patch(facecolor=_NODE_SHADES[0], edgecolor="#555555", label="even node"),
               Patch(facecolor=_NODE_SHADES[1], edgecolor="#555555", label="odd node"),
               Patch(facecolor="white", edgecolor="black", linewidth=2.5,
                     label="node boundary")][:3 if nodes > 1 else 1]
    if cp > 1:
        handles.append(Patch(facecolor="white", edgecolor=AXIS_COLOUR["dp"], linewidth=2.5,
                             label="data-parallel replica"))
    if layout.hybrid:
        handles.append(Patch(facecolor="white", edgecolor=ZERO_COLOUR, linewidth=2,
                             linestyle="--", label=f"ZeRO-{layout.zero} shard group (copies "
                                                   "all-reduce gradients across)"))
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 3),
               title=f"{gpus_per_node} {device}s per node, {nodes} node(s); a pipeline group "
                     "is the same cell in every stage", title_fontsize=8)
    if cp == 1:
        title = f"3D rank grid: {layout.world_size} ranks = dp {dp} × tp {tp} × pp {pp}"
    else:
        title = (f"4D rank grid: {layout.world_size} ranks = dp {dp} × cp {cp} × tp {tp} × "
                 f"pp {pp}")
    if layout.hybrid:
        title += (f"\nhybrid sharding: dp {dp} = {layout.replicas} shard groups × "
                  f"{layout.shard_size} dp ranks")
    fig.suptitle(title, x=0.01, ha="left")
    return fig


def _mark_shard_groups(ax: Axes, layout: Layout, small: bool) -> None:
    """A bracket over each shard group's columns (dp_shard x cp of them), named g0, g1...,
    and a dashed line in the ZeRO colour between groups."""
    width, tp = layout.shard_size * layout.cp, layout.tp
    for g in range(layout.replicas):
        left = g * width
        ax.annotate("", xy=(left + 0.08, -0.12), xytext=(left + width - 0.08, -0.12),
                    xycoords="data", annotation_clip=False,
                    arrowprops={"arrowstyle": "|-|", "color": ZERO_COLOUR, "lw": 1.5,
                                "mutation_scale": 3})
        ax.annotate(f"g{g}" if small else f"shard group {g}", (left + width / 2, -0.12),
                    xytext=(0, 2), textcoords="offset points", ha="center", va="bottom",
                    fontsize=7 if small else 8, color=ZERO_COLOUR, fontweight="bold",
                    annotation_clip=False)
        if g:
            ax.plot([left, left], [0, tp], color=ZERO_COLOUR, linewidth=2, linestyle="--",
                    zorder=2.1)


def _mark_replicas(ax: Axes, dp: int, cp: int, tp: int, small: bool, pad: float) -> None:
    """cp_rank under every sub-column, dp_rank over every replica, and a thick line in the
    DP colour between replicas."""
    ax.set_xticks([x + 0.5 for x in range(dp * cp)],
                  [str(x % cp) if small else f"cp{x % cp}" for x in range(dp * cp)],
                  color=AXIS_COLOUR["cp"], fontsize=8)
    top = ax.secondary_xaxis("top")
    top.set_xticks([d * cp + cp / 2 for d in range(dp)], [f"dp{d}" for d in range(dp)],
                   color=AXIS_COLOUR["dp"], fontsize=8)
    top.tick_params(length=0, pad=pad)
    for d in range(1, dp):
        ax.plot([d * cp, d * cp], [0, tp], color=AXIS_COLOUR["dp"], linewidth=5, zorder=1.9)
