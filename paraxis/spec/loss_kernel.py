"""The loss kernel: what the cross entropy holds, one fact the runtime runs and the planner
prices.

The runtime's cross entropy (`paraxis.parallel.tensor.cross_entropy`, also on one device)
keeps, for the backward, the logits in the dtype they were computed in (bf16 under
autocast) and one fp32 log-sum-exp per token; its backward writes the gradient of the logits
in that same dtype. The fp32 softmax exists only a chunk of tokens at a time, in a
workspace of at most `CHUNK_BYTES`: the backward upcasts a chunk of logits, turns it into
softmax minus one-hot in place, and writes it into the gradient.

So at the loss's backward, the first moment of the backward and the step's memory peak
while every layer's activations are still held, the loss holds 2 x (element bytes) x s b v
/ t plus one workspace: Korthikanti et al.'s 4sbv/t for 16-bit logits (their Sec. 4.3 count
of "the output layer and fp32 cross entropy"). The first version ran
`F.cross_entropy(logits.float())`, which keeps an fp32 log-softmax and, in its backward,
allocates two more fp32 (tokens, vocab) tensors and a bf16 copy: about 3.5 x 4sbv at once,
3.6 GiB more than priced for GPT-2 124M at 8 x 1024 tokens on an H100 (docs/gpu/README.md).

Plain numbers, no torch: the planner imports it as freely as the runtime does.
"""

from __future__ import annotations

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
    `element_bytes` each: the saved logits, their gradient and one chunk's fp32 workspace."""
    return 2 * element_bytes * tokens * width + workspace_bytes(tokens, width)
