"""One block of attention on the flash kernel, and the merge of partial results.

Both context-parallel variants cut a rank's attention into blocks (`balance.Block`: some of
its query chunks against some key chunks) and run each on the flash kernel, which returns
the block's output and its log-sum-exp per query row (FlashAttention, Dao et al. 2022):
`lse = log sum_j exp(q.k_j * scale)` over the block's keys. Two blocks that share query rows
merge exactly, in any order (Milakov & Gimelshein 2018, online softmax; Liu et al. 2023,
Ring Attention, Sec. 3):

    lse = logaddexp(lse_a, lse_b)
    out = out_a * exp(lse_a - lse) + out_b * exp(lse_b - lse)

(both weights are at most 1: no overflow, whatever the scores). The backward of a block is
exact when it is given the merged output and log-sum-exp instead of its own: the kernel's
backward rebuilds the block's probabilities as exp(q.k * scale - lse), which with the merged
lse are the true softmax probabilities of the whole row restricted to the block, and its
dS term uses rowsum(dout * out), which must be the whole row's output. So the backward needs
no recomputation of the forward and no per-block state: only q, k, v, out and lse.

K and V stay at their kv-head width: the kernels take grouped-query attention natively (a
query head h reads kv head h // (heads / kv_heads), as `enable_gqa=True` in torch's SDPA)
and return dK, dV at kv-head width, summed over each group.

Packed documents (`paraxis.parallel.context.packing`) add a mask: query i sees key j only inside its
own document. Each block then gets an additive mask (0 or -inf, `block_mask`) built from the
document ids of its query rows and of its key columns (`ChunkDocuments`: every cp rank's ids, so a
rank knows whose keys it holds); a block whose queries and keys share no document is skipped
(`BlockIds.needed`), which with short documents is most of them. A document mask can also leave a
row of a computed block with no key (a query whose document starts after the block's keys); such a
row contributes nothing, which the merge needs as log-sum-exp -inf, not the 0 that torch's CPU op
returns for it (`block_forward` sets it). On CUDA, FlashAttention-2's ops take no mask: a masked
block runs `masked_forward` and `masked_backward`, the same contract in plain tensor ops (fp32
scores, a tile of `ROW_TILE` query rows at a time), exact but slower than a fused kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from paraxis.parallel.context.chunks import local_part
from paraxis.spec.cp_balance import Block, rank_chunks, record
from paraxis.spec.errors import ParaxisError


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> int:
    """Check a rank's local (batch, heads, seq, head_dim) q and (batch, kv_heads, seq,
    head_dim) k, v; return the chunk length (half the local sequence)."""
    if q.dim() != 4 or k.shape != v.shape or k.dim() != 4:
        raise ParaxisError(f"context-parallel attention takes q (batch, heads, seq, head_dim) "
                           f"and k, v of one shape (batch, kv_heads, seq, head_dim); got q "
                           f"{tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    batch, heads, seq, head_dim = q.shape
    if (k.shape[0], k.shape[2], k.shape[3]) != (batch, seq, head_dim):
        raise ParaxisError(f"k and v must match q's batch, local sequence and head_dim: q "
                           f"{tuple(q.shape)}, k {tuple(k.shape)}")
    if heads % k.shape[1]:
        raise ParaxisError(f"grouped-query attention needs heads ({heads}) divisible by "
                           f"kv_heads ({k.shape[1]}); change n_heads or n_kv_heads")
    if seq % 2:
        raise ParaxisError(f"a context-parallel rank holds two equal chunks of the sequence: "
                           f"its local length {seq} must be even (seq_len divisible by 2*cp)")
    if q.device.type == "cuda" and q.dtype not in (torch.float16, torch.bfloat16):
        raise ParaxisError(f"context-parallel attention on GPU runs FlashAttention, which "
                           f"takes fp16 or bf16, not {q.dtype}; train with --precision bf16")
    return seq // 2


def rows(x: torch.Tensor, block: Block, chunk_len: int) -> torch.Tensor:
    """The block's query rows of a (batch, heads, seq, ...) or (batch, heads, seq) tensor."""
    return x[:, :, block.q_start * chunk_len:block.q_stop * chunk_len]


def cols(x: torch.Tensor, block: Block, chunk_len: int) -> torch.Tensor:
    """The block's key columns of a (batch, kv_heads, seq, head_dim) tensor."""
    return x[:, :, block.k_start * chunk_len:block.k_stop * chunk_len]


@dataclass(frozen=True)
class ChunkDocuments:
    """Packed documents as the blocks need them (`packing.split_documents` builds it once a
    forward): the whole rows' document ids, and which chunks share a document."""

    ids: torch.Tensor  # (batch, s), in sequence order; rank r's are local_part(ids, r, cp)
    # shared[a][b]: some row has a document in both global chunk a and chunk b (ids rise
    # along a row, so for b < a: chunk b's last id is chunk a's first); host data
    shared: tuple[tuple[bool, ...], ...]

    @classmethod
    def of(cls, ids: torch.Tensor, cp: int) -> ChunkDocuments:
        """From the whole rows' ids (batch, s); one read to the host."""
        chunks = ids.unflatten(-1, (2 * cp, -1))
        first, last = chunks[..., 0], chunks[..., -1]  # (batch, 2cp)
        shared = (first.unsqueeze(-1) <= last.unsqueeze(-2)) & (
            last.unsqueeze(-1) >= first.unsqueeze(-2))  # [a][b]: their id ranges overlap
        return cls(ids, tuple(map(tuple, shared.any(0).tolist())))

    def coarser(self, parts: int) -> ChunkDocuments:
        """The same documents seen by ranks that each hold `parts` ranks' chunks (two-level
        cp, `hierarchical.py`): chunk A of the 2*cp/parts coarse ones is fine chunks
        A*parts .. (A+1)*parts-1; two coarse chunks share a document if any of theirs do."""
        n = len(self.shared) // parts
        return ChunkDocuments(self.ids, tuple(
            tuple(any(self.shared[a][b] for a in range(i * parts, (i + 1) * parts)
                      for b in range(j * parts, (j + 1) * parts)) for j in range(n))
            for i in range(n)))

    def at(self, rank: int, source: int, cp: int) -> BlockIds:
        """What rank `rank`'s blocks against the K/V of rank `source` need."""
        return BlockIds(local_part(self.ids, rank, cp), local_part(self.ids, source, cp),
                        rank_chunks(rank, cp), rank_chunks(source, cp), self.shared)


@dataclass(frozen=True)
class BlockIds:
    """The document ids of a rank's queries and of the K/V at hand, (batch, 2L) each, with
    the global chunk of each local slot (`balance.rank_chunks`)."""

    queries: torch.Tensor
    keys: torch.Tensor
    query_chunks: tuple[int, int]
    key_chunks: tuple[int, int]
    shared: tuple[tuple[bool, ...], ...]

    def needed(self, block: Block) -> bool:
        """Does any query of the block share a document with any of its keys? A block that
        does not is skipped, forward and backward (flex attention skips such tiles too)."""
        return any(self.shared[a][b]
                   for a in self.query_chunks[block.q_start:block.q_stop]
                   for b in self.key_chunks[block.k_start:block.k_stop] if b <= a)


def block_mask(ids: BlockIds, block: Block, chunk_len: int, dtype: torch.dtype
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """The block's additive (batch, 1, rows, cols) document mask (0 where query and key share
    a document, and for the causal diagonal block key <= query; -inf elsewhere), and its
    rows that see no key at all, (batch, 1, rows)."""
    q_ids = ids.queries[:, block.q_start * chunk_len:block.q_stop * chunk_len]
    k_ids = ids.keys[:, block.k_start * chunk_len:block.k_stop * chunk_len]
    allowed = (q_ids.unsqueeze(-1) == k_ids.unsqueeze(-2)).unsqueeze(1)
    if block.causal:  # a square: the rank's own chunks, in sequence order
        allowed = allowed & torch.ones(allowed.shape[-2:], dtype=torch.bool,
                                       device=allowed.device).tril()
    bias = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return bias.masked_fill_(~allowed, float("-inf")), ~allowed.any(-1)


def block_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block: Block,
                  chunk_len: int, scale: float, ids: BlockIds | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """The block's (output, log-sum-exp): `q` the local queries, `k`, `v` the K/V at hand;
    `ids`: the document ids of both (packing; None: causal only)."""
    record("forward", pairs=block.pairs(chunk_len))
    qb, kb, vb = rows(q, block, chunk_len), cols(k, block, chunk_len), cols(v, block, chunk_len)
    if ids is None:
        if q.device.type == "cuda":
            return _cuda_forward(qb, kb, vb, block.causal, scale)
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(
            qb, kb, vb, 0.0, block.causal, scale=scale)
    bias, empty = block_mask(ids, block, chunk_len, q.dtype)
    if q.device.type == "cuda":
        return masked_forward(qb, kb, vb, bias, scale)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default(
        qb, kb, vb, 0.0, False, attn_mask=bias, scale=scale)
    return out, lse.masked_fill(empty, float("-inf"))  # the op says 0 for a row without keys


def block_backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   out: torch.Tensor, lse: torch.Tensor, block: Block, chunk_len: int,
                   scale: float, ids: BlockIds | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The block's (dq for its rows, dk and dv for its columns), from the merged `out` and
    `lse` of the whole local sequence (always finite: a query sees at least itself)."""
    record("backward", pairs=block.pairs(chunk_len))
    dout, qb, ob = (rows(t, block, chunk_len) for t in (grad_out, q, out))
    lseb = rows(lse, block, chunk_len).contiguous()
    kb, vb = cols(k, block, chunk_len), cols(v, block, chunk_len)
    if ids is None:
        if q.device.type == "cuda":
            return _cuda_backward(dout, qb, kb, vb, ob, lseb, block.causal, scale)
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default(
            dout, qb, kb, vb, ob, lseb, 0.0, block.causal, scale=scale)
    bias, _ = block_mask(ids, block, chunk_len, q.dtype)
    if q.device.type == "cuda":
        return masked_backward(dout, qb, kb, vb, ob, lseb, bias, scale)
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default(
        dout, qb, kb, vb, ob, lseb, 0.0, False, attn_mask=bias, scale=scale)


def merge(out: torch.Tensor, lse: torch.Tensor, block: Block, chunk_len: int,
          block_out: torch.Tensor, block_lse: torch.Tensor) -> None:
    """Fold a block's result into the running fp32 (out, lse) of the local sequence, in
    place. Rows no block has touched yet hold out 0 and lse -inf: the first block's result
    lands exactly (weights 0 and exp(0) = 1). A row still without keys after the block
    (both -inf, packing) keeps out 0 and lse -inf."""
    out_rows, lse_rows = rows(out, block, chunk_len), rows(lse, block, chunk_len)
    merged = torch.logaddexp(lse_rows, block_lse)
    seen = torch.isfinite(merged)
    weight_old = torch.where(seen, torch.exp(lse_rows - merged), 0.0)
    weight_new = torch.where(seen, torch.exp(block_lse - merged), 0.0)
    out_rows.mul_(weight_old.unsqueeze(-1))
    out_rows.add_(block_out * weight_new.unsqueeze(-1))
    lse_rows.copy_(merged)


def forward_blocks(q: torch.Tensor, kv: torch.Tensor, blocks: list[Block], chunk_len: int,
                   scale: float, out: torch.Tensor, lse: torch.Tensor,
                   ids: BlockIds | None = None) -> None:
    """Attend this rank's queries to the K/V blocks `blocks` of `kv` (K and V stacked), merging
    each partial result into (out, lse): the loop both variants run."""
    for block in blocks:
        if ids is not None and not ids.needed(block):
            continue
        block_out, block_lse = block_forward(q, kv[0], kv[1], block, chunk_len, scale, ids)
        merge(out, lse, block, chunk_len, block_out, block_lse)


def backward_blocks(grad_out: torch.Tensor, q: torch.Tensor, kv: torch.Tensor,
                    out: torch.Tensor, lse: torch.Tensor, blocks: list[Block], chunk_len: int,
                    scale: float, dq: torch.Tensor, grad_kv: torch.Tensor,
                    ids: BlockIds | None = None) -> None:
    """Add the gradients of `blocks` (from the merged out and lse) into dq and grad_kv (dK and
    dV stacked, laid out like kv)."""
    for block in blocks:
        if ids is not None and not ids.needed(block):
            continue
        dq_block, dk_block, dv_block = block_backward(
            grad_out, q, kv[0], kv[1], out, lse, block, chunk_len, scale, ids)
        rows(dq, block, chunk_len).add_(dq_block)
        cols(grad_kv[0], block, chunk_len).add_(dk_block)
        cols(grad_kv[1], block, chunk_len).add_(dv_block)


def empty_result(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The running (out, lse) before any block: fp32, out 0 and lse -inf for every row. `out`
    is (batch, heads, seq, head_dim) laid out token by token, as flash kernels lay out
    theirs: the model's output projection then reads it as rows without a copy."""
    batch, heads, seq, dim = q.shape
    out = torch.zeros(batch, seq, heads, dim, dtype=torch.float32,
                      device=q.device).transpose(1, 2)
    lse = torch.full(q.shape[:3], float("-inf"), dtype=torch.float32, device=q.device)
    return out, lse


# ------------------------------------------------------------------------ CUDA
# The same contract on torch's FlashAttention-2 ops (fp16/bf16). Not run by this repository's
# tests (no GPU in CI). Every causal block is square (a diagonal chunk against itself), so
# FlashAttention-2's bottom-right alignment of the causal mask for rectangular blocks, which
# differs from the CPU kernel's top-left, never comes into play.


def _cuda_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                  scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    out, lse, *_ = torch.ops.aten._scaled_dot_product_flash_attention.default(
        q, k, v, 0.0, causal, False, scale=scale)
    return out, lse


def _cuda_backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   out: torch.Tensor, lse: torch.Tensor, causal: bool, scale: float
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # Dense batches: no cumulative sequence lengths (None: the op's varlen path is off).
    # No dropout: the philox seed and offset are never read, any int64 scalars do.
    unused_rng = torch.empty((), dtype=torch.int64)
    return torch.ops.aten._scaled_dot_product_flash_attention_backward.default(
        grad_out, q, k, v, out, lse, None, None, q.shape[2], k.shape[2], 0.0, causal,
        unused_rng, unused_rng, scale=scale)


# ------------------------------------------------------------------ masked blocks, any device
# A block with a document mask on CUDA (FlashAttention-2's ops take no mask): the kernel's
# contract in plain tensor ops, fp32, ROW_TILE query rows at a time so that the scores held
# at once stay (batch, heads, ROW_TILE, cols). tests/test_cp_attention.py checks both
# functions against the CPU op on CPU.
ROW_TILE = 512


def _grouped(q: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """(batch, heads, rows, d) -> (batch, kv_heads, heads/kv_heads, rows, d): query head h
    under kv head h // group, as enable_gqa reads them."""
    return q.unflatten(1, (kv_heads, -1))


def _scores(qt: torch.Tensor, k: torch.Tensor, bias: torch.Tensor, scale: float
            ) -> torch.Tensor:
    """q.k * scale + bias for a tile of grouped queries (fp32), (batch, kv_heads, group,
    rows, cols)."""
    scores = (qt.float() @ k.float().unsqueeze(2).transpose(-1, -2)) * scale
    return scores + bias.float().unsqueeze(2)


def masked_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor,
                   scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(output in q's dtype, fp32 log-sum-exp; -inf for a row without keys) of q against
    k, v under the additive `bias` (batch, 1, rows, cols). Its scores are fp32 under
    autocast too (the block's forward runs inside the model's): the backward recomputes
    them in fp32 against this log-sum-exp."""
    with torch.autocast(q.device.type, enabled=False):
        return _masked_forward(q, k, v, bias, scale)


def _masked_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor,
                    scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    kv_heads, rows_ = k.shape[1], q.shape[2]
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    grouped_out, grouped_lse = _grouped(out, kv_heads), lse.unflatten(1, (kv_heads, -1))
    for start in range(0, rows_, ROW_TILE):
        tile = slice(start, start + ROW_TILE)
        scores = _scores(_grouped(q[:, :, tile], kv_heads), k, bias[:, :, tile], scale)
        tile_lse = torch.logsumexp(scores, dim=-1)
        probs = torch.exp(scores - tile_lse.unsqueeze(-1)).nan_to_num(0.0)  # keyless: 0
        grouped_out[:, :, :, tile] = (probs @ v.float().unsqueeze(2)).to(q.dtype)
        grouped_lse[:, :, :, tile] = tile_lse
    return out, lse


def masked_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    out: torch.Tensor, lse: torch.Tensor, bias: torch.Tensor, scale: float
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of the masked block from the merged `out` and `lse` (FlashAttention's
    backward: P = exp(S - lse), dV = P^T dO, dS = P (dO V^T - rowsum(dO o O)), dQ = dS K s,
    dK = dS^T Q s), dK and dV summed over each kv head's query heads; fp32 under autocast
    too, as the forward."""
    with torch.autocast(q.device.type, enabled=False):
        return _masked_backward(dout, q, k, v, out, lse, bias, scale)


def _masked_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     out: torch.Tensor, lse: torch.Tensor, bias: torch.Tensor, scale: float
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    kv_heads = k.shape[1]
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.zeros(k.shape, dtype=torch.float32, device=q.device)
    dv = torch.zeros(v.shape, dtype=torch.float32, device=q.device)
    grouped_dq = _grouped(dq, kv_heads)
    kf, vf = k.float().unsqueeze(2), v.float().unsqueeze(2)
    for start in range(0, q.shape[2], ROW_TILE):
        tile = slice(start, start + ROW_TILE)
        qt, dot, ot = (_grouped(t[:, :, tile], kv_heads).float() for t in (q, dout, out))
        tile_lse = lse[:, :, tile].unflatten(1, (kv_heads, -1)).unsqueeze(-1)
        probs = torch.exp(_scores(qt, k, bias[:, :, tile], scale) - tile_lse)
        dv += (probs.transpose(-1, -2) @ dot).sum(2)
        delta = (dot * ot).sum(-1, keepdim=True)
        dscores = probs * (dot @ vf.transpose(-1, -2) - delta)
        grouped_dq[:, :, :, tile] = (dscores @ kf * scale).to(q.dtype)
        dk += (dscores.transpose(-1, -2) @ qt * scale).sum(2)
    return dq, dk.to(k.dtype), dv.to(v.dtype)
