"""Context-parallel attention equals one device's causal attention, balanced and skipping
the masked blocks.

On 2 and 4 gloo ranks (one launch each), for the ring, the all-gather and the all-to-all
variant, with multi-head and grouped-query attention (for the all-to-all also fewer K/V
heads than ranks, whose heads it repeats): each rank's output and its q, k, v gradients equal
the matching positions of `F.scaled_dot_product_attention(..., is_causal=True,
enable_gqa=True)` on the whole sequence; every rank computes the same number of (query, key)
pairs and together exactly the causal triangle; a rank saves for backward only its own
tokens' tensors and sends the bytes `balance.sent_bytes_per_rank` predicts.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from paraxis.dist.testing import RankContext, run_on_ranks
from paraxis.parallel.context import kernel
from paraxis.parallel.context.attention import context_parallel_attention
from paraxis.parallel.context.chunks import by_rank, full_sequence, local_part, positions
from paraxis.parallel.context.hierarchical import CpLevels
from paraxis.parallel.context.kernel import check_qkv
from paraxis.spec.cp_balance import (
    VARIANTS,
    Block,
    PairCounter,
    check_heads,
    check_split,
    pairs_per_rank,
    rank_chunks,
    ring_blocks,
    saved_bytes_per_rank,
    sent_bytes_per_rank,
)
from paraxis.spec.errors import ParaxisError

# (variant, batch, heads, kv_heads, seq, head_dim)
CASES = [
    ("ring", 2, 4, 4, 64, 16),
    ("ring", 1, 4, 2, 256, 32),
    ("all_gather", 2, 4, 4, 64, 16),
    ("all_gather", 1, 4, 2, 256, 32),
    ("ring", 1, 6, 1, 128, 16),  # multi-query: one kv head
    ("all_to_all", 2, 4, 4, 64, 16),
    ("all_to_all", 1, 8, 2, 256, 32),  # at cp=4: 2 kv heads repeated to 4
    ("all_to_all", 1, 4, 1, 128, 16),  # multi-query: the one kv head goes to every rank
]
# Two-level cp on 4 ranks (all-to-all over 2, the variant across 2): K/V heads that divide
# by 2, and one K/V head repeated to both ranks of an all-to-all group.
TWO_LEVEL_CASES = [
    ("ring", 1, 4, 2, 128, 16),
    ("all_gather", 2, 4, 4, 64, 16),
    ("ring", 1, 4, 1, 128, 16),
]
ATOL = 4e-6  # fp32, O(1) values; the largest difference seen here was 1.4e-6 (seq 256, cp 4)


# ------------------------------------------------------------- the plan (no ranks needed)


@pytest.mark.parametrize("cp", [1, 2, 3, 4, 8])
def test_blocks_cover_the_causal_triangle_once(cp: int) -> None:
    """Expanding every block a rank computes gives exactly its queries' causal pairs, each
    once: nothing above the diagonal, nothing twice, nothing missing."""
    chunk_len = 2
    for rank in range(cp):
        mine = rank_chunks(rank, cp)
        local_pos = [c * chunk_len + i for c in mine for i in range(chunk_len)]
        wanted = sorted((q, k) for q in local_pos for k in range(q + 1))
        ring = []
        for step in range(cp):
            source = rank_chunks((rank - step) % cp, cp)
            key_pos = [c * chunk_len + i for c in source for i in range(chunk_len)]
            ring += _expand(ring_blocks(rank, step, cp), local_pos, key_pos, chunk_len)
        assert sorted(ring) == wanted  # the all-gather variant computes the same blocks


def _expand(blocks: list, query_pos: list[int], key_pos: list[int], chunk_len: int
            ) -> list[tuple[int, int]]:
    pairs = []
    for block in blocks:
        qs = query_pos[block.q_start * chunk_len:block.q_stop * chunk_len]
        ks = key_pos[block.k_start * chunk_len:block.k_stop * chunk_len]
        pairs += [(q, k) for i, q in enumerate(qs) for j, k in enumerate(ks)
                  if not block.causal or j <= i]
    return pairs


@pytest.mark.parametrize(("seq", "cp"), [(64, 2), (512, 4), (4096, 16), (131072, 32)])
def test_pairs_balanced_and_sum_to_the_triangle(seq: int, cp: int) -> None:
    counts = pairs_per_rank(seq, cp)
    assert len(set(counts)) == 1  # the zig-zag split balances exactly
    assert sum(counts) == seq * (seq + 1) // 2


def test_split_and_positions() -> None:
    seq, cp = 24, 3
    x = torch.arange(2 * seq).view(2, seq)
    parts = [local_part(x, rank, cp) for rank in range(cp)]
    assert torch.equal(full_sequence(parts), x)
    assert torch.equal(parts[0][0], torch.tensor([0, 1, 2, 3, 20, 21, 22, 23]))
    for rank in range(cp):
        assert torch.equal(positions(seq, rank, cp), local_part(torch.arange(seq)[None], rank,
                                                               cp)[0])
    stacked = by_rank(x.view(2, seq, 1), cp)
    assert stacked.shape == (cp, 2, seq // cp, 1)
    assert torch.equal(stacked[1, :, :, 0], parts[1])


def test_bad_input() -> None:
    with pytest.raises(ParaxisError, match="divisible by 8"):
        check_split(100, 4)
    with pytest.raises(ParaxisError, match="at least 1"):
        check_split(64, 0)
    q, kv = torch.zeros(1, 4, 8, 16), torch.zeros(1, 3, 8, 16)
    with pytest.raises(ParaxisError, match="divisible by kv_heads"):
        check_qkv(q, kv, kv)
    with pytest.raises(ParaxisError, match="must be even"):
        check_qkv(torch.zeros(1, 4, 7, 16), torch.zeros(1, 2, 7, 16), torch.zeros(1, 2, 7, 16))
    with pytest.raises(ParaxisError, match="match q's batch"):
        check_qkv(q, torch.zeros(1, 2, 6, 16), torch.zeros(1, 2, 6, 16))
    with pytest.raises(ParaxisError, match="unknown context-parallel attention"):
        context_parallel_attention(q, kv, kv, None, variant="ulysses")
    with pytest.raises(ParaxisError, match="do not divide by cp=3"):
        check_heads("all_to_all", 4, 2, 3)
    with pytest.raises(ParaxisError, match="divide by cp or divide it"):
        check_heads("all_to_all", 12, 4, 6)
    check_heads("ring", 4, 2, 3)  # the blockwise variants split no heads


# ------------------------------------------------------------------- on ranks, vs one device


def _check_case(case: tuple, group: dist.ProcessGroup | None, seed: int,
                levels: CpLevels | None = None) -> int:
    """Run one case on this rank of `group` (two-level cp: its `levels`), compare with one
    device; return its pairs."""
    variant, batch, heads, kv_heads, seq, head_dim = case
    cp, rank = dist.get_world_size(group), dist.get_rank(group)
    a2a = 1 if levels is None else dist.get_world_size(levels.a2a)
    generator = torch.Generator().manual_seed(seed)
    q, dout = (torch.randn(batch, heads, seq, head_dim, generator=generator) for _ in "qo")
    k, v = (torch.randn(batch, kv_heads, seq, head_dim, generator=generator) for _ in "kv")
    whole = [t.clone().requires_grad_() for t in (q, k, v)]
    reference = F.scaled_dot_product_attention(*whole, is_causal=True, enable_gqa=True)
    reference.backward(dout)

    def mine(t: torch.Tensor) -> torch.Tensor:
        return local_part(t.detach(), rank, cp, dim=2)

    local = [mine(t).requires_grad_() for t in (q, k, v)]
    saved: list[int] = []

    def keep(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.numel() * t.element_size())
        return t

    with PairCounter() as counter, torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        out = context_parallel_attention(*local, group if levels is None else levels,
                                         variant=variant)
    with PairCounter() as backward_counter:
        out.backward(mine(dout))

    where = f"{case} cp={cp} a2a={a2a} rank={rank}"
    torch.testing.assert_close(out, mine(reference), atol=ATOL, rtol=0, msg=where)
    # laid out token by token, as a flash kernel's: the output projection reads it as rows
    # without a copy (plan/activations.py counts none)
    assert out.transpose(1, 2).is_contiguous(), where
    for name, got, want in zip("qkv", local, whole, strict=True):
        torch.testing.assert_close(got.grad, mine(want.grad), atol=ATOL, rtol=0,
                                   msg=f"d{name} {where}")
    # Counted pairs: the plan's, the same forward and backward.
    assert counter.pairs("forward") == pairs_per_rank(seq, cp)[rank], where
    assert backward_counter.pairs("backward") == counter.pairs("forward"), where
    # Saved for backward: this rank's q, k, v, output and log-sum-exp, nothing more.
    assert sum(saved) == saved_bytes_per_rank(batch, heads, kv_heads, seq, head_dim, cp, 4,
                                              variant, a2a), where
    # Sent bytes: what the planner's formula says.
    forward, backward = sent_bytes_per_rank(variant, batch, heads, kv_heads, seq, head_dim,
                                            cp, 4, a2a)
    assert counter.sent_bytes("forward") == forward, where
    assert backward_counter.sent_bytes("backward") == backward, where
    return counter.pairs("forward")


def _check_bf16(variant: str, seed: int) -> None:
    """In bf16, the split attention is as close to the fp32 result as one device's bf16
    attention is (its error is the inputs' rounding, not the blockwise merge)."""
    cp, rank = dist.get_world_size(), dist.get_rank()
    generator = torch.Generator().manual_seed(seed)
    q, dout = (torch.randn(1, 4, 128, 32, generator=generator) for _ in "qo")
    k, v = (torch.randn(1, 2, 128, 32, generator=generator) for _ in "kv")
    results = []
    for dtype in (torch.float32, torch.bfloat16):
        whole = [t.to(dtype).requires_grad_() for t in (q.clone(), k.clone(), v.clone())]
        out = F.scaled_dot_product_attention(*whole, is_causal=True, enable_gqa=True)
        out.backward(dout.to(dtype))
        results.append([out, *(t.grad for t in whole)])
    local = [local_part(t, rank, cp, dim=2).bfloat16().requires_grad_() for t in (q, k, v)]
    out = context_parallel_attention(*local, None, variant=variant)
    out.backward(local_part(dout, rank, cp, dim=2).bfloat16())
    for got, exact, one_device in zip([out, *(t.grad for t in local)], *results, strict=True):
        exact, one_device = (local_part(t.float(), rank, cp, dim=2) for t in (exact, one_device))
        error = (got.float() - exact).abs().max()
        assert error <= 2 * (one_device - exact).abs().max(), f"{variant} bf16 cp={cp}"


def document_ids(batch: int, seq: int, generator: torch.Generator) -> torch.Tensor:
    """(batch, seq) document ids of rows cut into random documents: row 0 many short ones
    (some a single token, some crossing chunk and rank boundaries), the others fewer."""
    rows = []
    for row in range(batch):
        ends = torch.rand(seq, generator=generator) < (0.2 if row == 0 else 0.03)
        rows.append(ends.long().cumsum(0) - ends.long())  # an end belongs to its document
    return torch.stack(rows)


def _check_documents(variant: str, group: dist.ProcessGroup | None, seed: int,
                     levels: CpLevels | None = None) -> None:
    """Packed documents: the split attention with every rank's document ids equals one
    device's SDPA under the document mask (same document and causal), output and grads."""
    cp, rank = dist.get_world_size(group), dist.get_rank(group)
    generator = torch.Generator().manual_seed(seed)
    batch, heads, kv_heads, seq, head_dim = 2, 4, 2, 32 * cp, 16
    q, dout = (torch.randn(batch, heads, seq, head_dim, generator=generator) for _ in "qo")
    k, v = (torch.randn(batch, kv_heads, seq, head_dim, generator=generator) for _ in "kv")
    ids = document_ids(batch, seq, generator)
    mask = (ids.unsqueeze(-1) == ids.unsqueeze(-2)) & torch.ones(seq, seq).tril().bool()
    whole = [t.clone().requires_grad_() for t in (q, k, v)]
    reference = F.scaled_dot_product_attention(*whole, attn_mask=mask.unsqueeze(1),
                                               enable_gqa=True)
    reference.backward(dout)

    def mine(t: torch.Tensor) -> torch.Tensor:
        return local_part(t.detach(), rank, cp, dim=2)

    local = [mine(t).requires_grad_() for t in (q, k, v)]
    with PairCounter() as counter:
        out = context_parallel_attention(*local, group if levels is None else levels,
                                         variant=variant,
                                         documents=kernel.ChunkDocuments.of(ids, cp))
    with PairCounter() as backward_counter:
        out.backward(mine(dout))
    where = f"documents {variant} cp={cp} rank={rank} two-level={levels is not None}"
    # the blockwise variants compute exactly the blocks where some query and key share a
    # document (read off the dense mask here), forward and backward
    if variant != "all_to_all" and levels is None:
        needed = 0
        for step in range(cp):
            for block in ring_blocks(rank, step, cp):
                rows_ = positions(seq, rank, cp)[block.q_start * seq // (2 * cp):
                                                 block.q_stop * seq // (2 * cp)]
                cols_ = positions(seq, (rank - step) % cp, cp)[
                    block.k_start * seq // (2 * cp):block.k_stop * seq // (2 * cp)]
                if mask[:, rows_][:, :, cols_].any():
                    needed += block.pairs(seq // (2 * cp))
        assert counter.pairs("forward") == needed, where
        assert backward_counter.pairs("backward") == needed, where
    torch.testing.assert_close(out, mine(reference), atol=ATOL, rtol=0, msg=where)
    for name, got, want in zip("qkv", local, whole, strict=True):
        torch.testing.assert_close(got.grad, mine(want.grad), atol=ATOL, rtol=0,
                                   msg=f"d{name} {where}")


def _all_cases(ctx: RankContext, subgroups: int) -> list[list[int]]:
    """Every case over the whole world, then over `subgroups` disjoint rings at once."""
    pairs = [[_check_case(case, None, seed)] for seed, case in enumerate(CASES)]
    for seed, variant in enumerate(VARIANTS):
        _check_bf16(variant, 50 + seed)
        _check_documents(variant, None, 70 + seed)
    size = ctx.world_size // subgroups
    groups = [dist.new_group(list(range(g * size, (g + 1) * size))) for g in range(subgroups)]
    group = groups[ctx.rank // size]
    for seed, variant in enumerate(VARIANTS):
        _check_case((variant, 1, 4, 2, 32 * size, 16), group, 100 + seed)
    if ctx.world_size == 4:  # two levels: all-to-all inside {0, 1} and {2, 3}, across them
        a2a_groups = [dist.new_group(ranks) for ranks in ([0, 1], [2, 3])]
        across_groups = [dist.new_group(ranks) for ranks in ([0, 2], [1, 3])]
        levels = CpLevels(a2a_groups[ctx.rank // 2], across_groups[ctx.rank % 2])
        for seed, case in enumerate(TWO_LEVEL_CASES):
            pairs.append([_check_case(case, None, 200 + seed, levels)])
        for seed, variant in enumerate(("ring", "all_gather")):
            _check_documents(variant, None, 300 + seed, levels)
    return pairs


@pytest.mark.parametrize(("world", "subgroups"), [(2, 2), (4, 2)])
def test_matches_one_device(world: int, subgroups: int) -> None:
    """Subgroups of 1 rank at world 2 check cp=1; two rings of 2 at world 4 check that
    peers are found by their rank in the cp group, not in the world."""
    by_rank_pairs = run_on_ranks(world, _all_cases, subgroups)
    cases = CASES + (TWO_LEVEL_CASES if world == 4 else [])
    assert len(by_rank_pairs[0]) == len(cases)
    for index, (_, _, _, _, seq, _) in enumerate(cases):
        counts = [rank_pairs[index][0] for rank_pairs in by_rank_pairs]
        assert max(counts) <= 1.1 * min(counts)
        assert sum(counts) == seq * (seq + 1) // 2


def test_cases_cover_both_variants_and_gqa() -> None:
    """The case list itself: every variant, with MHA and with grouped queries."""
    kinds = {(case[0], case[2] == case[3]) for case in CASES}
    assert kinds == set(itertools.product(VARIANTS, (True, False)))


def test_the_masked_block_kernel_equals_the_cpu_op() -> None:
    """The CUDA path of a block with a document mask (`kernel.masked_forward`/`_backward`,
    plain tensor ops), run here on CPU against the CPU flash op with the same mask: output,
    log-sum-exp (-inf for a row without keys, where the op says 0) and the backward from a
    given output and log-sum-exp, with grouped queries and tiles of rows."""
    generator = torch.Generator().manual_seed(3)
    batch, heads, kv_heads, chunk, head_dim = 2, 4, 2, 24, 8
    q, dout = (torch.randn(batch, heads, 2 * chunk, head_dim, generator=generator)
               for _ in "qo")
    k, v = (torch.randn(batch, kv_heads, 2 * chunk, head_dim, generator=generator)
            for _ in "kv")
    queries, keys = (document_ids(batch, 2 * chunk, generator) for _ in "qk")
    everything = tuple((True,) * 2 for _ in range(2))
    ids = kernel.BlockIds(queries, keys, (0, 1), (0, 1), everything)
    old_tile, kernel.ROW_TILE = kernel.ROW_TILE, 16  # several tiles, the last one partial
    try:
        for block in (Block(0, 2, 0, 2, causal=True), Block(1, 2, 0, 2, causal=False),
                      Block(0, 2, 1, 2, causal=False)):
            bias, empty = kernel.block_mask(ids, block, chunk, q.dtype)
            parts = (kernel.rows(q, block, chunk), kernel.cols(k, block, chunk),
                     kernel.cols(v, block, chunk))
            want_out, want_lse = kernel.block_forward(q, k, v, block, chunk, 0.3, ids)
            out, lse = kernel.masked_forward(*parts, bias, 0.3)
            torch.testing.assert_close(out, want_out, atol=1e-6, rtol=0)
            torch.testing.assert_close(lse, want_lse, atol=1e-6, rtol=0)
            assert torch.isneginf(lse).any() == empty.any()
            # backward from a merged result whose every row is finite, as the variants give it
            full_lse = lse.where(torch.isfinite(lse), torch.zeros_like(lse))
            want = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default(
                kernel.rows(dout, block, chunk), *parts, out, full_lse, 0.0, False,
                attn_mask=bias, scale=0.3)
            got = kernel.masked_backward(kernel.rows(dout, block, chunk), *parts, out,
                                         full_lse, bias, 0.3)
            for name, a, b in zip(("dq", "dk", "dv"), got, want, strict=True):
                torch.testing.assert_close(a, b, atol=1e-5, rtol=0, msg=f"{name} {block}")
            # inside the model's bf16 autocast the kernel still computes in fp32: the same
            with torch.autocast("cpu", dtype=torch.bfloat16):
                assert all(torch.equal(a, b) for a, b in zip(
                    kernel.masked_forward(*parts, bias, 0.3), (out, lse), strict=True))
                assert all(torch.equal(a, b) for a, b in zip(kernel.masked_backward(
                    kernel.rows(dout, block, chunk), *parts, out, full_lse, bias, 0.3), got,
                    strict=True))
    finally:
        kernel.ROW_TILE = old_tile


def test_chunks_that_share_a_document_are_found_and_the_others_skipped() -> None:
    """`ChunkDocuments.of`: chunk pairs sharing a document, as a brute force over the ids
    finds them; with documents shorter than a chunk, blocks between distant chunks are
    skipped (`BlockIds.needed`), those between neighbours are not."""
    cp, chunk = 4, 16
    ids = document_ids(3, 2 * cp * chunk, torch.Generator().manual_seed(5))
    ids[1:] = document_ids(2, 2 * cp * chunk, torch.Generator().manual_seed(6))[:1]
    documents = kernel.ChunkDocuments.of(ids, cp)
    pieces = ids.unflatten(1, (2 * cp, chunk))
    for a, b in itertools.product(range(2 * cp), repeat=2):
        brute = any(set(pieces[row, a].tolist()) & set(pieces[row, b].tolist())
                    for row in range(3))
        assert documents.shared[a][b] == brute, (a, b)
    short = kernel.ChunkDocuments.of(torch.arange(2 * cp * chunk)[None] // 5, cp)
    assert not short.at(0, 3, cp).needed(Block(0, 2, 0, 2, causal=False))  # chunks 7 vs 3, 4
    assert short.at(3, 3, cp).needed(Block(0, 2, 0, 2, causal=True))  # its own: always
