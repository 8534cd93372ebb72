"""The mixture-of-experts widget's figures: a real router's choices, and what expert
parallelism does with them under every setting of the widget's sliders.

The routing is the `paraxis experts` command's (`moe.command.route_batch`): tiny-moe at its
initial weights reads a batch of the embedded corpus, and every MoE block's top-k choices
are recorded. From them, as the runtime and the planner count (`moe.placement`,
`moe.command.counts_by_rank`): the batch's sequences split over the EP ranks as data
parallelism splits them; each rank keeps at most `expert_capacity` assignments per expert
(as many as the runtime's `MoE._within_capacity` keeps, which tests/test_lab_beyond.py
checks) and sends the rest of its assignments to the ranks holding their experts
(`send_matrix`, `all_to_all_bytes`).
"""

from __future__ import annotations

from paraxis.model.routing import counts_by_rank, route_batch
from paraxis.show.viz.style import RANK_COLOURS
from paraxis.spec.expert_placement import (
    all_to_all_bytes,
    expert_capacity,
    experts_of_rank,
    send_matrix,
    uniform_send_matrix,
)

MODEL = "tiny-moe"
BATCH, SEQ_LEN = 8, 128  # 1024 tokens: the 8 sequences split evenly over every ep below
EP_DEGREES = [1, 2, 4, 8]
# The slider runs from no cap (0: dropless) to the tightest: drops grow left to right.
CAPACITY_FACTORS = [0.0, 2.0, 1.25, 1.0]
BYTES_PER_VALUE = 4  # fp32 activations, as the CPU runs tiny-moe


def capped(counts: list[list[int]], capacity: int | None) -> list[list[int]]:
    """Each rank's assignments per expert that its capacity lets through (all: dropless)."""
    return [[c if capacity is None else min(c, capacity) for c in row] for row in counts]


def expert_setting(chosen: list[list[int]], n_experts: int, top_k: int, d_model: int,
                   ep: int, capacity_factor: float) -> dict:
    """One (block, ep, capacity factor) setting: per EP rank and expert the assignments
    routed and kept, the kept rows each rank sends each rank, the bytes that leave each
    rank in one dispatch all-to-all, and the same for uniform routing; the busiest expert
    (as routed) and the busiest rank (the kept assignments its experts take) over the mean,
    and the share of the assignments that leave their rank."""
    routed = counts_by_rank(chosen, n_experts, ep)
    tokens = len(chosen) // ep  # per rank
    capacity = (expert_capacity(tokens, top_k, n_experts, capacity_factor)
                if capacity_factor else None)
    kept = capped(routed, capacity)
    sends = send_matrix(kept, ep)
    uniform = uniform_send_matrix(tokens, top_k, n_experts, ep, capacity_factor)
    per_expert = [sum(column) for column in zip(*routed, strict=True)]
    work = [sum(column) for column in zip(*sends, strict=True)]  # what each rank computes
    return {"routed": routed, "kept": kept, "capacity": capacity, "sends": sends,
            "sent_bytes": all_to_all_bytes(sends, d_model, BYTES_PER_VALUE),
            "uniform_sent_bytes": all_to_all_bytes(uniform, d_model, BYTES_PER_VALUE)[0],
            "owners": [list(experts_of_rank(n_experts, ep, r)) for r in range(ep)],
            "busiest_expert": per_expert.index(max(per_expert)),
            "expert_load": max(per_expert) / (sum(per_expert) / n_experts),
            "busiest_rank": work.index(max(work)), "rank_load": max(work) / (sum(work) / ep),
            "leave_share": leaving_share(sends), "uniform_leave_share": leaving_share(uniform)}


def leaving_share(sends: list[list[float]]) -> float:
    """The share of the rows in a send matrix that leave their rank (off the diagonal)."""
    return 1 - sum(row[i] for i, row in enumerate(sends)) / sum(map(sum, sends))


def expert_facts() -> dict:
    cfg, routes = route_batch(MODEL, BATCH, SEQ_LEN)
    settings = {}
    for block, (chosen, _) in routes.items():
        for ep in EP_DEGREES:
            for cf in CAPACITY_FACTORS:
                settings[f"{block}/{ep}/{cf:g}"] = expert_setting(
                    chosen, cfg.n_experts, cfg.top_k, cfg.d_model, ep, cf)
    return {"model": MODEL, "n_experts": cfg.n_experts, "top_k": cfg.top_k,
            "d_model": cfg.d_model, "tokens": BATCH * SEQ_LEN, "blocks": sorted(routes),
            "ep": EP_DEGREES, "capacity_factors": CAPACITY_FACTORS,
            "bytes_per_value": BYTES_PER_VALUE, "colours": RANK_COLOURS, "settings": settings}
