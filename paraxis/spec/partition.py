"""Which layers each pipeline stage (and each of its chunks) owns.

Blocks are split into `pp * virtual` contiguous parts so that the most expensive part is as
cheap as possible (the pipeline runs at the pace of its slowest stage). The embedding lives
on the first part and the final norm, LM head and loss on the last, and their cost counts
against those parts, so the end stages get fewer blocks when the head is heavy. Uneven
counts are fine. Pure Python and in `plan/`: the runtime splits its model with it and the
planner prices the same split (one fact, computed once).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from paraxis.spec.errors import ParaxisError
from paraxis.spec.model_config import ModelConfig
from paraxis.spec.schedules import virtual_stage_of


@dataclass(frozen=True)
class Partition:
    """`parts[i]` is the range of global block indices of virtual stage i; which stage and
    chunk that is follows the schedule's placement (`schedules.virtual_stage_of`: Megatron's
    loop, chunk i // pp of stage i % pp, or zb-v's V)."""

    pp: int
    virtual: int
    parts: tuple[range, ...]
    costs: tuple[float, ...]  # per part, embedding/head included
    placement: str = "loop"

    def index(self, stage: int, chunk: int = 0) -> int:
        """The virtual stage (index into `parts`) of this stage's chunk."""
        return virtual_stage_of(stage, chunk, self.pp, self.placement)

    def blocks_of(self, stage: int, chunk: int = 0) -> range:
        return self.parts[self.index(stage, chunk)]

    def has_embedding(self, stage: int, chunk: int = 0) -> bool:
        return self.index(stage, chunk) == 0

    def has_head(self, stage: int, chunk: int = 0) -> bool:
        return self.index(stage, chunk) == len(self.parts) - 1

    def describe(self) -> str:
        """One line per stage: its blocks per chunk, embedding/head, and relative cost."""
        heaviest = max(self.costs)
        lines = []
        for stage in range(self.pp):
            pieces = []
            for chunk in range(self.virtual):
                blocks = self.blocks_of(stage, chunk)
                text = f"blocks {blocks.start}-{blocks.stop - 1}"
                if self.has_embedding(stage, chunk):
                    text = "embedding + " + text
                if self.has_head(stage, chunk):
                    text += " + head/loss"
                cost = self.costs[self.index(stage, chunk)] / heaviest
                pieces.append(f"{text} (cost {cost:.2f})")
            lines.append(f"stage {stage}: " + "; ".join(pieces))
        return "\n".join(lines)


def layer_costs(cfg: ModelConfig, seq_len: int | None = None) -> tuple[list[float], float,
                                                                        float]:
    """(per-block cost, embedding cost, head cost) in forward FLOPs per token.

    A block: 2 FLOPs per matrix parameter plus the attention scores and values
    (2 * 2 * seq * d, Kaplan et al. 2020, table 1). The embedding is a lookup (~free); the
    head is the vocab projection (2 * vocab * d), even when its weight is tied.
    """
    seq = seq_len or cfg.max_seq_len
    blocks = [2.0 * cfg.layer_params(i, active=True) + 4.0 * seq * cfg.d_model
              for i in range(cfg.n_layers)]  # an MoE block: the experts one token uses
    head = 2.0 * cfg.vocab_size * cfg.d_model
    return blocks, 0.0, head


def partition_layers(cfg: ModelConfig, pp: int, virtual: int = 1,
                     measured_s: list[float] | None = None,
                     seq_len: int | None = None, placement: str = "loop") -> Partition:
    """Split the blocks over pp * virtual parts, minimising the most expensive part.

    measured_s: optional measured per-block times (seconds), used instead of FLOP counts;
    the head is then weighted by FLOPs relative to an average block.
    """
    parts = pp * virtual
    if cfg.n_layers < parts:
        raise ParaxisError(f"{cfg.n_layers} layers cannot fill pp*virtual = {pp}*{virtual} = "
                           f"{parts} model chunks (each needs at least one layer); use "
                           f"pp*virtual <= {cfg.n_layers}")
    blocks, embed, head = layer_costs(cfg, seq_len)
    if measured_s is not None:
        if len(measured_s) != cfg.n_layers or min(measured_s) <= 0:
            raise ParaxisError(f"measured per-layer times need {cfg.n_layers} positive "
                               f"values, got {len(measured_s)}")
        scale = sum(measured_s) / sum(blocks)  # seconds per FLOP of an average block
        blocks, embed, head = list(measured_s), embed * scale, head * scale
    bounds = _min_max_split(blocks, parts, embed, head)
    if placement == "v" and virtual == 2:
        bounds = _balance_stages(bounds, blocks, embed, head, pp)
    ranges = tuple(range(a, b) for a, b in zip(bounds, bounds[1:], strict=False))
    costs = tuple(sum(blocks[r.start:r.stop]) + (embed if i == 0 else 0.0)
                  + (head if i == parts - 1 else 0.0) for i, r in enumerate(ranges))
    return Partition(pp, virtual, ranges, costs, placement)


def _balance_stages(bounds: list[int], costs: list[float], first_extra: float,
                    last_extra: float, pp: int) -> list[int]:
    """In zb-v's V, stage s runs parts s and 2P-1-s, so stage 0 carries both the embedding
    and the head: balancing parts leaves that stage the slowest. Move one boundary at a time
    by one block while that lowers (largest stage, sum of squared stages), from the balanced
    parts; each step strictly improves, so it ends."""
    parts = len(bounds) - 1

    def stage_costs(b: list[int]) -> list[float]:
        part = [sum(costs[b[i]:b[i + 1]]) + (first_extra if i == 0 else 0.0)
                + (last_extra if i == parts - 1 else 0.0) for i in range(parts)]
        return [part[s] + part[parts - 1 - s] for s in range(pp)]

    def score(b: list[int]) -> tuple[float, float]:
        stages = stage_costs(b)
        return max(stages), sum(c * c for c in stages)

    best, improved = score(bounds), True
    while improved:
        improved = False
        for i in range(1, parts):
            for step in (-1, 1):
                moved = list(bounds)
                moved[i] += step
                if moved[i - 1] < moved[i] < moved[i + 1] and score(moved) < best:
                    bounds, best, improved = moved, score(moved), True
    return bounds


def _min_max_split(costs: list[float], parts: int, first_extra: float, last_extra: float
                   ) -> list[int]:
    """Boundaries 0 = b0 < b1 < ... < b_parts = n of a contiguous split that minimises the
    largest part (first part carries first_extra, last part last_extra). Dynamic programming
    over (parts used, blocks covered), quadratic in the blocks: a model of a few hundred
    layers takes well under a second; past DP_BLOCKS a bottleneck search gives the same largest
    part in O(parts log n) per try (ties between equal largest parts then go to the
    earliest boundaries, not to the evenest squares)."""
    n = len(costs)
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    if parts == 1:
        return [0, n]
    if n > DP_BLOCKS:
        return _bottleneck_split(prefix, parts, first_extra, last_extra)

    def cost(part: int, start: int, stop: int) -> float:
        extra = (first_extra if part == 0 else 0.0) + (last_extra if part == parts - 1 else 0.0)
        return prefix[stop] - prefix[start] + extra

    inf = (float("inf"), float("inf"))
    # best[k][j]: (largest part, sum of squared parts) of the best split of the first j
    # blocks into k parts; the squares break ties towards evenly loaded parts.
    best = [[inf] * (n + 1) for _ in range(parts + 1)]
    choice = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = (0.0, 0.0)
    for k in range(1, parts + 1):
        for j in range(k, n - (parts - k) + 1):
            # The last part [i, j) grows as i falls: once it alone exceeds the best largest
            # part so far, no smaller i can do better. Ties go to the smallest i (`<=`
            # while i falls), as an ascending scan keeping the first best would.
            for i in range(j - 1, k - 2, -1):
                part = cost(k - 1, i, j)
                if part > best[k][j][0]:
                    break
                value = (max(best[k - 1][i][0], part), best[k - 1][i][1] + part * part)
                if value <= best[k][j]:
                    best[k][j], choice[k][j] = value, i
    bounds = [n]
    for k in range(parts, 0, -1):
        bounds.append(choice[k][bounds[-1]])
    return bounds[::-1]


DP_BLOCKS = 512  # beyond this many blocks the quadratic search gives way to the bottleneck one


def _bottleneck_split(prefix: list[float], parts: int, first_extra: float, last_extra: float
                      ) -> list[int]:
    """`_min_max_split` for many blocks: bisect the largest part's cost; for each candidate a
    greedy pass extends every part as far as the candidate allows (leaving a block for each
    part after it) and succeeds when the last part fits too."""
    n = len(prefix) - 1

    def extra(part: int) -> float:
        return (first_extra if part == 0 else 0.0) + (last_extra if part == parts - 1 else 0.0)

    def greedy(limit: float) -> list[int] | None:
        bounds = [0]
        for part in range(parts - 1):
            start = bounds[-1]
            # the furthest stop with prefix[stop] - prefix[start] + extra <= limit
            stop = bisect.bisect_right(prefix, prefix[start] + limit - extra(part)) - 1
            stop = min(stop, n - (parts - 1 - part))  # a block for every later part
            if stop <= start:
                return None
            bounds.append(stop)
        if prefix[n] - prefix[bounds[-1]] + extra(parts - 1) > limit:
            return None
        return [*bounds, n]

    low, high = 0.0, prefix[n] + first_extra + last_extra
    found = greedy(high)
    for _ in range(100):  # bisection of a float interval: 100 halvings reach its precision
        middle = (low + high) / 2
        if middle in (low, high):
            break
        attempt = greedy(middle)
        if attempt is None:
            low = middle
        else:
            high, found = middle, attempt
    assert found is not None
    return found
