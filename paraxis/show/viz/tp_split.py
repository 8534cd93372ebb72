"""Tensor-parallel split: which slice of which weight lives on which TP rank.

Megatron-LM (Shoeybi et al. 2019, sec. 3): q/k/v and the MLP's up (and gate) projections
are column-parallel (output features split: each rank owns whole attention heads / a slice
of the MLP width), o and down are row-parallel (input features split; partial outputs are
summed by one all-reduce), and the embedding and LM head are split by vocabulary rows.
In a mixture-of-experts block the router is whole on every tp rank, and so is each expert
with etp = 1; with etp = tp every expert is split as the dense MLP is. Weights are drawn as
PyTorch stores them, (out_features, in_features). The split styles here must agree with
`paraxis.parallel.tensor.apply.tp_plan`; tests/test_viz.py holds them together.
"""

from __future__ import annotations

from dataclasses import dataclass

from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from paraxis.show.viz.style import RANK_COLOURS, new_figure
from paraxis.spec.model_config import ModelConfig

COLUMN, ROW, VOCAB = "column-parallel", "row-parallel", "vocab-parallel"
WHOLE = "whole on every tp rank"


@dataclass(frozen=True)
class SplitWeight:
    name: str  # parameter name in the model, one block shown as blocks.0
    out_features: int
    in_features: int
    style: str  # COLUMN / VOCAB split dim 0 (rows); ROW splits dim 1 (columns); WHOLE none

    @property
    def split_dim(self) -> int:
        return 1 if self.style == ROW else 0

    def slice_of(self, tp_rank: int, tp: int) -> tuple[int, int]:
        """[start, end) of the split dimension that `tp_rank` holds (even split)."""
        size = (self.out_features, self.in_features)[self.split_dim]
        per = size // tp
        return tp_rank * per, (tp_rank + 1) * per


def _feed_forward(prefix: str, width: int, d: int, gated: bool, up: str,
                  down: str) -> list[SplitWeight]:
    """An MLP's up (and gate) and down projections under `prefix`."""
    names = ("up", "gate") if gated else ("up",)
    return ([SplitWeight(f"{prefix}.{name}.weight", width, d, up) for name in names]
            + [SplitWeight(f"{prefix}.down.weight", d, width, down)])


def split_weights(cfg: ModelConfig, split_experts: bool = False) -> list[SplitWeight]:
    """The weights of one block of each kind (dense MLP, mixture of experts), with the
    embedding and the LM head; the experts split over tp where `split_experts` (etp = tp)."""
    d, kv, ff = cfg.d_model, cfg.kv_dim, cfg.d_ff
    weights = [SplitWeight("tok_emb.weight", cfg.vocab_size, d, VOCAB),
               SplitWeight("blocks.0.attn.q.weight", d, d, COLUMN),
               SplitWeight("blocks.0.attn.k.weight", kv, d, COLUMN),
               SplitWeight("blocks.0.attn.v.weight", kv, d, COLUMN),
               SplitWeight("blocks.0.attn.o.weight", d, d, ROW)]
    gated = cfg.style == "llama"
    if not cfg.is_moe_layer(0):
        weights += _feed_forward("blocks.0.mlp", ff, d, gated, COLUMN, ROW)
    if cfg.is_moe:
        block = f"blocks.{cfg.first_dense_layers}.moe"
        up, down = (COLUMN, ROW) if split_experts else (WHOLE, WHOLE)
        weights.append(SplitWeight(f"{block}.router.weight", cfg.n_experts, d, WHOLE))
        weights += _feed_forward(f"{block}.experts.0", cfg.d_ff_expert, d, True, up, down)
        if cfg.n_shared_experts:
            weights += _feed_forward(f"{block}.shared", cfg.n_shared_experts * cfg.d_ff_expert,
                                     d, True, up, down)
    if not cfg.tied_embeddings:
        weights.append(SplitWeight("lm_head.weight", cfg.vocab_size, d, VOCAB))
    return weights


def plot_tp_split(cfg: ModelConfig, tp: int, etp: int = 1) -> Figure:
    """Each weight of `split_weights` with the band every tp rank holds (etp: 1 or tp)."""
    weights = split_weights(cfg, split_experts=etp > 1)
    for w in weights:
        size = (w.out_features, w.in_features)[w.split_dim]
        if w.style != WHOLE and size % tp:
            raise ValueError(f"{w.name} has {size} features on its split dim, not divisible "
                             f"by tp={tp}")
    cols = 4
    rows = -(-len(weights) // cols)
    fig, axes = new_figure(12, 3.2 * rows, nrows=rows, ncols=cols, squeeze=False)
    for ax in axes.flat[len(weights):]:
        ax.set_visible(False)
    for ax, w in zip(axes.flat, weights, strict=False):
        if w.style == WHOLE:  # every rank holds all of it: one grey panel
            ax.add_patch(Rectangle((0, 0), w.in_features, w.out_features, facecolor="0.6",
                                   edgecolor="white", hatch="//", alpha=0.9))
            ax.text(w.in_features / 2, w.out_features / 2, f"tp0..tp{tp - 1}\nwhole",
                    ha="center", va="center", fontsize=7, color="white", fontweight="bold")
        for t in range(tp if w.style != WHOLE else 0):
            start, end = w.slice_of(t, tp)
            colour = RANK_COLOURS[t % len(RANK_COLOURS)]
            if w.split_dim == 0:  # a band of rows (output features / vocabulary entries)
                rect = Rectangle((0, start), w.in_features, end - start)
            else:  # a band of columns (input features)
                rect = Rectangle((start, 0), end - start, w.out_features)
            rect.set(facecolor=colour, edgecolor="white", linewidth=1.0, alpha=0.9)
            ax.add_patch(rect)
            if tp <= 8:
                x, y = rect.get_x() + rect.get_width() / 2, rect.get_y() + rect.get_height() / 2
                label = f"tp{t}\n{start}:{end}"
                ax.text(x, y, label, ha="center", va="center", fontsize=7, color="white",
                        fontweight="bold", rotation=90 if w.split_dim == 1 and tp > 2 else 0)
        ax.set_xlim(0, w.in_features)
        ax.set_ylim(w.out_features, 0)
        # Vocabulary-sized matrices are far taller than wide; true proportions would make
        # them hair-thin, so each panel fills its box and the shape is in the title instead.
        ax.set_title(f"{w.name.removesuffix('.weight')}\n[{w.out_features} × {w.in_features}]"
                     f" {w.style}", fontsize=9 if w.style != WHOLE else 8)
        ax.set_xlabel("in_features (dim 1)")
        ax.set_ylabel("out_features (dim 0)")
        ax.tick_params(labelsize=7)
    handles = [Patch(facecolor=RANK_COLOURS[t % len(RANK_COLOURS)], label=f"tp_rank {t}")
               for t in range(min(tp, 8))]
    if any(w.style == WHOLE for w in weights):
        handles.append(Patch(facecolor="0.6", hatch="//", label=WHOLE))
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles),
               title="each rank stores only its band (start:end along the split dim); norms "
                     "and biases of row-parallel layers are replicated", title_fontsize=8)
    tied = "; LM head = tok_emb's shard (tied)" if cfg.tied_embeddings else ""
    if not cfg.is_moe:
        blocks = "block 0 shown, all blocks alike"
    elif cfg.first_dense_layers:
        blocks = f"block 0 and MoE block {cfg.first_dense_layers} shown, etp={etp}"
    else:
        blocks = f"block 0 shown, every block a MoE block, etp={etp}"
    fig.suptitle(f"Tensor-parallel split of {cfg.name}, tp={tp} ({blocks}{tied})", x=0.01,
                 ha="left")
    return fig
