"""Whether a model's shapes split over a layout's degrees.

Every shape an axis splits must split evenly: tp splits heads, kv heads, the vocabulary and
the MLP width (and with `etp = tp` every expert's width); cp's all-to-all variant splits
heads again; pp needs a layer per model chunk; ep splits the experts. Each broken rule is
one line naming a fix. `Layout.validate` asks it of a model; the planner's search asks
`ep_splits` and `etp_splits` of degrees before it builds a layout.
"""

from __future__ import annotations

from typing import Protocol

from paraxis.spec.cp_balance import check_heads
from paraxis.spec.errors import ParaxisError
from paraxis.spec.grid import divisors_text
from paraxis.spec.model_config import ModelConfig


class Degrees(Protocol):
    """What of a layout (`paraxis.spec.layout.Layout`) the rules read."""

    tp: int
    cp: int
    cp_attention: str
    cp_a2a: int
    pp: int
    virtual_stages: int
    ep: int
    etp: int


def check_model(layout: Degrees, model: ModelConfig) -> None:
    """Raise `ParaxisError` (one line) where `model` does not split over `layout`."""
    _check_experts(layout, model)
    tp = layout.tp
    # tp splits heads, kv heads, vocabulary and MLP width (where a block has a dense MLP):
    # offer degrees dividing them all
    dense = not model.is_moe or model.first_dense_layers > 0
    splits = (model.n_heads, model.n_kv_heads, model.vocab_size, *([model.d_ff] * dense))

    def choices() -> str:  # only for a message: a search validates thousands of layouts
        return ", ".join(str(t) for t in range(1, model.n_heads + 1) if not any(
            n % t for n in splits))
    if model.n_heads % tp:
        raise ParaxisError(f"{model.n_heads} attention heads are not divisible by tp="
                           f"{tp}; choose tp among {choices()}")
    if model.n_kv_heads % tp:
        raise ParaxisError(f"{model.n_kv_heads} kv heads are not divisible by tp={tp}; "
                           f"choose tp among {choices()}")
    # Padding the vocabulary would change the model's loss normalisation and its shapes
    # in checkpoints; an error keeps every layout's model identical.
    if model.vocab_size % tp:
        raise ParaxisError(f"vocab size {model.vocab_size} is not divisible by tp={tp}; "
                           f"pad the vocabulary to a multiple of tp or choose tp among "
                           f"{choices()}")
    if dense and model.d_ff % tp:
        raise ParaxisError(f"MLP width {model.d_ff} is not divisible by tp={tp}; "
                           f"choose tp among {choices()}")
    check_heads(layout.cp_attention, model.n_heads // tp, model.n_kv_heads // tp, layout.cp)
    heads, kv_heads, a = model.n_heads // tp, model.n_kv_heads // tp, layout.cp_a2a
    if a > 1 and (heads % a or (kv_heads % a and a % kv_heads)):
        raise ParaxisError(f"cp_a2a={a} splits the attention heads inside each group: {heads}"
                           f" heads and {kv_heads} kv heads (per TP rank) must divide by it "
                           "(kv heads may divide it instead); choose another cp_a2a")
    chunks = layout.pp * layout.virtual_stages
    if model.n_layers < chunks:
        raise ParaxisError(
            f"{model.n_layers} layers cannot fill pp*virtual_stages = {chunks} model "
            f"chunks (each needs at least one layer); use pp*virtual_stages <= "
            f"{model.n_layers}")


def ep_splits(model: ModelConfig, ep: int) -> bool:
    """Whether ep ranks can share `model`'s experts evenly (ep=1: any model)."""
    return ep == 1 or (model.is_moe and model.n_experts % ep == 0)


def etp_splits(model: ModelConfig, etp: int) -> bool:
    """Whether every expert of `model` splits over etp ranks (etp=1: any model)."""
    return etp == 1 or (model.is_moe and model.d_ff_expert % etp == 0)


def _check_experts(layout: Degrees, model: ModelConfig) -> None:
    if layout.ep > 1 and not model.n_experts:
        raise ParaxisError(f"ep={layout.ep} needs a mixture-of-experts model, and "
                           f"{model.name} has no experts; use ep=1 or an MoE model "
                           "(e.g. tiny-moe)")
    if not ep_splits(model, layout.ep):
        raise ParaxisError(f"ep={layout.ep} must divide the number of experts "
                           f"({model.n_experts}); choose ep among "
                           f"{divisors_text(model.n_experts)}")
    if layout.etp > 1 and not model.n_experts:
        raise ParaxisError(f"etp={layout.etp} splits experts, and {model.name} has none; "
                           "drop etp")
    if not etp_splits(model, layout.etp):
        raise ParaxisError(f"expert width {model.d_ff_expert} is not divisible by etp="
                           f"{layout.etp}; use etp=1 (experts whole on every tp rank)")
