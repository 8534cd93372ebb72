"""Tensor-parallel split: which slice of which weight lives on which TP rank.

Megatron-LM (Shoeybi et al. 2019, sec. 3): q/k/v and the MLP's up (and gate) projections
are column-parallel (output features split: each rank owns whole attention heads / a slice
of the MLP width), o and down are row-parallel (input features split; partial outputs are
summed by one all-reduce), and the embedding and LM head are split by vocabulary rows.
Weights are drawn as PyTorch stores them, (out_features, in_features). The split styles
here must agree with `paraxis.tensor_parallel.apply.PLAN`; tests/test_viz.py holds them
together.
"""

from __future__ import annotations

from dataclasses import dataclass

from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from paraxis.model_config import ModelConfig
from paraxis.viz.style import RANK_COLOURS, new_figure

COLUMN, ROW, VOCAB = "column-parallel", "row-parallel", "vocab-parallel"


@dataclass(frozen=True)
class SplitWeight:
    name: str  # parameter name in the model, one block shown as blocks.0
    out_features: int
    in_features: int
    style: str  # COLUMN / VOCAB split dim 0 (rows); ROW splits dim 1 (columns)

    @property
    def split_dim(self) -> int:
        return 1 if self.style == ROW else 0

    def slice_of(self, tp_rank: int, tp: int) -> tuple[int, int]:
        """[start, end) of the split dimension that `tp_rank` holds (even split)."""
        size = (self.out_features, self.in_features)[self.split_dim]
        per = size // tp
        return tp_rank * per, (tp_rank + 1) * per


def split_weights(cfg: ModelConfig) -> list[SplitWeight]:
    d, kv, ff = cfg.d_model, cfg.kv_dim, cfg.d_ff
    weights = [SplitWeight("tok_emb.weight", cfg.vocab_size, d, VOCAB),
               SplitWeight("blocks.0.attn.q.weight", d, d, COLUMN),
               SplitWeight("blocks.0.attn.k.weight", kv, d, COLUMN),
               SplitWeight("blocks.0.attn.v.weight", kv, d, COLUMN),
               SplitWeight("blocks.0.attn.o.weight", d, d, ROW),
               SplitWeight("blocks.0.mlp.up.weight", ff, d, COLUMN)]
    if cfg.style == "llama":
        weights.append(SplitWeight("blocks.0.mlp.gate.weight", ff, d, COLUMN))
    weights.append(SplitWeight("blocks.0.mlp.down.weight", d, ff, ROW))
    if not cfg.tied_embeddings:
        weights.append(SplitWeight("lm_head.weight", cfg.vocab_size, d, VOCAB))
    return weights


def plot_tp_split(cfg: ModelConfig, tp: int) -> Figure:
    weights = split_weights(cfg)
    for w in weights:
        size = (w.out_features, w.in_features)[w.split_dim]
        if size % tp:
            raise ValueError(f"{w.name} has {size} features on its split dim, not divisible "
                             f"by tp={tp}")
    cols = 4
    rows = -(-len(weights) // cols)
    fig, axes = new_figure(12, 3.2 * rows, nrows=rows, ncols=cols, squeeze=False)
    for ax in axes.flat[len(weights):]:
        ax.set_visible(False)
    for ax, w in zip(axes.flat, weights, strict=False):
        for t in range(tp):
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
                     f" {w.style}", fontsize=9)
        ax.set_xlabel("in_features (dim 1)")
        ax.set_ylabel("out_features (dim 0)")
        ax.tick_params(labelsize=7)
    handles = [Patch(facecolor=RANK_COLOURS[t % len(RANK_COLOURS)], label=f"tp_rank {t}")
               for t in range(min(tp, 8))]
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles),
               title="each rank stores only its band (start:end along the split dim); norms "
                     "and biases of row-parallel layers are replicated", title_fontsize=8)
    tied = "; LM head = tok_emb's shard (tied)" if cfg.tied_embeddings else ""
    fig.suptitle(f"Tensor-parallel split of {cfg.name}, tp={tp} (block 0 shown, all blocks "
                 f"alike{tied})", x=0.01, ha="left")
    return fig
