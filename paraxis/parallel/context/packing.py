"""Document packing: attention, positions and loss kept within each document.

Training windows are cut at random offsets from one stream of documents, each ended by an
end-of-document id (`data_prepare.end_of_document`: 0 for bytes, the tokenizer's EOS
otherwise), so a window of s tokens usually holds the tail of one document, some whole ones
and the head of another. With `[train] pack_documents = true` the model treats them as
separate sequences in one row, as Llama 3 trains (Dubey et al. 2024, Sec. 3.4.1: "we use an
attention mask that prevents self-attention between different documents"):

- documents come from the input ids alone: an EOS input belongs to the document it ends,
  the token after it starts the next one (`find_documents`);
- attention: query i sees key j only when j <= i and both lie in the same document
  (`Documents.attention_mask`, a boolean (b, 1, s, s) mask for torch's SDPA on CPU;
  flex attention with a block mask on CUDA, which skips the blocks between documents);
- positions (RoPE angles, learned position rows) restart at 0 with each document;
- loss: the target after an EOS input is the next document's first token, which nothing
  in the EOS's own document predicts, so it is ignored (`mask_targets`, F.cross_entropy's
  ignore_index). The EOS itself stays a target: the model learns where documents end.

The loss is the mean over the global batch's unmasked targets, whatever the layout
(`loss_weights`): the layouts split a batch into microbatches and data-parallel shares
holding different counts of masked targets, so each share's mean is weighed by its count.

Every rank draws the whole global batch and holds its share's token ids, so every pipeline
stage finds the documents of a microbatch itself: the executor hands each stage the
microbatch's ids along with its activations. Under context parallelism a rank holds two
chunks of each row, and a document may start in another rank's chunk: the cp group
all-gathers its token ids (integers, s per row, once a forward; `split_documents`), each
rank finds the documents of the whole rows, keeps its own tokens' positions, and hands the
attention the whole rows' document ids (`Documents.cp_chunks`), from which each kernel block
builds its mask, skipping the blocks that share no document (`parallel/context/kernel.py`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from paraxis.dist.watchdog import WATCH
from paraxis.parallel.context.chunks import full_sequence, local_part
from paraxis.parallel.context.kernel import ChunkDocuments
from paraxis.spec.errors import ParaxisError

IGNORE_INDEX = -100  # F.cross_entropy's default ignore_index, as Hugging Face labels use


@dataclass(frozen=True)
class Documents:
    """The documents of a (batch, seq) window of token ids."""

    ids: torch.Tensor  # (batch, seq): each token's document, counted from 0 in its row
    positions: torch.Tensor  # (batch, seq): each token's position within its document
    # context parallelism: the whole rows' ids and which chunks share a document
    cp_chunks: ChunkDocuments | None = None

    @functools.cached_property
    def attention_mask(self) -> torch.Tensor:
        """(batch, 1, seq, seq) bool, True where query i may attend key j: j <= i, same
        document. Built once per forward and shared by every layer."""
        seq = self.ids.shape[-1]
        causal = torch.ones(seq, seq, dtype=torch.bool, device=self.ids.device).tril()
        same = self.ids.unsqueeze(-1) == self.ids.unsqueeze(-2)
        return (same & causal).unsqueeze(1)

    @property
    def mask_mod(self) -> Callable[..., torch.Tensor]:
        """`attention_mask` as flex attention's mask_mod(b, h, q, kv): may query q of row b
        attend key kv? (A plain function: flex tells mask_mod from score_mod by its
        argument count, which a bound method's self would throw off.)"""
        ids = self.ids

        def same_document(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor,
                          kv: torch.Tensor) -> torch.Tensor:
            return (kv <= q) & (ids[b, q] == ids[b, kv])

        return same_document

    @functools.cached_property
    def block_mask(self) -> object:
        """The mask as flex attention's BlockMask (CUDA): blocks of 128 x 128 scores that
        hold no allowed pair are skipped, not computed and masked."""
        from torch.nn.attention.flex_attention import (  # lazy: torch < 2.5 lacks it; CUDA only
            create_block_mask,
        )

        batch, seq = self.ids.shape
        # On CUDA compiled (torch's advice): uncompiled, it materialises the dense (b, 1, s, s)
        # mask by vmap. On CPU (tests of this path) plain: no compiler in the test process.
        build = _compiled(create_block_mask) if self.ids.is_cuda else create_block_mask
        return build(self.mask_mod, batch, None, seq, seq, device=self.ids.device)

    def ready(self) -> Documents:
        """Build the mask the kernel takes now, once per forward, before any block runs: not
        lazily inside a compiled (`--compile`) or recomputed block."""
        _ = self.block_mask if self.ids.device.type == "cuda" else self.attention_mask
        return self


@functools.cache
def _compiled(function: Callable) -> Callable:
    """`torch.compile(function)`, made once per process (each call would compile anew)."""
    return torch.compile(function)


def packed_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, documents: Documents,
                     enable_gqa: bool, scale: float | None = None) -> torch.Tensor:
    """Attention of (batch, heads, seq, head_dim) q, k, v within each document. CPU: torch's
    SDPA with the boolean mask (its flash kernel; `paraxis.spec.kernels`). CUDA: flex
    attention over the block mask (`flex_attention_within`)."""
    if q.device.type == "cuda":
        return flex_attention_within(q, k, v, documents, enable_gqa, scale=scale)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=documents.attention_mask,
                                          enable_gqa=enable_gqa, scale=scale)


def flex_attention_within(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          documents: Documents, enable_gqa: bool,
                          compiled: bool = True, scale: float | None = None) -> torch.Tensor:
    """The CUDA path: flex attention over the block mask, compiled (run eagerly it computes
    every score; the tests run it so on CPU against the SDPA path). On an H100 it equals
    SDPA with the boolean mask, forward and backward (tests/test_packing.py, run there)."""
    from torch.nn.attention.flex_attention import (  # lazy: torch < 2.5 lacks it; CUDA only
        flex_attention,
    )

    flex = _compiled_flex_attention() if compiled else flex_attention
    return flex(q, k, v, block_mask=documents.block_mask, enable_gqa=enable_gqa, scale=scale)


@functools.cache
def _compiled_flex_attention() -> Callable[..., torch.Tensor]:
    from torch.nn.attention.flex_attention import (  # lazy: torch < 2.5 lacks it; CUDA only
        flex_attention,
    )

    return torch.compile(flex_attention, dynamic=False)


def find_documents(tokens: torch.Tensor, end_of_document: int) -> Documents:
    """The documents of token ids `tokens` (batch, seq): a token's document is the number
    of EOS ids before it in its row; a document starts at the row's start or after an EOS."""
    ends = (tokens == end_of_document).long()
    ids = ends.cumsum(-1) - ends  # exclusive: an EOS belongs to the document it ends
    seq = tokens.shape[-1]
    index = torch.arange(seq, device=tokens.device).expand_as(tokens)
    starts = torch.zeros_like(ends, dtype=torch.bool)
    starts[..., 0] = True
    starts[..., 1:] = ends[..., :-1].bool()
    first = torch.where(starts, index, 0).cummax(-1).values  # where each token's doc starts
    return Documents(ids, index - first)


def split_documents(tokens: torch.Tensor, end_of_document: int,
                    group: dist.ProcessGroup | None, rank: int, cp: int) -> Documents:
    """The documents of this cp rank's local token ids `tokens` (batch, s/cp: its two chunks
    of each row, `context_parallel.chunks.local_part`): the group's ids gathered into whole
    rows, their documents found, this rank's tokens kept, the whole rows' ids for the
    attention (`cp_chunks`)."""
    parts = [torch.empty_like(tokens) for _ in range(cp)]
    with WATCH.waiting("all_gather", group, axis="cp"):
        dist.all_gather(parts, tokens.contiguous(), group=group)
    whole = find_documents(full_sequence(parts), end_of_document)
    return Documents(local_part(whole.ids, rank, cp), local_part(whole.positions, rank, cp),
                     ChunkDocuments.of(whole.ids, cp))


def mask_targets(tokens: torch.Tensor, targets: torch.Tensor,
                 end_of_document: int) -> torch.Tensor:
    """`targets` with IGNORE_INDEX where the input is an EOS (its target, the next
    document's first token, crosses a document end)."""
    return targets.masked_fill(tokens == end_of_document, IGNORE_INDEX)


def counted_targets(targets: list[torch.Tensor]) -> list[int]:
    """How many targets of each microbatch the loss counts (not IGNORE_INDEX), read from
    the device at once."""
    return torch.stack([(t != IGNORE_INDEX).sum() for t in targets]).tolist()


def loss_weights(counts: list[int], total: int, replicas: int) -> list[float]:
    """The factor by which each microbatch's mean loss is multiplied so that the engines'
    mean over the microbatches (`counts`: their unmasked targets) and over `replicas`
    data-parallel (x cp) shares is the mean over the `total` unmasked targets of the global
    batch: count * microbatches * replicas / total. 1.0 for every share of a batch without
    masked targets."""
    shares = len(counts) * replicas
    return [count * shares / max(total, 1) for count in counts]


def weigh(loss: torch.Tensor, weight: float) -> torch.Tensor:
    """`loss * weight`; a microbatch with no target counted (weight 0) has a NaN mean
    (0 / 0), which contributes 0 here, to the value and to every gradient."""
    return loss.nan_to_num(0.0) * 0.0 if weight == 0 else loss * weight


def packing_id(end_of_document: int | None, data_name: str) -> int:
    """The end-of-document id a packed run packs by; one line when the data has none known
    (checked by the launcher too, before any rank starts)."""
    if end_of_document is None:
        raise ParaxisError(f"--pack-documents needs documents ended by a known end-of-document "
                           f"id, and data {data_name} has none (a .bin, text or the embedded "
                           "corpus is one stream); give a .jsonl, Parquet, datasets or "
                           "prepared source, or drop --pack-documents")
    return end_of_document
