"""Price context parallelism (cp ranks split every sequence): what it costs per layer.

What cp changes, and where the facts come from (`paraxis.spec.cp_balance`, the
runtime's own counts, torch-free; nothing is re-derived here):

- Memory: each rank holds s/cp tokens of every sequence, so every activation falls by cp
  (`memory.layout_memory` prices the layer at s/cp tokens); the attention core saves what
  single-device flash attention saves for s/cp tokens (`balance.saved_bytes_per_rank`, which
  `activations.attention_kernel_bytes` matches: tests/test_plan_cp.py). The model states are
  replicated over cp like over dp, and ZeRO shards them over dp x cp.
- Compute: every rank computes the same number of (query, key) pairs with the zig-zag split,
  1/cp of the causal triangle (`balance.pairs_per_rank`): the dense work falls by cp with the
  tokens, the attention core by cp too; `imbalance` is the busiest rank over the mean (1.0).
- The K/V exchange per layer (`balance.sent_bytes_per_rank`), over the link the cp group
  spans: the ring sends cp-1 hops of the local K/V forward, and in backward cp-1 hops of K/V
  plus cp-1 hops of the fp32 dK/dV accumulators; the all-gather variant gathers K/V forward
  and again in backward, then reduce-scatters the whole fp32 dK/dV (`comm.scatter_time`: on
  CPU ranks, gloo, an all-to-all that each owner sums).
- Overlap (`paraxis/parallel/context/ring.py`): the ring posts step t+1's K/V before step t
  computes, so each hop hides behind one step's attention (1/cp of the layer's core, as every
  step computes the same 2L x 2L pairs for chunks of L tokens): exposed = max(0, hop - step)
  per step, plus the overlap's contention on what hides. In backward the dK/dV accumulator
  travels one hop behind its block, so the last one home has no compute left to hide
  behind: exposed. The
  all-gather's collectives block the attention that needs them: all exposed.
- The all-to-all variant (DeepSpeed-Ulysses, `parallel/context/all_to_all.py`) moves q, k,
  v and the output instead (two all-to-alls each way, all exposed: the kernel needs every
  token of its heads), runs the kernel on the whole sequence for heads/cp heads (its rate
  is the full sequence's: `kernel_pieces`), and keeps the K/V copies it sends where a TP
  rank has fewer K/V heads than cp (`repeated_kv_bytes`).
"""

from __future__ import annotations

import functools

from paraxis.plan.comm import (
    Link,
    axis_link,
    collective_time,
    group_link,
    leaving,
    ring_factor,
    scatter_time,
)
from paraxis.plan.hardware import Cluster
from paraxis.spec.cp_balance import (
    all_to_all_inputs,
    kv_heads_sent,
    pairs_per_rank,
    saved_bytes_per_rank,
    sent_bytes_per_rank,
)
from paraxis.spec.grid import first_group, grid_rank
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import ModelConfig

# A search tries cp > 1 only while each rank keeps at least this many tokens of a sequence:
# below it a ring step's attention (quadratic in the chunk) hides less of its K/V hop (linear
# in it), and TP or recomputation are the cheaper ways to save memory. Llama 3's 128K stage
# ran 8192 tokens per rank (cp=16; Dubey et al. 2024, Table 4); at 8192 the search missed a
# layout its own model prices 18% faster (Mixtral 8x7B, 64 H100s, 32K tokens: cp=8, 4096 a
# rank, no recompute). It keeps the search of 1024 GPUs at 2K-8K tokens under 2 s.
# `paraxis plan --cp N` prices any cp.
MIN_CP_TOKENS = 4096


@functools.lru_cache(maxsize=1024)  # a search asks for the same few thousand times
def imbalance(seq_len: int, cp: int) -> float:
    """The busiest rank's attention pairs over the mean: 1.0 for the zig-zag split, whose
    ranks all compute 2*cp*L^2 + L pairs (`balance.pairs_per_rank`)."""
    if cp == 1:
        return 1.0
    pairs = pairs_per_rank(seq_len, cp)
    return max(pairs) * len(pairs) / sum(pairs)


def local_kv_heads(cfg: ModelConfig, tp: int) -> int:
    """K/V heads one TP rank holds (a kv head is replicated when tp exceeds them)."""
    return max(1, cfg.n_kv_heads // tp)


def kernel_pieces(layout: Layout) -> int:
    """Into how many pieces the attention kernel's sequence is cut: the blockwise variants
    run blocks of s/cp queries by s/cp keys, the all-to-all variant the whole sequence,
    two-level cp blocks of s/(cp/cp_a2a)."""
    return 1 if layout.cp_attention == "all_to_all" else layout.cp // layout.cp_a2a


def repeated_kv_bytes(cfg: ModelConfig, variant: str, cp: int, tp: int, seq_len: int,
                      micro_batch: int, a2a: int = 1) -> float:
    """Bytes (16-bit) one layer's core keeps beyond single-device flash attention's for s/cp
    tokens: the all-to-all's K/V copies where a TP rank has fewer K/V heads than the ranks
    it spans (cp, or cp_a2a for two levels; `balance.kv_heads_sent`); 0 otherwise: what
    `balance.saved_bytes_per_rank` counts beyond the ring's."""
    if (variant != "all_to_all" and a2a == 1) or cp == 1:
        return 0.0
    shape = (micro_batch, cfg.n_heads // tp, local_kv_heads(cfg, tp), seq_len, cfg.head_dim,
             cp, 2)
    return float(saved_bytes_per_rank(*shape, variant, a2a)
                 - saved_bytes_per_rank(*shape, "ring"))


def wire_bytes_per_rank(variant: str, batch: int, heads: int, kv_heads: int, seq_len: int,
                        head_dim: int, cp: int, bytes_per_element: int) -> tuple[float, float]:
    """(forward, backward) bytes that leave one rank for one layer's attention: of what
    `balance.sent_bytes_per_rank` hands each collective, the share a rank sends, as
    `cp_layer_times` prices it. The ring's hops send all of theirs. The all-gather sends
    `ring_factor` of its output (cp x the local K/V) and the reduce-scatter of its input, so
    the all-gather variant moves exactly the ring's bytes, in fewer, larger messages; an
    all-to-all sends the (cp-1)/cp of its input bound for the other ranks."""
    forward, backward = sent_bytes_per_rank(variant, batch, heads, kv_heads, seq_len, head_dim,
                                            cp, bytes_per_element)
    if variant == "ring":
        return forward, backward
    if variant == "all_to_all":
        return leaving(forward, cp), leaving(backward, cp)
    gathered = ring_factor("all_gather", cp) * cp * forward  # forward, and backward again
    return gathered, gathered + ring_factor("reduce_scatter", cp) * (backward - forward)


def cp_layer_times(cfg: ModelConfig, variant: str, cp: int, tp: int, seq_len: int,
                   micro_batch: int, activation_bytes: int, link: Link,
                   core_forward: float, core_backward: float,
                   contention: float) -> dict[str, float]:
    """Seconds of one layer's K/V exchange per microbatch on one rank.

    `core_forward` / `core_backward`: the layer's attention-core seconds on this rank (the
    window the ring hides behind). Keys: forward / backward (exposed), total (all traffic),
    forward_total (the forward's traffic: what full recompute runs again), rerun /
    rerun_total (exposed and all of what selective recompute, which reruns the attention
    core until its saved tensors are back, runs again).
    """
    if cp == 1:
        return dict.fromkeys(("forward", "backward", "total", "forward_total", "rerun",
                              "rerun_total"), 0.0)
    shape = (micro_batch, cfg.n_heads // tp, local_kv_heads(cfg, tp), seq_len, cfg.head_dim,
             cp, activation_bytes)
    return level_times(variant, shape, link, core_forward, core_backward, contention)


def level_times(variant: str, shape: tuple[int, ...], link: Link, core_forward: float,
                core_backward: float, contention: float) -> dict[str, float]:
    """`cp_layer_times` for one level of cp ranks: `shape` = (batch, heads, kv heads, seq,
    head dim, ranks, activation bytes) of `balance.sent_bytes_per_rank`."""
    cp = shape[5]
    if variant == "all_to_all":  # q, k, v over, the output back; nothing hides them
        qkv, out = (collective_time("all_to_all", leaving(size, cp), cp, link)
                    for size in all_to_all_inputs(*shape))
        both = qkv + out
        # backward: the output's gradient over, dq, dk, dv back (the same bytes); selective
        # recompute stops at the kernel's saved tensors: the q, k, v exchange only
        return {"forward": both, "backward": both, "total": 2 * both, "forward_total": both,
                "rerun": qkv, "rerun_total": qkv}
    forward_bytes, backward_bytes = sent_bytes_per_rank(variant, *shape)
    step_f, step_b = core_forward / cp, core_backward / cp  # one ring step's compute

    def hidden(transfer: float, window: float) -> float:
        return max(0.0, transfer - window) + contention * min(transfer, window)

    if variant == "ring":
        kv_hop = collective_time("send_recv", forward_bytes / (cp - 1), 2, link)
        grad_hop = collective_time("send_recv", (backward_bytes - forward_bytes) / (cp - 1),
                                   2, link)

        forward = (cp - 1) * hidden(kv_hop, step_f)
        # (context/ring.py's backward) step 0 posts the first K/V hop and keeps its own dK/dV,
        # so step 1 hides a K/V hop alone; steps 2..cp-2 each hide a K/V hop and the dK/dV
        # accumulator of the step before; the last step hides that accumulator alone, and
        # the last goes home after all compute
        backward = hidden(kv_hop, step_b) + grad_hop if cp == 2 else (
            2 * hidden(kv_hop, step_b) + (cp - 3) * hidden(kv_hop + grad_hop, step_b)
            + hidden(grad_hop, step_b) + grad_hop)
        return {"forward": forward, "backward": backward,
                "total": (cp - 1) * (2 * kv_hop + grad_hop), "forward_total": (cp - 1) * kv_hop,
                "rerun": forward, "rerun_total": (cp - 1) * kv_hop}
    # all-gather: the gathered K/V are cp x the local input; the reduce-scatter's input is
    # the whole sequence's fp32 dK/dV (balance.sent_bytes_per_rank counts inputs)
    # (parallel/context/all_gather.py): the forward gather runs while the rank computes its
    # own diagonal block (about one ring step's work), backward's gather is waited for
    # at once, and its reduce-scatter runs behind the diagonal block again
    gather = collective_time("all_gather", cp * forward_bytes, cp, link)
    scatter = scatter_time(backward_bytes - forward_bytes, cp, link)
    forward = hidden(gather, step_f)
    return {"forward": forward, "backward": gather + hidden(scatter, step_b),
            "total": 2 * gather + scatter, "forward_total": gather, "rerun": forward,
            "rerun_total": gather}


def exchange_times(cfg: ModelConfig, layout: Layout, cluster: Cluster, seq_len: int,
                   micro_batch: int, activation_bytes: int, core_forward: float,
                   core_backward: float, contention: float) -> dict[str, float]:
    """`cp_layer_times` for the layout's cp, one level or two (`cp_a2a` > 1,
    `parallel/context/hierarchical.py`): an all-to-all of q, k, v and the output over the
    cp_a2a consecutive ranks (all exposed, as the all-to-all variant's), and the layout's
    variant across the cp/cp_a2a groups for heads/cp_a2a heads (with the K/V copies) on
    chunks cp_a2a times longer, each over the link its group spans."""
    if layout.cp_a2a == 1:
        return cp_layer_times(cfg, layout.cp_attention, layout.cp, layout.tp, seq_len,
                              micro_batch, activation_bytes, axis_link(layout, "cp", cluster),
                              core_forward, core_backward, contention)
    a, heads, kv = layout.cp_a2a, cfg.n_heads // layout.tp, local_kv_heads(cfg, layout.tp)
    a2a_link, across_link = (group_link([grid_rank(layout.degrees, {"cp": c}) for c in cps],
                                        cluster) for cps in (range(a), range(0, layout.cp, a)))
    qkv, out = (collective_time("all_to_all", leaving(size, a), a, a2a_link)
                for size in all_to_all_inputs(micro_batch, heads, kv, seq_len, cfg.head_dim,
                                              layout.cp, activation_bytes, a))
    across = level_times(layout.cp_attention, (micro_batch, heads // a, kv_heads_sent(kv, a)
                                               // a, seq_len, cfg.head_dim, layout.cp // a,
                                               activation_bytes),
                         across_link, core_forward, core_backward, contention)
    extra = {"forward": qkv + out, "backward": qkv + out, "total": 2 * (qkv + out),
             "forward_total": qkv + out, "rerun": qkv, "rerun_total": qkv}
    return {key: across[key] + extra[key] for key in across}


def replica_link(layout: Layout, cluster: Cluster) -> Link:
    """The link the gradient sync runs over: the dp x cp ranks holding the same parameters
    (the dp axis alone when cp = 1)."""
    if layout.cp == 1:
        return axis_link(layout, "dp", cluster)
    return group_link(_replica_ranks(layout.grid), cluster)


@functools.lru_cache(maxsize=1024)  # a search asks for the same few grids thousands of times
def _replica_ranks(degrees: tuple[tuple[str, int], ...]) -> tuple[int, ...]:
    return tuple(first_group(dict(degrees), ("dp", "cp")))


def zero_link(layout: Layout, cluster: Cluster) -> Link:
    """The link ZeRO's collectives run over: the replica link, or under hybrid sharding one
    shard group's (dp_shard x cp consecutive ranks: inside a node where they fit)."""
    if not layout.hybrid:
        return replica_link(layout, cluster)
    return group_link(hybrid_group_ranks(layout.grid, layout.shard_size, "shard"), cluster)


def copies_link(layout: Layout, cluster: Cluster) -> Link | None:
    """Under hybrid sharding, the link the all-reduce across a shard's copies runs over (one
    rank per shard group: across nodes where a shard group fills one); else None."""
    if not layout.hybrid:
        return None
    return group_link(hybrid_group_ranks(layout.grid, layout.shard_size, "copies"), cluster)


@functools.lru_cache(maxsize=1024)  # a search asks for the same few grids thousands of times
def hybrid_group_ranks(degrees: tuple[tuple[str, int], ...], shard: int, which: str
                  ) -> tuple[int, ...]:
    """Rank 0's shard group (dp ranks 0..shard-1 x every cp rank) or its copies (dp ranks
    0, shard, 2*shard, ...; `Layout.groups` "dp_shard" and "dp_replicate")."""
    sizes = dict(degrees)
    if which == "shard":  # dp's own degree sets no stride rank 0's group reads
        return tuple(first_group({**sizes, "dp": shard}, ("dp", "cp")))
    return tuple(grid_rank(sizes, {"dp": d}) for d in range(0, sizes["dp"], shard))
