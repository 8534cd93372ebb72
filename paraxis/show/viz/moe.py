"""Mixtures of experts as pictures: where tokens are routed, what the all-to-all carries, and
how evenly a run's experts were loaded.

- `plot_routing`: tokens (rows) by experts (columns), each cell the router weight a token
  gives an expert it chose (the model's routing, `MoE.route`: Mixtral's softmax, top-k,
  renormalised, or DeepSeek-V3's sigmoid scores, groups and bias), with the tokens per
  expert below: the imbalance the load-balancing loss works against.
- `plot_all_to_all`: the dispatch all-to-all of one MoE block as a matrix of source rank by
  destination rank, rows and bytes, from `paraxis.spec.expert_placement.send_matrix` (the function
  the runtime counts its traffic with and the planner prices); the diagonal stays on its rank.
- `plot_expert_load`: per-expert token counts of every step of a run (its metrics), with the
  busiest expert's load over the mean: under expert parallelism the step waits for the rank
  holding the busiest experts.
"""

from __future__ import annotations

from collections.abc import Sequence

from matplotlib import colormaps
from matplotlib.figure import Figure

from paraxis.show.viz.style import RANK_COLOURS, new_figure
from paraxis.spec.errors import ParaxisError
from paraxis.spec.expert_placement import (
    all_to_all_bytes,
    experts_of_rank,
    kib,
    send_matrix,
)


def plot_routing(chosen: Sequence[Sequence[int]], weights: Sequence[Sequence[float]],
                 n_experts: int, ep: int = 1,
                 counted: Sequence[Sequence[int]] | None = None) -> Figure:
    """chosen/weights: (tokens, top_k) expert indices and their router weights, drawn token
    by token; the bars count `counted` (every token of the batch, of which `chosen` are the
    first) or else `chosen`."""
    tokens = len(chosen)
    if tokens == 0:
        raise ParaxisError("no tokens to draw; route at least one token")
    grid = [[0.0] * n_experts for _ in range(tokens)]
    for row, (experts, ws) in enumerate(zip(chosen, weights, strict=True)):
        for expert, w in zip(experts, ws, strict=True):
            grid[row][expert] = float(w)
    counted = chosen if counted is None else counted
    counts = [0] * n_experts
    for experts in counted:
        for expert in experts:
            counts[expert] += 1
    fig, (top, bottom) = new_figure(1.6 + 0.45 * n_experts, 2.4 + 0.22 * tokens, nrows=2,
                                    height_ratios=(tokens, 5), sharex=True)
    image = top.imshow(grid, cmap=colormaps["Blues"], vmin=0, vmax=1, aspect="auto",
                       interpolation="nearest", extent=(-0.5, n_experts - 0.5, tokens - 0.5,
                                                         -0.5))
    fig.colorbar(image, ax=top, label="router weight", shrink=0.8)
    top.set_ylabel("token")
    first = f"the first {tokens} of {len(counted)} tokens" if len(counted) > tokens else \
        f"{tokens} tokens"
    top.set_title(f"Routing of {first}\n(each to its top {len(chosen[0])} of {n_experts} "
                  "experts)")
    owner = [next(r for r in range(ep) if e in experts_of_rank(n_experts, ep, r))
             for e in range(n_experts)]
    bottom.bar(range(n_experts), counts,
               color=[RANK_COLOURS[o % len(RANK_COLOURS)] for o in owner])
    if ep > len(RANK_COLOURS):  # colours repeat: each bar names its rank
        for expert, (count, rank) in enumerate(zip(counts, owner, strict=True)):
            bottom.text(expert, count, f"r{rank}", ha="center", va="bottom", fontsize=6)
    mean = sum(counts) / n_experts
    bottom.axhline(mean, color="black", linestyle="--", linewidth=1)
    bottom.text(n_experts - 0.5, mean, f" mean {mean:.1f}", va="bottom", ha="right",
                fontsize=8)
    k = len(chosen[0])  # each token counts once per expert it goes to
    bottom.set_ylabel("assignments" if k > 1 else "tokens")
    bottom.set_title(f"all {len(counted)} tokens" + (f" x top {k}" if k > 1 else ""),
                     fontsize=8, loc="left")
    bottom.set_xticks(range(n_experts), [str(e) for e in range(n_experts)])
    bottom.set_xlabel("expert" + (f" (colour: the EP rank holding it, ep={ep})" if ep > 1
                                  else ""))
    return fig


def plot_all_to_all(counts: Sequence[Sequence[int]], ep: int, d_model: int,
                    bytes_per_value: int = 4) -> Figure:
    """counts[i][e]: assignments of EP rank i's tokens to expert e (a run's or a model's)."""
    if len(counts) != ep:
        raise ParaxisError(f"counts has {len(counts)} rows for ep={ep}; give one row of "
                           "per-expert counts per EP rank")
    sends = send_matrix([list(row) for row in counts], ep)
    leaving = all_to_all_bytes(sends, d_model, bytes_per_value)
    fig, ax = new_figure(2.4 + 0.9 * ep, 1.8 + 0.7 * ep)
    top = max(max(row) for row in sends) or 1
    ax.imshow(sends, cmap=colormaps["Oranges"], vmin=0, vmax=top, interpolation="nearest")
    for i, row in enumerate(sends):
        for j, rows in enumerate(row):
            note = "stays" if i == j else f"{kib(rows * d_model * bytes_per_value)} KiB"
            ax.text(j, i, f"{rows}\n{note}", ha="center", va="center", fontsize=8,
                    color="white" if rows > top * 0.6 else "black")
    ax.set_xticks(range(ep), [f"rank {j}\nexperts {_span(experts_of_rank(len(counts[0]), ep, j))}"
                              for j in range(ep)], fontsize=8)
    ax.set_yticks(range(ep), [f"rank {i}: {kib(leaving[i])} KiB out" for i in range(ep)],
                  fontsize=8)
    ax.set_xlabel("to (the rank holding the experts)")
    ax.set_ylabel("from (the rank holding the tokens)")
    ax.set_title("Dispatch all-to-all of one MoE block:\n(token, expert) rows; combine "
                 "sends them back;\nbackward repeats both", fontsize=9)
    return fig


def plot_expert_load(step_counts: Sequence[Sequence[Sequence[int]]]) -> Figure:
    """step_counts[s][b][e]: tokens MoE block b routed to expert e in step s (a run's
    metrics, `expert_tokens`). Left: each expert's tokens per step, summed over the blocks;
    right: each block's busiest expert over its mean, step by step."""
    if not step_counts or not step_counts[0]:
        raise ParaxisError("the run recorded no per-expert counts; train an MoE model first")
    steps, blocks, experts = len(step_counts), len(step_counts[0]), len(step_counts[0][0])
    summed = [[sum(block[e] for block in step) for e in range(experts)] for step in step_counts]
    fig, (left, right) = new_figure(3.0 + 0.35 * experts + 3.5, 1.8 + 0.18 * min(steps, 60),
                                    ncols=2, width_ratios=(experts, 10))
    image = left.imshow(summed, cmap=colormaps["viridis"], aspect="auto",
                        interpolation="nearest")
    fig.colorbar(image, ax=left, label="tokens", shrink=0.8)
    left.set_xlabel("expert")
    left.set_ylabel("step")
    left.set_title(f"Tokens per expert ({blocks} blocks)")
    last = []
    for b in range(blocks):
        peaks = [_peak(step[b]) for step in step_counts]
        right.plot(range(steps), peaks, marker=".", linewidth=1, label=f"block {b}")
        last.append(peaks[-1])
    right.axhline(1.0, color="black", linestyle="--", linewidth=1)
    right.set_xlabel("step")
    right.set_ylabel("busiest expert / mean")
    right.set_title(f"Load imbalance (last step, worst block {max(last):.2f}x)")
    if blocks <= 8:
        right.legend(fontsize=7)
    return fig


def _peak(counts: Sequence[int]) -> float:
    total = sum(counts)
    return max(counts) / (total / len(counts)) if total else 1.0


def _span(experts: range) -> str:
    return f"{experts.start}" if len(experts) == 1 else f"{experts.start}-{experts.stop - 1}"
