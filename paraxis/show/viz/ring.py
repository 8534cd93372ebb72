"""The ring all-reduce as a picture: every rank's chunks after every step.

Rows are the steps (0 = before the first), each rank a block of N chunk cells; a cell's
shade says how many ranks' inputs it already sums, and a dark cell is finished. Drawn from
`paraxis.plan.ring_steps.simulate_ring`, the simulator the real gloo ring is tested against.
"""

from __future__ import annotations

from matplotlib import colormaps
from matplotlib.cm import ScalarMappable
from matplotlib.colors import BoundaryNorm, Colormap
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from paraxis.plan.ring_steps import simulate_ring
from paraxis.show.viz.style import new_figure


def plot_ring(ranks: int) -> Figure:
    sim = simulate_ring(ranks)
    n = sim.ranks
    states = [tuple(tuple(frozenset({r}) for _ in range(n)) for r in range(n))]
    states += [step.contributors for step in sim.steps]
    width = max(9.0, min(13.0, 1.2 + n * n * 0.32 + n * 0.2))
    fig, ax = new_figure(width, 1.6 + 0.34 * len(states))
    cmap = colormaps["viridis_r"].resampled(n)
    norm = BoundaryNorm([k + 0.5 for k in range(n + 1)], n)
    gap = 1  # an empty column between ranks
    for row, state in enumerate(states):
        for r in range(n):
            for c in range(n):
                count = len(state[r][c])
                x = r * (n + gap) + c
                ax.add_patch(_cell(x, row, cmap(norm(count))))
                ax.text(x + 0.5, row + 0.5, str(count), ha="center", va="center", fontsize=7,
                        color="white" if count > n / 2 else "black")
    for step in sim.steps:  # mark the chunk each rank received in this step
        for t in step.transfers:
            x = t.dst * (n + gap) + t.chunk
            ax.add_patch(_cell(x, step.index, "none", edge="black", width=1.8))
    labels = ["start"] + [f"{s.index}: {s.phase}" for s in sim.steps]
    ax.set_yticks([i + 0.5 for i in range(len(states))], labels, fontsize=8)
    ax.set_xticks([r * (n + gap) + n / 2 for r in range(n)], [f"rank {r}" for r in range(n)])
    ax.set_xlim(-0.2, n * (n + gap) - gap + 0.2)
    ax.set_ylim(len(states), 0)
    ax.set_ylabel("step")
    ax.set_xlabel(f"{n} chunks of each rank's vector (chunk 0 left); number = ranks summed "
                  "in it; outlined = just received", fontsize=9)
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    sm = colormaps["viridis_r"].resampled(n)
    fig.colorbar(_mappable(sm, norm), ax=ax, label="ranks summed (of N)", ticks=range(1, n + 1),
                 shrink=0.8)
    per_rank = 2 * (n - 1)
    fig.suptitle(f"Ring all-reduce on {n} ranks: {per_rank} steps, one chunk (X/{n}) sent "
                 "per rank per step", x=0.01, ha="left")
    return fig


def _cell(x: float, y: float, face: object, edge: str = "white", width: float = 1.0
          ) -> Rectangle:
    return Rectangle((x, y), 1, 1, facecolor=face, edgecolor=edge, linewidth=width)


def _mappable(cmap: Colormap, norm: BoundaryNorm) -> ScalarMappable:
    return ScalarMappable(norm=norm, cmap=cmap)
