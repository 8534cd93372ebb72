"""Which chunks a context-parallel rank holds, which attention blocks it computes, how many
(query, key) pairs that is. Plain Python, no torch: the planner prices it as freely as the
runtime runs it.

Causal attention over a split sequence is lopsided: with the sequence cut into cp contiguous
pieces, the rank holding the last piece attends to every key before it and the first rank to
almost none, so the last rank's s^2/cp work sets the step time against an average of
s^2/(2 cp). The zig-zag split (Megatron-LM's context parallelism; Llama 3, Dubey et al. 2024,
Sec. 3.3.2; PyTorch's `_context_parallel` load balancer) cuts the sequence into 2*cp chunks
and gives rank i chunks i and 2*cp-1-i, an early chunk with little work paired with a late one
with much: every rank then computes exactly 2*cp*L^2 + L pairs for chunks of length L, and
their sum is s(s+1)/2, the causal triangle and nothing more (`pairs_per_rank`).

A block is one call of the flash kernel: some of this rank's query chunks against some key
chunks, either `causal` (a square on the diagonal, masked inside) or full (entirely below the
diagonal). Blocks entirely above the diagonal are never computed.

    PairCounter: with PairCounter() as counter: ...attention...; counter.pairs("forward")
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import TracebackType

from paraxis.spec.errors import ParaxisError

# How K/V reach the queries (`attention.context_parallel_attention`).
VARIANTS = ("ring", "all_gather", "all_to_all")


def check_split(seq_len: int, cp: int) -> int:
    """The chunk length of the balanced split of `seq_len` tokens over `cp` ranks."""
    if cp < 1:
        raise ParaxisError(f"the context-parallel degree must be at least 1, got cp={cp}")
    if seq_len % (2 * cp):
        raise ParaxisError(f"context parallelism splits the sequence into 2*cp = {2 * cp} "
                           f"equal chunks: seq_len {seq_len} is not divisible by {2 * cp}; "
                           "change seq_len or cp")
    return seq_len // (2 * cp)


def kv_heads_sent(kv_heads: int, cp: int) -> int:
    """K/V heads a rank hands the all-to-all variant: its own, or, with fewer K/V heads than
    ranks, each repeated for the cp/kv_heads ranks whose query heads read it."""
    return max(kv_heads, cp)


def check_heads(variant: str, heads: int, kv_heads: int, cp: int) -> None:
    """The all-to-all variant splits a rank's heads over the cp ranks: its query heads must
    divide by cp, its K/V heads divide by cp or divide cp. The other variants split no
    heads."""
    if variant != "all_to_all" or cp == 1:
        return
    if heads % cp:
        raise ParaxisError(f"cp_attention=all_to_all splits the attention heads over the cp "
                           f"ranks: {heads} heads (per TP rank) do not divide by cp={cp}; "
                           "use cp_attention=ring or a cp that divides the heads")
    if kv_heads % cp and cp % kv_heads:
        raise ParaxisError(f"cp_attention=all_to_all needs the K/V heads (per TP rank) to "
                           f"divide by cp or divide it: {kv_heads} and cp={cp} do neither; "
                           "use cp_attention=ring or another cp")


def rank_chunks(rank: int, cp: int) -> tuple[int, int]:
    """The two chunks (of 2*cp) rank `rank` holds, in the order they sit in its local
    sequence: an early one and its mirror image from the end."""
    if not 0 <= rank < cp:
        raise ParaxisError(f"context-parallel rank {rank} is outside 0..{cp - 1}")
    return rank, 2 * cp - 1 - rank


@dataclass(frozen=True)
class Block:
    """One kernel call: query chunk slots [q_start, q_stop) of the local sequence against key
    chunk slots [k_start, k_stop) of the key/value tensor at hand, in units of a chunk."""

    q_start: int
    q_stop: int
    k_start: int
    k_stop: int
    causal: bool

    def pairs(self, chunk_len: int) -> int:
        """(query, key) pairs the kernel computes; a causal square of n rows computes
        n(n+1)/2 (flash kernels skip the tiles above the diagonal)."""
        rows = (self.q_stop - self.q_start) * chunk_len
        cols = (self.k_stop - self.k_start) * chunk_len
        return rows * (rows + 1) // 2 if self.causal else rows * cols


def blocks_between(query_chunks: tuple[int, ...], key_chunks: tuple[int, ...]) -> list[Block]:
    """The kernel calls that compute what `query_chunks` (ascending, as laid out locally)
    need from `key_chunks` under the causal mask: query chunk a sees key chunk b iff b <= a.

    For the zig-zag split this is never more than one call: the rank's own chunks give one
    causal call over both (the early query chunk masks the late key chunk entirely, the late
    query chunk sees the early key chunk entirely), and another rank's chunks give one full
    rectangle (all queries against its early chunk if that rank is earlier, else the late
    query chunk against both of its chunks)."""
    if query_chunks == key_chunks:
        return [Block(0, len(query_chunks), 0, len(key_chunks), causal=True)]
    needed = {(qi, ki) for qi, q in enumerate(query_chunks) for ki, k in enumerate(key_chunks)
              if k <= q}
    if not needed:
        return []
    rows = sorted({qi for qi, _ in needed})
    cols = sorted({ki for _, ki in needed})
    rectangle = {(qi, ki) for qi in rows for ki in cols}
    diagonal = any(query_chunks[qi] == key_chunks[ki] for qi, ki in needed)
    contiguous = rows == list(range(rows[0], rows[-1] + 1)) and cols == list(
        range(cols[0], cols[-1] + 1))
    if needed != rectangle or diagonal or not contiguous:
        # Cannot happen for the zig-zag split; a general layout would need several calls.
        raise AssertionError(f"chunks {query_chunks} x {key_chunks} need {sorted(needed)}, "
                             "not one rectangle")
    return [Block(rows[0], rows[-1] + 1, cols[0], cols[-1] + 1, causal=False)]


def ring_source(rank: int, step: int, cp: int) -> int:
    """Whose key/value chunks rank `rank` holds at ring step `step` (they move one rank on
    per step: at step t they come from the rank t places before)."""
    return (rank - step) % cp


def ring_blocks(rank: int, step: int, cp: int) -> list[Block]:
    """The calls rank `rank` makes at ring step `step`, against the K/V it then holds."""
    return blocks_between(rank_chunks(rank, cp), rank_chunks(ring_source(rank, step, cp), cp))


def gathered_chunks(cp: int) -> tuple[int, ...]:
    """The chunks of the all-gathered K/V buffer in the order they land: rank by rank."""
    return tuple(chunk for rank in range(cp) for chunk in rank_chunks(rank, cp))


def gathered_blocks(rank: int, cp: int) -> list[Block]:
    """The all-gather variant's calls: the ring's blocks, all at hand at once, against the
    rank-major gathered buffer (`gathered_chunks`): source j's two chunks sit at slots
    2j, 2j+1."""
    return [Block(b.q_start, b.q_stop, 2 * source + b.k_start, 2 * source + b.k_stop, b.causal)
            for step in range(cp) for b in ring_blocks(rank, step, cp)
            for source in (ring_source(rank, step, cp),)]


def pairs_per_rank(seq_len: int, cp: int) -> list[int]:
    """(query, key) pairs each rank computes per head in one forward, by rank; the same for
    the ring and the all-gather variant (they compute the same blocks, `ring_blocks`), and
    for the all-to-all variant, whose heads/cp heads' whole triangle is s(s+1)/(2 cp) per
    head, which is exactly each zig-zag rank's 2*cp*L^2 + L pairs for s = 2*cp*L."""
    chunk_len = check_split(seq_len, cp)
    return [sum(block.pairs(chunk_len) for step in range(cp)
                for block in ring_blocks(rank, step, cp)) for rank in range(cp)]


def saved_bytes_per_rank(batch: int, heads: int, kv_heads: int, seq_len: int, head_dim: int,
                         cp: int, bytes_per_element: int, variant: str = "ring",
                         a2a: int = 1) -> int:
    """Bytes one rank's attention core saves for backward in one layer: its q and output,
    its own K and V (kv-head width), an fp32 log-sum-exp per head and query; single-device
    flash attention's for s/cp tokens (no received K/V is kept). The all-to-all variant
    keeps the same for heads/cp heads over s tokens, with its K/V copies (`kv_heads_sent`);
    two-level cp (`a2a` > 1) for heads/a2a heads over a2a*s/cp tokens, with its copies."""
    kv_heads = kv_heads_sent(kv_heads, cp if variant == "all_to_all" else a2a)
    tokens = batch * (seq_len // cp)
    elements = tokens * head_dim * (2 * heads + 2 * kv_heads)
    return elements * bytes_per_element + tokens * heads * 4


def all_to_all_inputs(batch: int, heads: int, kv_heads: int, seq_len: int, head_dim: int,
                      cp: int, bytes_per_element: int, a2a: int | None = None
                      ) -> tuple[int, int]:
    """Bytes of the all-to-all variant's two calls' inputs on one rank for one layer, each
    way: (q, k and v together, with the K/V copies of `kv_heads_sent`; the output). Backward
    moves the same: the output's gradient, then dq, dk, dv. `a2a`: the ranks the calls span
    (two-level cp; default all cp ranks)."""
    per_head = batch * (seq_len // cp) * head_dim * bytes_per_element
    copies = kv_heads_sent(kv_heads, cp if a2a is None else a2a)
    return per_head * (heads + 2 * copies), per_head * heads


def sent_bytes_per_rank(variant: str, batch: int, heads: int, kv_heads: int, seq_len: int,
                        head_dim: int, cp: int, bytes_per_element: int, a2a: int = 1
                        ) -> tuple[int, int]:
    """(forward, backward) bytes one rank hands to the network for one layer's attention, as
    `PairCounter` records them: K/V at kv-head width in the activation dtype, dK/dV in fp32.
    For a collective that is its input (a ring all-gather or reduce-scatter moves (cp-1)/cp
    of it per rank, an all-to-all the same); the module docstrings of `ring`, `all_gather`
    and `all_to_all` explain each term. Two-level cp (`a2a` > 1, `hierarchical.py`): the
    all-to-all's inputs over a2a ranks, plus `variant` across cp/a2a ranks for heads/a2a
    heads (and the K/V copies) over chunks a2a times longer."""
    if a2a > 1:
        inner = sum(all_to_all_inputs(batch, heads, kv_heads, seq_len, head_dim, cp,
                                      bytes_per_element, a2a))
        forward, backward = sent_bytes_per_rank(
            variant, batch, heads // a2a, kv_heads_sent(kv_heads, a2a) // a2a, seq_len,
            head_dim, cp // a2a, bytes_per_element)
        return forward + inner, backward + inner
    if variant == "all_to_all":  # q, k, v, then the output; backward the same, reversed
        both = sum(all_to_all_inputs(batch, heads, kv_heads, seq_len, head_dim, cp,
                                     bytes_per_element))
        return both, both
    local_kv = 2 * batch * kv_heads * (seq_len // cp) * head_dim  # K and V elements
    if variant == "ring":  # cp-1 K/V hops each way; cp-1 hops of the dK/dV accumulators
        forward = (cp - 1) * local_kv * bytes_per_element
        return forward, forward + (cp - 1) * local_kv * 4
    # all-gather forward and again in backward; reduce-scatter of the whole dK/dV
    forward = local_kv * bytes_per_element
    return forward, forward + cp * local_kv * 4


# ----------------------------------------------------------------- counting at run time


@dataclass
class PairCounter:
    """The (query, key) pairs the context-parallel kernels computed in this process, per
    phase ("forward", "backward"), per head and sequence (batch and heads not multiplied
    in), and the bytes this rank sent for them (K/V blocks, dK/dV, collectives' inputs)."""

    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    sent: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def __enter__(self) -> PairCounter:
        _ACTIVE.append(self)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        _ACTIVE.remove(self)

    def pairs(self, phase: str = "forward") -> int:
        return self.counts[phase]

    def sent_bytes(self, phase: str = "forward") -> int:
        return self.sent[phase]


_ACTIVE: list[PairCounter] = []
_HEAD_SHARE = [1]  # the innermost `heads_share`


@contextmanager
def heads_share(parts: int) -> Iterator[None]:
    """Count the pairs recorded inside as `parts`-th of them: a kernel that runs 1/parts
    of the heads (two-level cp: `hierarchical.py`) over a longer sequence, so that every
    variant counts pairs per head of the whole model."""
    _HEAD_SHARE.append(parts)
    try:
        yield
    finally:
        _HEAD_SHARE.pop()


def record(phase: str, pairs: int = 0, sent_bytes: int = 0) -> None:
    """Add to every active counter (none: nothing to do)."""
    for counter in _ACTIVE:
        counter.counts[phase] += pairs // _HEAD_SHARE[-1]
        counter.sent[phase] += sent_bytes
