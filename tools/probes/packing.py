"""What document packing costs and saves: `python -m tools.probes.packing` (docs/data.md quotes it).

1. The attention kernel on CPU: torch's SDPA with a boolean document mask still runs the
   flash kernel, but computes every tile of the s x s square (it cannot skip the tiles above
   the diagonal, as `is_causal=True` does), so a packed window's attention costs about what
   a full square does. Timed on one thread, s = 2048, 8 documents of 256 tokens.
2. The scores packing leaves to compute: over windows drawn as training draws them from a
   corpus of documents (the Python standard library's .py files, one document each, ended by
   NUL as `paraxis data prepare` writes them byte-level), the share of the causal scores that
   lie within one document, and what that share of llama3-8b's attention is of its MFU count
   (which keeps counting the whole causal window: `paraxis.plan.compute`).
"""

from __future__ import annotations

import sysconfig
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from paraxis.parallel.context.packing import find_documents
from paraxis.plan.compute import counted_forward_flops_per_token
from paraxis.spec.model_config import PRESETS


def _seconds(run: Callable[[], object], repeats: int = 3) -> float:
    run()
    started = time.perf_counter()
    for _ in range(repeats):
        run()
    return (time.perf_counter() - started) / repeats


def kernel_times(seq: int = 2048, documents: int = 8) -> dict[str, float]:
    torch.set_num_threads(1)
    q = torch.randn(1, 4, seq, 64, generator=torch.Generator().manual_seed(0))
    tokens = torch.ones(1, seq, dtype=torch.long)
    tokens[0, seq // documents - 1::seq // documents] = 0
    mask = find_documents(tokens, 0).attention_mask
    return {"causal (is_causal)": _seconds(lambda: F.scaled_dot_product_attention(
                q, q, q, is_causal=True)),
            "document mask": _seconds(lambda: F.scaled_dot_product_attention(
                q, q, q, attn_mask=mask)),
            "full square": _seconds(lambda: F.scaled_dot_product_attention(q, q, q))}


def stdlib_documents() -> np.ndarray:
    """The standard library's .py files, each a document ended by NUL (byte tokens)."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    return np.frombuffer(b"".join(f.read_bytes().replace(b"\0", b"") + b"\0" for f in files),
                         dtype=np.uint8)


def within_documents(tokens: np.ndarray, seq: int, windows: int = 64) -> tuple[float, float]:
    """(documents per window, share of the causal scores within one document) over
    `windows` windows at random offsets."""
    starts = np.random.default_rng(0).integers(0, len(tokens) - seq, size=windows)
    rows = torch.from_numpy(np.stack([tokens[s:s + seq] for s in starts]).astype(np.int64))
    ids = find_documents(rows, 0).ids
    kept = 0
    for row in ids:
        lengths = torch.unique_consecutive(row, return_counts=True)[1].double()
        kept += float((lengths * (lengths + 1) / 2).sum())
    return float(ids[:, -1].double().mean() + 1), kept / (windows * seq * (seq + 1) / 2)


def main() -> None:
    for name, seconds in kernel_times().items():
        print(f"SDPA on CPU, s=2048, {name}: {seconds * 1e3:.0f} ms")
    tokens = stdlib_documents()
    cfg = PRESETS["llama3-8b"]
    for seq in (1024, 8192):
        per_window, share = within_documents(tokens, seq)
        weights, scores = counted_forward_flops_per_token(cfg, seq)
        attention = scores / (weights + scores)  # of a layer's counted forward FLOPs
        print(f"seq {seq}: {per_window:.2f} documents per window, {share:.1%} of the causal "
              f"scores within one document; llama3-8b's attention is {attention:.1%} of a "
              f"layer's MFU count, of which packing computes {share:.1%}")


if __name__ == "__main__":
    main()
