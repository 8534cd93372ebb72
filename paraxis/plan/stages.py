"""What each pipeline stage holds of the model, from the runtime's own partition of its
blocks (`spec.partition`): its blocks and their kinds, those its recompute applies to, and how
much of them its schedule holds at once (`held_stages`)."""

from __future__ import annotations

import functools
from typing import NamedTuple

from paraxis.plan.activations import (
    chunk_end_weight_grad_input_values,
    weight_grad_input_values,
)
from paraxis.plan.bubble import pipeline_figures
from paraxis.plan.experts import moe_blocks, moe_weight_grad_input_values
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import ModelConfig
from paraxis.spec.partition import Partition, partition_layers
from paraxis.spec.schedules import SPLIT_BACKWARD, peak_held, pending_moments, place_of


@functools.lru_cache(maxsize=4096)
def partition_of(cfg: ModelConfig, pp: int, virtual: int, seq_len: int | None,
               placement: str = "loop") -> Partition:
    """The runtime's own partition (`spec.partition.partition_layers`), asked often."""
    return partition_layers(cfg, pp, virtual, seq_len=seq_len, placement=placement)


@functools.lru_cache(maxsize=1024)  # a layout search asks for every layout
def held_stages(kind: str, pp: int, microbatches: int, virtual: int,
                chunk_blocks: tuple[tuple[int, ...], ...]) -> tuple[float, ...]:
    """Per stage, the most activation it holds at once in units of its whole stage's blocks
    for one microbatch: its peak in-flight (microbatch, chunk) sets, each weighed by its
    chunk's blocks (`chunk_blocks[stage]`: the runtime's partition, whose chunks are uneven
    where the head's cost shifts blocks), from the schedule's own order where a stage has
    several chunks; at most 2 pp microbatches of it (the warm-up's whole, and a period of
    the steady state after it: more repeat it)."""
    if virtual == 1:
        return tuple(float(n) for n in pipeline_figures(kind, pp, microbatches,
                                                        virtual).peak_in_flight)
    held = peak_held(kind, pp, min(microbatches, 2 * pp), virtual,
                     [list(chunks) for chunks in chunk_blocks])
    return tuple(peak / max(1, sum(chunks)) for peak, chunks in zip(held, chunk_blocks,
                                                                       strict=True))


@functools.lru_cache(maxsize=1024)  # a layout search asks for every layout
def head_sets(kind: str, pp: int, microbatches: int, virtual: int, placement: str) -> int:
    """Microbatches whose head output (the logits, what the loss keeps) its stage holds at
    once, from the head chunk's forward to its backward: all of them under GPipe, one under
    1F1B, the schedule's own count where stages hold several chunks (at most 2 pp
    microbatches of it, as `held_stages`). A split backward's B frees them (what it keeps
    for W is counted with W's)."""
    if pp == 1 or kind in SPLIT_BACKWARD:
        return 1
    if virtual == 1:
        return microbatches if kind == "gpipe" else 1
    stage, chunk = place_of(pp * virtual - 1, pp, placement)
    weights = [[0.0] * virtual for _ in range(pp)]
    weights[stage][chunk] = 1.0
    return max(1, round(peak_held(kind, pp, min(microbatches, 2 * pp), virtual,
                                  weights)[stage]))


def stage_layers(cfg: ModelConfig, pp: int, virtual: int = 1,
                 seq_len: int | None = None, placement: str = "loop") -> list[int]:
    """Blocks per pipeline stage (all its chunks): the runtime's own split, balanced by FLOPs
    with the head's cost on the last virtual stage (`spec/partition.py`), so uneven counts
    happen."""
    return [len(blocks) for blocks in stage_blocks(cfg, pp, virtual, seq_len, placement)]


@functools.lru_cache(maxsize=4096)  # a layout search asks often
def stage_kinds(cfg: ModelConfig, pp: int, virtual: int = 1, seq_len: int | None = None,
                placement: str = "loop") -> tuple[tuple[int, int], ...]:
    """(dense blocks, MoE blocks) each stage holds."""
    return tuple((len(blocks) - moe_blocks(cfg, blocks), moe_blocks(cfg, blocks))
                 for blocks in stage_blocks(cfg, pp, virtual, seq_len, placement))


def recomputed_kinds(cfg: ModelConfig, layout: Layout, seq_len: int | None = None
                     ) -> tuple[tuple[int, int, bool], ...]:
    """(dense blocks, MoE blocks, whether a chunk is recomputed whole) of each stage that its
    recompute applies to: all of them, but under the block method the first
    recompute_layers of each chunk of the runtime's own partition, as
    `Transformer.set_recompute` marks them."""
    if layout.recompute_method == "uniform":
        return tuple((dense, moe, True) for dense, moe in stage_kinds(
            cfg, layout.pp, layout.virtual_stages, seq_len, layout.placement))
    return _recomputed_kinds(cfg, layout.pp, layout.virtual_stages, seq_len, layout.placement,
                             layout.recompute_layers)


def recomputed_share(cfg: ModelConfig, layout: Layout, seq_len: int | None = None) -> float:
    """The share of the model's blocks its recompute applies to (all of them but under the
    block method: `recomputed_kinds`)."""
    if layout.recompute_method == "uniform":
        return 1.0
    return sum(dense + moe for dense, moe, _ in recomputed_kinds(cfg, layout, seq_len)) \
        / cfg.n_layers


@functools.lru_cache(maxsize=4096)  # a layout search asks for every stage of every layout
def _recomputed_kinds(cfg: ModelConfig, pp: int, virtual: int, seq_len: int | None,
                      placement: str, first: int) -> tuple[tuple[int, int, bool], ...]:
    partition = partition_of(cfg, pp, virtual, seq_len, placement)
    rows = []
    for stage in range(pp):
        chunks = [partition.blocks_of(stage, chunk) for chunk in range(virtual)]
        blocks = [i for chunk in chunks for i in chunk[:first]]
        moe = moe_blocks(cfg, blocks)
        rows.append((len(blocks) - moe, moe, any(len(chunk) <= first for chunk in chunks)))
    return tuple(rows)


@functools.lru_cache(maxsize=4096)  # a layout search asks often
def stage_blocks(cfg: ModelConfig, pp: int, virtual: int, seq_len: int | None,
                  placement: str) -> tuple[tuple[int, ...], ...]:
    """The blocks each stage holds, its chunks' in turn."""
    partition = partition_of(cfg, pp, virtual, seq_len, placement)
    return tuple(tuple(i for chunk in range(virtual) for i in partition.blocks_of(stage, chunk))
                 for stage in range(pp))


def chunk_blocks(cfg: ModelConfig, layout: Layout, seq_len: int | None = None
                 ) -> tuple[tuple[int, ...], ...]:
    """Per stage, the blocks of each of its chunks (`held_stages` weighs by them)."""
    return tuple(tuple(chunk.dense + chunk.moe for chunk in row) for row in chunk_facts(
        cfg, layout.pp, layout.virtual_stages, seq_len, layout.placement))


class ChunkFacts(NamedTuple):
    dense: int  # blocks
    moe: int
    embedding: bool  # the model's first chunk: its input is token ids
    head: bool  # the model's last chunk


@functools.lru_cache(maxsize=4096)  # a layout search asks for every stage of every layout
def chunk_facts(cfg: ModelConfig, pp: int, virtual: int, seq_len: int | None,
                placement: str) -> tuple[tuple[ChunkFacts, ...], ...]:
    """Per stage, each chunk's blocks by kind and its ends, from the runtime's partition."""
    partition = partition_of(cfg, pp, virtual, seq_len, placement)
    rows = []
    for stage in range(pp):
        row = []
        for chunk in range(virtual):
            blocks = partition.blocks_of(stage, chunk)
            moe = moe_blocks(cfg, blocks)
            row.append(ChunkFacts(len(blocks) - moe, moe, partition.has_embedding(stage, chunk),
                                  partition.has_head(stage, chunk)))
        rows.append(tuple(row))
    return tuple(rows)


@functools.lru_cache(maxsize=1024)
def pending_stages(kind: str, pp: int, microbatches: int) -> tuple[tuple[tuple[int, ...], ...],
                                                                    ...]:
    """Per stage of a split-backward schedule, its moments of most memory
    (`schedules.pending_moments`: per chunk, activation sets held and sets whose gradients
    B keeps for W) over at most 2 pp microbatches (the warm-up's whole and a period of the
    steady state after it: more repeat it)."""
    return tuple(pending_moments(kind, pp, min(microbatches, 2 * pp)))


def kept_for_w_values(cfg: ModelConfig, chunk: ChunkFacts, seq_len: int, micro_batch: int,
                      tp: int = 1, sequence_parallel: bool = False, head: str = "chunked",
                      routed_seq: int | None = None, expert_imbalance: float = 1.0,
                      etp: int = 1) -> float:
    """Values a chunk's B keeps for its W in a split backward (split_backward.py), per GPU
    for `micro_batch` sequences of `seq_len` tokens on the rank (`routed_seq`: of them, those
    it routes): its blocks' weighted ops' output gradients (none where its input is token
    ids and W is its whole backward) and its ends' (`chunk_end_weight_grad_input_values`;
    `head`: the loss kernel the head runs)."""
    args = (seq_len, micro_batch, tp, sequence_parallel)
    values = chunk_end_weight_grad_input_values(cfg, *args, embedding=chunk.embedding,
                                                head=head if chunk.head else "")
    if not chunk.embedding:
        values += chunk.dense * weight_grad_input_values(cfg, *args) + chunk.moe * (
            weight_grad_input_values(cfg, *args, mlp=False) + moe_weight_grad_input_values(
                cfg, seq_len if routed_seq is None else routed_seq, micro_batch,
                expert_imbalance, etp))
    return values
