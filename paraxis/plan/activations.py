"""Activation memory of one transformer layer for one microbatch (Korthikanti et al. 2022).

The paper's Sec. 4.1 counts, per layer, s*b*h*(34 + 5*a*s/h) bytes for a GPT block with 16-bit
activations and 1-byte dropout masks. We keep its term-by-term accounting but read the widths
from the ModelConfig, so SwiGLU MLPs, grouped-query attention and dropout-free (Llama) blocks
are priced by the same rules; for a GPT block and the math kernel it reduces to the paper's
formulas exactly.

The attention core follows the kernel that runs it (`paraxis/spec/kernels.py`): the
"math" kernel keeps the s x s scores (the paper's 5as^2b); the flash kernel
paraxis.model.transformer runs
keeps q, k, v, its output and a log-sum-exp per head and row, nothing quadratic in s.
"""

from __future__ import annotations

import functools
import math

from paraxis.spec.kernels import (
    RUNTIME_KERNEL,
    AttentionKernel,
    fused_loss_bytes,
    get_kernel,
    loss_bytes,
)
from paraxis.spec.model_config import ModelConfig


def _qkv_bytes(cfg: ModelConfig, seq_len: int, micro_batch: int, kernel: AttentionKernel,
               element_bytes: float = 2) -> float:
    kv = cfg.kv_dim if kernel.kv_heads_native else cfg.d_model
    return element_bytes * seq_len * micro_batch * (cfg.d_model + 2 * kv)


def has_dropout(cfg: ModelConfig, dropout: bool | None) -> bool:
    """Whether the run keeps dropout masks: as stated, else Korthikanti's GPT block (dropout
    after attention, in the scores and after the MLP; a Llama block has none).
    paraxis.model.transformer has no dropout, and the cost model says so for its runtime
    (cost.runtime_dropout)."""
    return cfg.style == "gpt2" if dropout is None else dropout


def attention_kernel_bytes(cfg: ModelConfig, seq_len: int, micro_batch: int,
                           kernel: AttentionKernel = RUNTIME_KERNEL,
                           element_bytes: float = 2, dropout: bool | None = None) -> float:
    """Bytes the attention kernel itself keeps for backward, whole layer (before TP):
    q, k and v (k, v at kv-head width unless the kernel repeats them to every head), then the
    flash kernel's output and fp32 log-sum-exp, or the math kernel's scores (Korthikanti et
    al. 2022 Sec. 4.1: softmax output 2as^2b, with dropout also its mask as^2b and output
    2as^2b, in 16-bit elements)."""
    s, b, h, a = seq_len, micro_batch, cfg.d_model, cfg.n_heads
    qkv = _qkv_bytes(cfg, s, b, kernel, element_bytes)
    if kernel.keeps_scores:
        masks = has_dropout(cfg, dropout)
        return qkv + (5 if masks else 2) * element_bytes / 2 * a * s * s * b
    return qkv + element_bytes * s * b * h + kernel.logsumexp_bytes * a * s * b


@functools.lru_cache(maxsize=8192)  # a layout search asks for the same few thousand
def layer_activation_bytes(cfg: ModelConfig, seq_len: int, micro_batch: int, tp: int = 1,
                           sequence_parallel: bool = False, recompute: str = "none",
                           attention: str = RUNTIME_KERNEL.name,
                           dropout: bool | None = None, mlp: bool = True,
                           head_split: bool = False, sp_regather: bool = True) -> float:
    """Bytes one layer keeps for backward, per GPU, for `micro_batch` sequences, with the
    attention core run by the kernel named `attention` ("flash" or "math") and dropout
    masks where the run has dropout (`has_dropout`); `head_split`: context parallelism
    splits heads around the core (all-to-all, one level or two). Without `mlp`, the MLP's
    own tensors are left out (an MoE block's experts keep theirs:
    `experts.moe_activation_bytes`). `sp_regather`: under sequence parallelism the
    column-parallel GEMMs keep their input's sequence shard and gather it again in the
    backward (Megatron-LM); without, they keep the gathered input whole, as autograd does
    in paraxis's runtime (`plan/tp_layer.py`)."""
    s, b, h, f = seq_len, micro_batch, cfg.d_model, cfg.d_ff
    kernel = get_kernel(attention)
    dropout = has_dropout(cfg, dropout)
    if recompute == "full":
        # Korthikanti et al. 2022 Sec. 4.4 / Table 2: only the layer input (2sbh) is kept,
        # split over tp with sequence parallelism.
        return 2 * s * b * h / (tp if sequence_parallel else 1)
    # Sec. 4.1: parts outside the TP regions (2 LayerNorm inputs 4sbh, attention and MLP
    # inputs 2sbh each, 2 dropout masks sbh each) -> 10sbh, replicated unless SP (Sec. 4.2.2).
    outside = 4 * s * b * h + 2 * s * b * h + 2 * s * b * h + (2 * s * b * h if dropout else 0)
    # Inside TP: the attention kernel's tensors, the output projection's input ...
    core = attention_kernel_bytes(cfg, s, b, kernel, dropout=dropout)
    if recompute == "selective":
        # Sec. 5: the core is recomputed, so only its inputs q, k, v stay (the math kernel's
        # scores, the flash kernel's output and log-sum-exp are rebuilt in the backward).
        core = _qkv_bytes(cfg, s, b, kernel)
    kept_attention = core + projection_input_bytes(cfg, s, b, recompute, attention,
                                                   head_split) \
        + rotary_bytes(cfg, s, b, recompute, attention, head_split)
    # ... MLP: GELU input and output (2sbf each, 16sbh at f=4h); SwiGLU keeps gate, up and
    # product, recomputing silu(gate) in the backward (paraxis.kernels.activation).
    kept_mlp = (4 if cfg.style == "gpt2" else 6) * s * b * f * mlp
    inside = (kept_attention + kept_mlp) / tp
    if sequence_parallel and not sp_regather:
        # the attention's and the MLP's gathered inputs, whole on every rank
        gathered = 2 * s * b * h * (1 + mlp)
        return inside + (outside - gathered) / tp + gathered
    return inside + outside / (tp if sequence_parallel else 1)


def projection_input_bytes(cfg: ModelConfig, seq_len: int, micro_batch: int,
                           recompute: str = "none", attention: str = RUNTIME_KERNEL.name,
                           head_split: bool = False) -> float:
    """The output projection's input apart from the attention kernel's tensors (2sbh): none
    where the flash kernel keeps its output for its own backward, as that output is the
    input (its memory holds each token's heads together, as the ring's and all-gather's
    outputs do too, so they go back to rows as a view: paraxis.model.transformer, measured
    by tests/test_plan_activations.py); the math kernel's attention-over-values product, a
    selectively recomputed core's output, or the all-to-all's output (`head_split`: the
    second all-to-all's, a tensor of its own beside the one the kernel keeps) otherwise."""
    if not keeps_projection_input(recompute, attention, head_split):
        return 0.0
    return 2 * seq_len * micro_batch * cfg.d_model


def keeps_projection_input(recompute: str = "none", attention: str = RUNTIME_KERNEL.name,
                           head_split: bool = False) -> bool:
    """Whether the output projection's input is a tensor of its own (`projection_input_bytes`)."""
    return recompute != "none" or head_split or get_kernel(attention).keeps_scores


def rotary_bytes(cfg: ModelConfig, seq_len: int, micro_batch: int, recompute: str = "none",
                 attention: str = RUNTIME_KERNEL.name, head_split: bool = False) -> float:
    """What rotary positions add beside the flash kernel's q, k, v: the kernel keeps the
    rotated q and k, new tensors, while its v, a view of the one q/k/v projection
    (kernels.linear.project), keeps that whole projection alive, q and k included: q and k
    twice. Not under selective recompute (rotation runs inside the recomputed core, whose
    inputs are the projection's views), nor for the math kernel's repeated K and V, nor
    where an all-to-all splits heads (`head_split`: it copies q, k and v into the kernel's
    own, and keeps none of the rotated ones or the projection)."""
    if cfg.style != "llama" or keeps_projection_input(recompute, attention, head_split):
        return 0.0
    return 2 * seq_len * micro_batch * (cfg.d_model + cfg.kv_dim)


def full_layer_activation_bytes(cfg: ModelConfig, seq_len: int, micro_batch: int,
                                tp: int = 1, sequence_parallel: bool = False,
                                attention: str = RUNTIME_KERNEL.name,
                                dropout: bool | None = None, head_split: bool = False,
                                sp_regather: bool = True) -> float:
    """What a fully recomputed layer rebuilds during its backward (a temporary buffer)."""
    return layer_activation_bytes(cfg, seq_len, micro_batch, tp, sequence_parallel, "none",
                                  attention, dropout, head_split=head_split,
                                  sp_regather=sp_regather)


def logits_bytes(cfg: ModelConfig, seq_len: int, micro_batch: int, tp: int = 1,
                 element_bytes: float = 2, loss_kernel: str = "chunked",
                 compute_dtype: str = "bf16") -> float:
    """The loss at its backward (`paraxis.spec.kernels`): logits of `element_bytes`, their
    gradient written over them (2sbv/t for 16-bit logits), plus one chunk's fp32 workspace;
    with the head and loss fused ("fused-linear", tp = 1), dL/dx, an fp32 dL/dW and one
    chunk or their casts instead (`fused_loss_bytes`; kept in fp32 under fp16 compute)."""
    tokens = seq_len * micro_batch
    if loss_kernel == "fused-linear":
        return fused_loss_bytes(tokens, cfg.vocab_size, cfg.d_model, element_bytes,
                                4 if compute_dtype == "fp16" else element_bytes)
    return loss_bytes(tokens, math.ceil(cfg.vocab_size / tp), element_bytes)


def weight_grad_input_values(cfg: ModelConfig, seq_len: int, micro_batch: int, tp: int = 1,
                             sequence_parallel: bool = False, mlp: bool = True) -> float:
    """Values one block keeps from a split backward's B until its W, per GPU
    (`engine.pipeline_parallel.split_backward`): the gradient each weighted op's output
    received, from which W computes the op's weight gradient. The column-parallel GEMMs'
    (q, k, v; the MLP's in, gate and up for SwiGLU) at their tp slice of the width, the
    row-parallel ones' (the output projection, the MLP's down) whole, as the GEMM writes
    its output before the sum over tp, and the two norms' on their sequence shard under
    sequence parallelism. Without `mlp`, the MLP's are left out (an MoE block's:
    `experts.moe_weight_grad_input_values`)."""
    tokens = seq_len * micro_batch
    mlp_in = (2 if cfg.style == "llama" else 1) * cfg.d_ff * mlp
    column = (cfg.d_model + 2 * cfg.kv_dim + mlp_in) / tp
    row = cfg.d_model * (1 + mlp)
    norms = 2 * cfg.d_model / (tp if sequence_parallel else 1)
    return tokens * (column + row + norms)


def chunk_end_weight_grad_input_values(cfg: ModelConfig, seq_len: int, micro_batch: int,
                                       tp: int = 1, sequence_parallel: bool = False,
                                       embedding: bool = False, head: str = "") -> float:
    """What a split backward keeps for W at a chunk's ends, beside its blocks': on the
    chunk that starts with the embedding, whose input (token ids) needs no gradient so that
    W is its whole backward, the gradient of its output; on the chunk with the head, the
    final norm's output gradient and, unless the head and loss are fused (`head` =
    "fused-linear": their one node receives the loss's scalar gradient), the logits'
    gradient at the rank's share of the vocabulary (`head` = "chunked")."""
    tokens = seq_len * micro_batch
    stream = tokens * cfg.d_model / (tp if sequence_parallel else 1)
    values = stream if embedding else 0.0
    if head:
        values += stream
        if head != "fused-linear":
            values += tokens * math.ceil(cfg.vocab_size / tp)
    return values
