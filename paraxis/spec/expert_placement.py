"""Where experts live under expert parallelism and what the token all-to-all carries.

Pure Python (no torch): the runtime places experts and counts its all-to-all from these
functions, the planner prices the same traffic, the pictures draw it. Experts are split over
the `ep` ranks of an expert-parallel group in contiguous blocks (rank j holds experts
j*E/ep .. (j+1)*E/ep - 1), as Megatron-Core and torchtitan place them.

One MoE block moves tokens twice in forward (dispatch to the experts' ranks, combine back)
and twice in backward (the gradients of both, the other way): four all-to-alls of d_model
values per (token, chosen expert) that leaves its rank.
"""

from __future__ import annotations

import math

from paraxis.spec.errors import ParaxisError

ALL_TO_ALLS_PER_BLOCK = 4  # dispatch and combine, forward and backward


def experts_on_sequence_shards(tp: int, sequence_parallel: bool, etp: int,
                               capacity_factor: float) -> bool:
    """Whether each tp rank runs a mixture of experts' block on its own sequence shard only:
    under sequence parallelism, with the experts whole on every tp rank (etp = 1) and
    dropless routing, as Megatron-Core runs it (its experts' data-parallel group takes in the
    tp ranks). Then the block needs no collective around it and each rank does 1/tp of its
    expert work, at the price of summing the router's and experts' gradients over tp once a
    step. Under a capacity factor the block gathers the sequence instead: capacity counts a
    rank's tokens, and a shard's capacity would drop other tokens than one device does."""
    return tp > 1 and sequence_parallel and etp == 1 and not capacity_factor


def experts_of_rank(n_experts: int, ep: int, ep_rank: int) -> range:
    """The experts EP rank `ep_rank` of `ep` holds."""
    if ep < 1 or n_experts % ep:
        raise ParaxisError(f"ep={ep} must divide the number of experts ({n_experts}); choose "
                           "ep among the divisors of n_experts")
    per_rank = n_experts // ep
    return range(ep_rank * per_rank, (ep_rank + 1) * per_rank)


def owner_of_expert(expert: int, n_experts: int, ep: int) -> int:
    return expert // (n_experts // ep)


def send_matrix(counts: list[list[int]], ep: int) -> list[list[int]]:
    """counts[i][e]: assignments of EP rank i's tokens to expert e -> sends[i][j]: the
    (token, expert) rows rank i sends to rank j (j == i stays on the rank)."""
    n_experts = len(counts[0])
    sends = [[0] * ep for _ in counts]
    for source, row in enumerate(counts):
        for expert, count in enumerate(row):
            sends[source][owner_of_expert(expert, n_experts, ep)] += count
    return sends


def all_to_all_bytes(sends: list[list[int]], d_model: int, bytes_per_value: int) -> list[int]:
    """Bytes each rank sends to other ranks in one all-to-all of `sends` rows."""
    return [sum(n for j, n in enumerate(row) if j != i) * d_model * bytes_per_value
            for i, row in enumerate(sends)]


def kib(value: float) -> str:
    """Bytes in KiB as `paraxis experts` prints them: two significant digits below 10 (512 B
    is 0.5, not 0)."""
    k = value / 1024
    return f"{k:.0f}" if k >= 10 or k == 0 else f"{k:.2g}"


def uniform_send_matrix(tokens: int, top_k: int, n_experts: int, ep: int,
                        capacity_factor: float = 0.0) -> list[list[float]]:
    """The send matrix when every expert gets the same share of each rank's `tokens` (one
    microbatch's; perfect balance). A capacity factor < 1 caps each expert at
    `expert_capacity` of them, the runtime's cap (parallel/experts/layer.py)."""
    per_expert = tokens * top_k / n_experts
    if capacity_factor:
        per_expert = min(per_expert, expert_capacity(tokens, top_k, n_experts,
                                                     capacity_factor))
    per_rank = per_expert * n_experts / ep
    return [[per_rank] * ep for _ in range(ep)]


def expert_capacity(tokens: float, top_k: int, n_experts: int, capacity_factor: float) -> int:
    """Assignments each expert takes of one rank's `tokens` in one microbatch under a
    capacity factor: ceil(cf * tokens * k / E) (Switch Transformer, Fedus et al. 2022 eq. 3;
    the ceiling so a positive factor never leaves an expert no room). Per rank and
    microbatch, as the runtime drops before its all-to-all, and as the planner prices. A
    factor above E / k gives every expert room for all the tokens (one takes each token at
    most once): the same as E / k, which keeps the product finite."""
    return math.ceil(min(capacity_factor, n_experts / top_k) * tokens * top_k / n_experts)
