"""What the two memory-heavy kernels keep and compute: facts the runtime runs and the planner
prices. Plain data, no torch.

**Attention.** paraxis.model.transformer calls torch's `scaled_dot_product_attention` with a
causal mask and K, V at their kv-head width (`enable_gqa=True`). PyTorch runs it as a
flash-style kernel (FlashAttention, Dao et al. 2022) on GPU and on CPU alike
(`ScaledDotProductFlashAttentionForCpuBackward` on CPU): the s x s scores exist only tile by
tile in fast memory; for backward the kernel keeps q, k, v, its output and one fp32
log-sum-exp per head and row, and recomputes the scores (tests/test_attention_kernel.py reads
the saved tensors). The "math" kernel is the textbook softmax(Q K^T / sqrt(d)) V that
Megatron-LM ran in the published runs of 2021-22: it keeps the softmax output, the dropout
mask and its output (the s^2 terms Korthikanti et al. 2022 Sec. 4.1 count), computes every
score of the causal mask's upper half, and runs on K, V repeated to the full head count.

Document packing (paraxis.parallel.context.packing) adds a mask keeping attention within
each document. On CPU the model hands SDPA a boolean (b, 1, s, s) mask, and PyTorch still
runs the flash kernel (tests/test_packing.py), but computes every tile of the square: with a
mask it cannot skip the tiles above the diagonal (`python -m tools.probes.packing` times
it). On CUDA the model runs flex attention with a block mask, which skips the blocks where no
query and key share a document. The planner prices the unpacked causal kernel (`FLASH`) for
every run; packing's mask is not in its time model.

**Loss.** The runtime's cross entropy (`paraxis.parallel.tensor.cross_entropy`, also on one
device) keeps, for the backward, the logits in the dtype they were computed in (bf16 under
autocast) and one fp32 log-sum-exp per token; its backward writes the gradient of the logits
in that same dtype. The fp32 softmax exists only a chunk of tokens at a time, in a workspace
of at most `CHUNK_BYTES`: the backward upcasts a chunk of logits, turns it into softmax minus
one-hot in place, and writes it over that chunk of the logits (the model's head makes them
for the loss alone; compiled, one fused pass reads them and writes the gradient, into their
buffer where the compiler reuses it). So at the loss's backward (the step's memory peak,
while every layer's activations are still held) the loss holds (element bytes) x s b v / t
plus one workspace: 2sbv/t for 16-bit logits, where Korthikanti et al. (2022, Sec. 4.3)
count 4sbv/t for "the output layer and fp32 cross entropy", Megatron-LM's fp32 softmax.
What a plain `F.cross_entropy(logits.float())` costs instead was measured on an H100
(docs/gpu/README.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from paraxis.spec.errors import ParaxisError

# --------------------------------------------------------------------------- attention


@dataclass(frozen=True)
class AttentionKernel:
    name: str
    keeps_scores: bool  # an s x s matrix per head is stored for backward
    logsumexp_bytes: int  # bytes stored per head per query row (fp32 log-sum-exp: 4)
    # share of the s x s scores the kernel computes under a causal mask: flash skips the
    # tiles above the diagonal, the math kernel computes them all and masks afterwards
    causal_fraction: float
    # backward FLOPs / forward FLOPs of the core: the math kernel's backward is two matmuls
    # per forward matmul; flash also recomputes Q K^T (Dao 2023, FlashAttention-2 Sec. 3.1.2:
    # 5 matmuls against the forward's 2)
    backward_ratio: float
    kv_heads_native: bool  # K and V stay at kv-head width (no repeat for grouped queries)


FLASH = AttentionKernel("flash", keeps_scores=False, logsumexp_bytes=4, causal_fraction=0.5,
                        backward_ratio=2.5, kv_heads_native=True)
MATH = AttentionKernel("math", keeps_scores=True, logsumexp_bytes=0, causal_fraction=1.0,
                       backward_ratio=2.0, kv_heads_native=False)
KERNELS: dict[str, AttentionKernel] = {k.name: k for k in (FLASH, MATH)}
# What paraxis.model.transformer runs (torch's SDPA, flash on CPU and on bf16/fp16 GPUs).
RUNTIME_KERNEL = FLASH


def get_kernel(name: str) -> AttentionKernel:
    if name not in KERNELS:
        raise ParaxisError(f"unknown attention kernel {name!r}; use one of {', '.join(KERNELS)}")
    return KERNELS[name]


# -------------------------------------------------------------------------- the loss

CHUNK_BYTES = 256 * 2**20  # fp32 workspace of one chunk of tokens (a few dozen chunks at most)
WORKSPACE_ELEMENT_BYTES = 4  # the chunk's softmax is fp32 whatever the logits' dtype


def chunk_rows(width: int) -> int:
    """Tokens per chunk for logits `width` wide (the vocabulary, or its 1/t slice)."""
    return max(1, CHUNK_BYTES // (WORKSPACE_ELEMENT_BYTES * max(1, width)))


def workspace_bytes(tokens: int, width: int) -> float:
    """One chunk's fp32 workspace: the fewer of `tokens` and a chunk's rows."""
    return min(tokens, chunk_rows(width)) * width * WORKSPACE_ELEMENT_BYTES


def loss_bytes(tokens: int, width: int, element_bytes: float) -> float:
    """Bytes the loss holds at its backward for `tokens` rows of `width` logits of
    `element_bytes` each: the saved logits, which their gradient is written over (eager, a
    chunk at a time; compiled, one fused pass), and one chunk's fp32 workspace."""
    return element_bytes * tokens * width + workspace_bytes(tokens, width)


# The LM head and the loss fused (`--fused-loss`, parallel/tensor/cross_entropy.py's
# `linear_cross_entropy`): per chunk of tokens the logits, their loss and gradient, and the
# chunk's share of dL/dx and dL/dW, so the logits never exist whole. It needs the whole
# vocabulary on the rank and the head's weight in place without ZeRO-3's gather hooks.

LOSS_KERNELS = ("chunked", "fused-linear")  # what the planner prices (GPU.loss_kernel)


def fused_loss_problem(tp: int, zero: int) -> str | None:
    """Why the runtime cannot run `--fused-loss` at this tp and ZeRO stage (None: it can);
    the planner prices the chunked loss there."""
    if tp > 1:
        return (f"--fused-loss computes the loss from one rank's whole vocabulary; tp={tp} "
                "splits it (the vocab-parallel loss runs there): drop --fused-loss or use tp=1")
    if zero >= 3:
        return ("--fused-loss reads the LM head's weight directly, which ZeRO-3 gathers only "
                "around the head's own forward: drop --fused-loss or use zero 0-2")
    return None


def loss_kernel_run(asked: str, tp: int, zero: int) -> str:
    """The loss kernel the runtime runs when `asked` for one: the fused head and loss where
    it can run them (`fused_loss_problem`), else the chunked loss."""
    return asked if asked == "fused-linear" and fused_loss_problem(tp, zero) is None \
        else "chunked"


def check_fused_loss(tp: int, zero: int) -> None:
    """Refuse `--fused-loss` where the runtime cannot run it."""
    if problem := fused_loss_problem(tp, zero):
        raise ParaxisError(problem)


def fused_loss_bytes(tokens: int, width: int, hidden: int, element_bytes: float,
                     saved_bytes: float | None = None) -> float:
    """Bytes the fused head and loss hold at the forward's peak for `tokens` rows of a
    `width` vocabulary from `hidden`-wide inputs, logits of `element_bytes`: the fp32 dL/dW
    it sums into and dL/dx (`saved_bytes` an element: the compute dtype's, but fp32 for
    fp16: `cross_entropy.saved_dtype`), and the more of: one chunk's logits and fp32
    workspace while it runs; the chunks' dL/dx joined into one tensor. Its cast of dL/dW to
    16 bits for the backward is the size of the head's gradient, which the planner holds
    beside these bytes at the backward's start (`plan.memory.layout_memory`), so that
    moment's count is the larger."""
    saved = element_bytes if saved_bytes is None else saved_bytes
    rows = min(tokens, chunk_rows(width))
    inputs = tokens * hidden
    return 4 * width * hidden + saved * inputs + max(
        rows * width * (element_bytes + WORKSPACE_ELEMENT_BYTES), saved * inputs)


def fused_loss_traffic(tokens: int, width: int, hidden: int, element_bytes: float
                       ) -> tuple[float, float]:
    """(forward, backward) bytes the fused head and loss move for `tokens` rows of a
    `width` vocabulary from `hidden`-wide inputs, beyond its GEMMs' own reads and writes and
    its chunks' loss passes. Forward: its fp32 dL/dW zeroed (4 bytes an entry), read and
    written by each chunk's dL/dW GEMM, which adds into it in its epilogue (8 a chunk:
    `kernels.accumulate`), scaled by 1 / the count in place (8) and cast to the compute
    dtype (4 + e, e its bytes; none in fp32); the chunks' dL/dx joined and scaled (4e a
    token's entry). Backward: both scaled by the loss's gradient (2e). The chunked loss's
    dL/dW is one GEMM that writes its output once. On Llama 3's 128256 x 4096 head at 8K
    tokens, 16 chunks: 79 GB a step."""
    chunks = math.ceil(tokens / chunk_rows(width))
    weight, inputs = width * hidden, tokens * hidden
    cast = 4 + element_bytes if element_bytes < 4 else 0
    forward = weight * (4 + 8 * chunks + 8 + cast) + inputs * 4 * element_bytes
    return forward, (weight + inputs) * 2 * element_bytes
