"""Activation memory of one transformer layer for one microbatch (Korthikanti et al. 2022).

The paper's Sec. 4.1 counts, per layer, s*b*h*(34 + 5*a*s/h) bytes for a GPT block with 16-bit
activations and 1-byte dropout masks. We keep its term-by-term accounting but read the widths
from the ModelConfig, so SwiGLU MLPs, grouped-query attention and dropout-free (Llama) blocks
are priced by the same rules; for a GPT block it reduces to the paper's formulas exactly.
"""

from __future__ import annotations

from paraxis.model_config import ModelConfig


def layer_activation_bytes(cfg: ModelConfig, seq_len: int, micro_batch: int, tp: int = 1,
                           sequence_parallel: bool = False, recompute: str = "none") -> float:
    """Bytes one layer keeps for backward, per GPU, for `micro_batch` sequences."""
    s, b, h, f, a = seq_len, micro_batch, cfg.d_model, cfg.d_ff, cfg.n_heads
    kv = cfg.kv_dim
    dropout = cfg.style == "gpt2"
    if recompute == "full":
        # Korthikanti et al. 2022 Sec. 4.4 / Table 2: only the layer input (2sbh) is kept,
        # split over tp with sequence parallelism.
        return 2 * s * b * h / (tp if sequence_parallel else 1)
    # Sec. 4.1: parts outside the TP regions (2 LayerNorm inputs 4sbh, attention and MLP
    # inputs 2sbh each, 2 dropout masks sbh each) -> 10sbh, replicated unless SP (Sec. 4.2.2).
    outside = 4 * s * b * h + 2 * s * b * h + 2 * s * b * h + (2 * s * b * h if dropout else 0)
    # Inside TP: Q (2sbh), K and V (2sb*kv each), output-projection input (2sbh) ...
    attention = 2 * s * b * h + 4 * s * b * kv + 2 * s * b * h
    # ... MLP: GELU input and output (2sbf each, 16sbh at f=4h); SwiGLU keeps gate, up, product.
    mlp = (4 if cfg.style == "gpt2" else 6) * s * b * f
    # ... attention scores: softmax out 2as^2b, dropout mask as^2b and output 2as^2b -> 5as^2b;
    # selective recompute drops them (Sec. 5), as does a dropout-free block's 3 of 5.
    scores = (5 if dropout else 2) * a * s * s * b
    if recompute == "selective":
        scores = 0
    inside = (attention + mlp + scores) / tp
    return inside + outside / (tp if sequence_parallel else 1)


def full_layer_activation_bytes(cfg: ModelConfig, seq_len: int, micro_batch: int,
                                tp: int = 1, sequence_parallel: bool = False) -> float:
    """What a fully recomputed layer rebuilds during its backward (a temporary buffer)."""
    return layer_activation_bytes(cfg, seq_len, micro_batch, tp, sequence_parallel, "none")


def logits_bytes(cfg: ModelConfig, seq_len: int, micro_batch: int, tp: int = 1) -> float:
    # Korthikanti et al. 2022 Sec. 4.3: the output layer and fp32 cross entropy, 4sbv/t.
    return 4 * seq_len * micro_batch * cfg.vocab_size / tp
