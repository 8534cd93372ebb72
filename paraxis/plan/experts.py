"""Price a mixture of experts under expert parallelism: what an MoE block costs per layer.

What ep changes, and where the facts come from (`paraxis.spec.expert_placement`, the runtime's own
counts, torch-free; nothing is re-derived here):

- Parameters: every block past `first_dense_layers` holds a router, `n_experts` routed experts
  and `n_shared_experts` shared ones. The `ep` ranks of an expert-parallel group split the
  routed experts (E/ep each, `expert_placement.experts_of_rank`); each expert is replicated over the
  dp*cp/ep ranks of its expert-data-parallel group, where its gradients are reduced and ZeRO
  shards its states. Everything else (attention, norms, router, shared experts, dense blocks,
  embedding, head) is replicated over dp*cp as in a dense model. Over tp the router is
  replicated, and so are the experts with the layout's etp = 1: every rank of a TP group
  holds them whole and runs them on the whole sequence, or under SP with dropless routing
  on its own sequence shard (`feed_forward`, `routing_share`); with etp = tp each routed
  and shared expert is split over tp like the dense MLP (1/tp of its parameters, FLOPs and
  hidden activations on each rank).
- Compute: a token passes through the router, its top_k experts and the shared ones, so the
  FLOPs follow the active parameters (`ModelConfig.layer_params(i, active=True)`). The
  busiest EP rank receives `imbalance` x the mean tokens and computes that much expert work;
  the pipeline runs at its pace.
- All-to-all: `expert_placement.ALL_TO_ALLS_PER_BLOCK` (4) per MoE block per microbatch, dispatch
  and combine forward, both again backward, each carrying what `expert_placement.all_to_all_bytes`
  counts for the uniform send matrix (`expert_placement.uniform_send_matrix`, capped by the capacity
  factor) scaled to the busiest rank's load, over the link the EP group spans: EP groups
  are consecutive members of a dp x cp group (`layout.expert_groups`), which sit tp ranks
  apart (cp varies next to tp, then dp), so a group spans ep x tp ranks and stays inside a
  node while that fits in it. The experts wait for their tokens: these all-to-alls block
  (all exposed). A capacity factor caps the busiest rank's load at cf x the mean.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

from paraxis.plan.comm import Link, axis_link, collective_time, group_link, latency_steps, op_time
from paraxis.plan.context import hybrid_group_ranks, replica_link
from paraxis.plan.fp8 import experts_seconds
from paraxis.plan.hardware import Cluster
from paraxis.plan.rates import gemm_efficiency
from paraxis.plan.step_calls import scalar_call_time
from paraxis.spec.errors import ParaxisError
from paraxis.spec.expert_placement import (
    ALL_TO_ALLS_PER_BLOCK,
    all_to_all_bytes,
    experts_of_rank,
    experts_on_sequence_shards,
    send_matrix,
    uniform_send_matrix,
)
from paraxis.spec.grid import first_expert_groups
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import ModelConfig
from paraxis.spec.precision import Precision

# The busiest EP rank's tokens over the mean when no measurement is given: 1.25, the middle
# capacity factor the Switch Transformer benchmarks (Fedus et al. 2022, Sec. 2.2 defines it
# as the headroom above a perfectly balanced share each expert's buffer is sized for; Table 1
# trains at 1.0, 1.25 and 2.0). An assumption, not a measurement: `paraxis plan
# --expert-imbalance` sets it, and `imbalance_of_counts` reads it from a run's per-expert
# token counts.
DEFAULT_IMBALANCE = 1.25


def check_ep(cfg: ModelConfig, layout: Layout) -> None:
    """An ep the model can take: a mixture of experts whose experts split evenly over ep."""
    if layout.ep == 1:
        return
    if not cfg.is_moe:
        raise ParaxisError(f"ep={layout.ep} needs a mixture-of-experts model ({cfg.name} is "
                           "dense); use ep=1 or an MoE model such as mixtral-8x7b")
    experts_of_rank(cfg.n_experts, layout.ep, 0)  # raises the one-line error if E % ep


def imbalance_of_counts(counts: list[list[int]], ep: int) -> float:
    """The busiest EP rank's received (token, expert) rows over the mean, from a run's
    per-expert counts (counts[i][e]: EP rank i's tokens routed to expert e)."""
    sends = send_matrix(counts, ep)
    received = [sum(row[j] for row in sends) for j in range(ep)]
    mean = sum(received) / ep
    return max(received) / mean if mean else 1.0


def feed_forward(cfg: ModelConfig, layout: Layout) -> str:
    """How an MoE block's feed-forward half runs over tp (`comm.tp_collectives_per_layer`'s
    `mlp`): "split" with etp = tp, "shards" where each tp rank runs its own sequence shard
    through whole experts (`expert_placement.experts_on_sequence_shards`), else "whole"."""
    if layout.etp > 1:
        return "split"
    return "shards" if experts_on_sequence_shards(layout.tp, layout.sequence_parallel,
                                                  layout.etp, cfg.capacity_factor) else "whole"


def experts_over_tp(cfg: ModelConfig, layout: Layout) -> str:
    """One sentence on how the tp ranks hold and run the experts (etp), for the defence,
    the report and `paraxis train`'s note ("" without experts or tp)."""
    tp, how = layout.tp, feed_forward(cfg, layout)
    if tp == 1 or not cfg.is_moe:
        return ""
    if how == "split":
        return (f"Each expert is split over the tp={tp} ranks like the dense MLP (etp={tp}): "
                f"1/{tp} of its states and FLOPs on each.")
    if how == "shards":
        return (f"The experts are whole on every tp rank (etp=1), and each of the tp={tp} "
                f"ranks routes only its own sequence shard (SP, dropless): 1/{tp} of their "
                "FLOPs on each, all their states, their gradients summed over tp once a step.")
    why = "a capacity factor gathers the sequence" if layout.sequence_parallel else "no SP"
    return (f"The experts are whole on every tp rank (etp=1): each of the tp={tp} ranks "
            f"repeats their work on the whole sequence ({why}); etp={tp} splits them.")


def routing_share(cfg: ModelConfig, layout: Layout) -> int:
    """By how much fewer tokens a rank routes than its tp group holds of a microbatch: tp
    where each tp rank routes its own sequence shard, else 1 (every rank routes them all)."""
    return layout.tp if feed_forward(cfg, layout) == "shards" else 1


def shard_grad_sum_seconds(cfg: ModelConfig, layout: Layout, cluster: Cluster,
                           moe_blocks: int, experts: float, grad_bytes: float) -> float:
    """Seconds of summing over tp, once a step after the gradient sync, the gradients of
    the router and the shared and routed experts of a rank's `moe_blocks` MoE blocks
    (`experts` routed-expert parameters), where each tp rank runs its own sequence shard
    (`tensor_parallel.partial.sum_partial_grads`): the shards ZeRO leaves each rank, at the
    tp link's bandwidth, in a call per gradient bucket (the first call's latency is
    `step_calls`', the others' here). Nothing overlaps it."""
    if not moe_blocks or feed_forward(cfg, layout) != "shards":
        return 0.0
    replicas = layout.zero_ranks if layout.zero else 1
    size = grad_bytes * (moe_blocks * cfg.moe_replicated_params() / replicas
                         + experts / max(1, replicas // layout.ep))
    link = axis_link(layout, "tp", cluster)
    bucket = cluster.gpu.gradient_bucket_bytes
    calls = math.ceil(size / bucket) if bucket else 1  # 0: one flat call (Megatron's)
    return (op_time("all_reduce", size, layout.tp, link.cost("all_reduce")[0])
            + (calls - 1) * scalar_call_time(layout.tp, link, cluster))


def rank_imbalance(layout: Layout, imbalance: float) -> float:
    """The busiest rank's routed rows over the mean: `imbalance` where expert parallelism
    spreads the experts over ranks, 1 without it (every rank holds every expert and runs
    exactly its tokens' rows)."""
    return imbalance if layout.ep > 1 else 1.0


def busiest_load(cfg: ModelConfig, imbalance: float) -> float:
    """The busiest EP rank's routed rows over the mean of dropless uniform routing: the
    imbalance, capped by the capacity factor where one drops tokens past it."""
    return min(imbalance, cfg.capacity_factor) if cfg.capacity_factor else imbalance


def dispatch_bytes(cfg: ModelConfig, ep: int, tokens: float, value_bytes: int,
                   imbalance: float = 1.0) -> float:
    """Bytes the busiest rank sends to the other EP ranks in one all-to-all of a block, for
    `tokens` tokens per rank: placement's uniform count (capacity-capped) scaled to the
    busiest rank's load."""
    capped = min(1.0, cfg.capacity_factor) if cfg.capacity_factor else 1.0
    return (_uniform_dispatch_bytes(cfg, ep, tokens, value_bytes)
            * busiest_load(cfg, imbalance) / capped)


def measured_all_to_all_bytes(cfg: ModelConfig, counts: list[list[int]], ep: int,
                              value_bytes: int) -> list[int]:
    """Bytes each EP rank sends to the others for one MoE block and microbatch, forward and
    backward together, given the run's per-expert counts (counts[i][e]: EP rank i's rows
    for expert e, what `expert_parallel.AllToAllCounter.dispatched` records). A rank sends
    its own tokens' rows twice (forward dispatch, and backward the gradients of their
    combined outputs) and the rows it received for its experts twice (forward combine,
    backward the gradients of the dispatched inputs): `ALL_TO_ALLS_PER_BLOCK` all-to-alls,
    half of them the transposed send matrix's."""
    sends = send_matrix(counts, ep)
    received = [list(column) for column in zip(*sends, strict=True)]
    half = ALL_TO_ALLS_PER_BLOCK // 2
    return [half * (out + back) for out, back in zip(
        all_to_all_bytes(sends, cfg.d_model, value_bytes),
        all_to_all_bytes(received, cfg.d_model, value_bytes), strict=True)]


@functools.lru_cache(maxsize=4096)  # a layout search asks for the same few thousand times
def _uniform_dispatch_bytes(cfg: ModelConfig, ep: int, tokens: float, value_bytes: int) -> float:
    if ep == 1:
        return 0.0
    sends = uniform_send_matrix(tokens, cfg.top_k, cfg.n_experts, ep, cfg.capacity_factor)
    return max(all_to_all_bytes(sends, cfg.d_model, value_bytes))  # type: ignore[arg-type]


def moe_blocks(cfg: ModelConfig, blocks: list[int] | tuple[int, ...]) -> int:
    """How many of `blocks` (indices) route their tokens to experts."""
    return sum(i >= cfg.first_dense_layers for i in blocks) if cfg.is_moe else 0


class BlockParams(NamedTuple):
    """One block's parameters by how a layout splits them."""

    split: int  # split over tp (attention, norms, a dense MLP)
    router: int  # the MoE block's router: whole on every tp rank
    shared: int  # its shared experts: whole on every tp rank, or split over etp
    experts: int  # routed experts: split over ep (and etp), replicated over the expert-dp group


@functools.lru_cache(maxsize=4096)  # a layout search asks for each block thousands of times
def block_params(cfg: ModelConfig, index: int) -> BlockParams:
    total = cfg.layer_params(index)
    if not cfg.is_moe_layer(index):
        return BlockParams(total, 0, 0, 0)
    experts = cfg.n_experts * cfg.expert_params()
    shared = cfg.n_shared_experts * cfg.expert_params()
    router = cfg.moe_replicated_params() - shared
    return BlockParams(total - experts - shared - router, router, shared, experts)


def local_params(cfg: ModelConfig, blocks: range | list[int], tp: int, ep: int,
                 etp: int = 1) -> tuple[float, float]:
    """(parameters replicated over dp*cp, expert parameters replicated over dp*cp/ep) that
    one rank holds of `blocks`, with the experts split over `etp` (1 or tp)."""
    parts = [block_params(cfg, i) for i in blocks]
    return (sum(p.split / tp + p.router + p.shared / etp for p in parts),
            sum(p.experts for p in parts) / (ep * etp))


def moe_activation_bytes(cfg: ModelConfig, seq_len: int, micro_batch: int,
                         imbalance: float = 1.0, etp: int = 1) -> float:
    """Bytes an MoE block's feed-forward half keeps for backward on one rank for the
    `seq_len` tokens of each sequence it routes (16-bit activations): per routed (token,
    expert) row on the busiest rank, the dispatched input (2h) and SwiGLU's gate, up and
    product (6 f_e / etp: their slice where the experts are split over tp); per token and
    shared expert 6 f_e / etp; the router's fp32 logits and probabilities (8 E), its top-k
    choices (int64) with their fp32 weights (12 k) and the fp32 sums normalising them and
    of the z-loss (8); and per row its tokens send, the combine's (`layer.Combine`): the
    expert's output (2h), its weight (2) and its token's and sort's int64 indices (16)."""
    tokens = seq_len * micro_batch
    rows = tokens * cfg.top_k * busiest_load(cfg, imbalance)
    sent = tokens * cfg.top_k * min(1.0, cfg.capacity_factor or 1.0)
    h, f = cfg.d_model, cfg.d_ff_expert / etp
    router = 8 * cfg.n_experts + 12 * cfg.top_k + 8
    return rows * (2 * h + 6 * f) + sent * (2 * h + 18) \
        + tokens * (cfg.n_shared_experts * 6 * f + router)


def moe_weight_grad_input_values(cfg: ModelConfig, seq_len: int, micro_batch: int,
                                 imbalance: float = 1.0, etp: int = 1) -> float:
    """Values an MoE block's feed-forward half keeps from a split backward's B until its W
    on one rank for the `seq_len` tokens of each sequence it routes (the attention half's:
    `activations.weight_grad_input_values` without its MLP): the output gradient of each
    expert GEMM, per routed (token, expert) row on the busiest rank the gate's and up's
    slices (2 f_e / etp) and the down projection's whole (h), the same per token and shared
    expert, and the router's logits (E)."""
    tokens = seq_len * micro_batch
    rows = tokens * cfg.top_k * busiest_load(cfg, imbalance) + tokens * cfg.n_shared_experts
    return rows * (2 * cfg.d_ff_expert / etp + cfg.d_model) + tokens * cfg.n_experts


def moe_forward_seconds(cfg: ModelConfig, cluster: Cluster, tokens: float, imbalance: float,
                        hbm: float, etp: int = 1, precision: Precision | None = None,
                        ep: int = 1) -> float:
    """Seconds of an MoE block's feed-forward half (router, routed and shared experts) on
    the busiest rank for `tokens` tokens, forward: its GEMMs at the GEMM rate of one GPU
    (each expert's slice of width f_e / etp: whole with etp = 1), its elementwise kernels at
    `hbm` bytes/s (SwiGLU 6 f_e / etp bytes per row, the permutation in and out of expert
    order 8h per row). The GEMMs' efficiency follows their (h, f_e / etp) shape; that each
    expert sees only its share of the rows (fewer for fine-grained experts) is not
    modelled. With an FP8 `precision` the experts run in FP8 (plan/fp8.py), their weights
    cast on each of the `ep` ranks that hold a share; the router stays bf16."""
    gpu = cluster.gpu
    h, f = cfg.d_model, cfg.d_ff_expert / etp
    routed = tokens * cfg.top_k * busiest_load(cfg, imbalance)
    rows = routed + tokens * cfg.n_shared_experts
    peak = gpu.peak_flops * cluster.compute_share
    experts = 2 * rows * cfg.expert_params() / etp / (peak * gemm_efficiency(cluster,
                                                                              min(h, f)))
    if precision is not None and precision.fp8_recipe is not None:
        held = cfg.n_experts / ep + cfg.n_shared_experts
        experts = experts_seconds(cfg, cluster, precision, rows, etp, hbm, held)
    router = 2 * tokens * h * cfg.n_experts / (peak * gemm_efficiency(cluster,
                                                                       min(h, cfg.n_experts)))
    traffic = rows * 6 * f + routed * 8 * h
    return experts + router + traffic / hbm


def ep_link(layout: Layout, cluster: Cluster) -> Link:
    """The link an EP group's all-to-all runs over (the first group stands for all)."""
    return group_link(_first_groups(layout.grid, layout.ep)[0], cluster)


def expert_dp_link(layout: Layout, cluster: Cluster) -> Link:
    """The link the experts' gradient sync runs over: the dp*cp/ep ranks of a dp x cp group
    at the same place in their EP groups; under hybrid sharding, those of one shard group."""
    degrees = layout.grid
    if layout.hybrid:
        return group_link(hybrid_group_ranks(degrees, layout.shard_size, "shard")[::layout.ep],
                          cluster)
    return group_link(_first_groups(degrees, layout.ep)[1], cluster)


@functools.lru_cache(maxsize=1024)  # a search asks for the same few grids thousands of times
def _first_groups(degrees: tuple[tuple[str, int], ...], ep: int
                  ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Rank 0's EP group and its experts' dp group (`grid.first_expert_groups`)."""
    group, replicas = first_expert_groups(dict(degrees), ep)
    return tuple(group), tuple(replicas)


def all_to_all_times(cfg: ModelConfig, layout: Layout, cluster: Cluster, tokens: float,
                     value_bytes: int, imbalance: float) -> dict[str, float]:
    """Seconds of one MoE block's all-to-alls per microbatch on the busiest rank: forward
    (dispatch + combine), backward (their gradients), total. All exposed."""
    if layout.ep == 1:
        return {"forward": 0.0, "backward": 0.0, "total": 0.0}
    size = dispatch_bytes(cfg, layout.ep, tokens, value_bytes, imbalance)
    link = ep_link(layout, cluster)
    if cluster.expert_dispatch == "per_node" and link.crosses_nodes:
        one = per_node_dispatch_time(cfg, size, layout.ep, link)
    else:
        one = collective_time("all_to_all", size, layout.ep, link)
    half = ALL_TO_ALLS_PER_BLOCK // 2
    return {"forward": half * one, "backward": half * one, "total": ALL_TO_ALLS_PER_BLOCK * one}


def routing_calls_seconds(cfg: ModelConfig, layout: Layout, cluster: Cluster) -> float:
    """Seconds of an MoE block's small blocking calls per microbatch forward (`moe.layer`,
    `moe.expert_parallel`): the routing counts all-reduced over the dp x cp ranks sharing the
    microbatch step, and over tp where each tp rank routes its own sequence shard; with
    ep > 1 the counts each rank sends each rank (an all-to-all of E integers). Each costs
    its latency (`step_calls.scalar_call_time`)."""
    seconds, replicas = 0.0, layout.dp * layout.cp
    if replicas > 1:
        seconds += scalar_call_time(replicas, replica_link(layout, cluster), cluster)
    if routing_share(cfg, layout) > 1:
        seconds += scalar_call_time(layout.tp, axis_link(layout, "tp", cluster), cluster)
    if layout.ep > 1:
        seconds += scalar_call_time(layout.ep, ep_link(layout, cluster), cluster)
    return seconds


def with_routing_calls(cfg: ModelConfig, layout: Layout, cluster: Cluster,
                       times: dict[str, float]) -> dict[str, float]:
    """An MoE block's `layer_times` with its routing's small calls (`routing_calls_seconds`)
    added to its exposed EP time: forward, and again in the backward where a full
    recomputation reruns the forward. Apart from the rest of the block because they alone
    read the dp degree (they sum over the dp x cp ranks): a search prices the rest once for
    every dp and pp."""
    calls = routing_calls_seconds(cfg, layout, cluster)
    rerun = layout.recompute == "full"
    return {**times, "ep_forward": times["ep_forward"] + calls,
            "ep_backward": times["ep_backward"] + rerun * calls,
            "ep_total": times["ep_total"] + (1 + rerun) * calls}


def sequence_shard_dispatch(cfg: ModelConfig, layout: Layout, cluster: Cluster) -> bool:
    """Whether each tp rank sends only its sequence shard over the expert all-to-all
    (`Cluster.expert_tp_dispatch` "sequence_shard": experts split over tp under SP)."""
    return (cluster.expert_tp_dispatch == "sequence_shard" and layout.ep > 1 and layout.tp > 1
            and layout.sequence_parallel and feed_forward(cfg, layout) == "split")


def shard_dispatch_times(cfg: ModelConfig, layout: Layout, cluster: Cluster, tokens: float,
                         value_bytes: int, imbalance: float, tp_link: Link,
                         boundary_bytes: float) -> dict[str, float]:
    """An MoE block's exposed calls per microbatch under Megatron-Core's all-to-all dispatcher
    with experts split over tp under SP (`sequence_shard_dispatch`): each tp rank routes its
    own 1/tp of the `tokens` and sends them over the expert all-to-all, then the dispatched
    rows are all-gathered within the TP group (over NVLink while it fits in a node) and,
    after the experts, reduce-scattered back (MoEAlltoAllTokenDispatcher's
    gather_from_sequence_parallel_region and reduce_scatter_to_sequence_parallel_region);
    backward their conjugates. Those TP calls take the place of the dense MLP half's SP
    all-gather and reduce-scatter of the tokens (`boundary_bytes`, priced with the layer's
    TP collectives), so only what they move beyond those is added here."""
    times = all_to_all_times(cfg, layout, cluster, tokens / layout.tp, value_bytes, imbalance)
    rows = boundary_bytes * cfg.top_k * busiest_load(cfg, imbalance)
    extra = sum(collective_time(op, rows, layout.tp, tp_link)
                - collective_time(op, boundary_bytes, layout.tp, tp_link)
                for op in ("all_gather", "reduce_scatter"))
    return {"forward": times["forward"] + extra, "backward": times["backward"] + extra,
            "total": times["total"] + 2 * extra}


def remote_nodes_per_token(cfg: ModelConfig, nodes: int) -> float:
    """Other nodes a token's top_k distinct experts sit on, expected under uniform routing
    over `nodes` nodes holding n_experts / nodes experts each: (nodes - 1) x P(a given node
    holds at least one) = (nodes - 1) x (1 - C(E - E/N, k) / C(E, k)).

    Group-limited routing whose groups are the nodes (route_groups == nodes: the experts of
    a group are one node's, as placement's contiguous blocks make them) sends a token to at
    most route_group_limit nodes (DeepSeek-V3 Sec. 2.1.2: 4 of 8): priced at that bound,
    each of them another node with probability (nodes - 1) / nodes, where that is fewer."""
    experts, k = cfg.n_experts, cfg.top_k
    elsewhere = experts - experts / nodes
    miss = 1.0
    for i in range(k):  # C(E - E/N, k) / C(E, k) as a product
        miss *= max(0.0, elsewhere - i) / (experts - i)
    uniform = (nodes - 1) * (1 - miss)
    if cfg.route_groups == nodes > 1 and cfg.route_group_limit:
        return min(uniform, cfg.route_group_limit * (nodes - 1) / nodes)
    return uniform


def per_node_dispatch_time(cfg: ModelConfig, size_bytes: float, ep: int, link: Link) -> float:
    """Seconds of one all-to-all across nodes that sends a token once to each other node
    holding any of its experts (`Cluster.expert_dispatch = "per_node"`, DeepEP), where
    `size_bytes` is what sending every (token, expert) row to the other ranks moves.

    The network leg carries one row per (token, remote node) instead of one per (token,
    remote expert), on each member's rail; the NVLink leg the rows for the node's other
    ranks plus those a receiving GPU forwards to its node-mates. The slower leg sets the
    time, as for the per-row all-to-all (comm.collective_time). A group that spans nodes
    unevenly is priced as if each held `link.per_node` members, as the per-row path does."""
    per_node = link.per_node
    rows_per_token = cfg.top_k * (ep - 1) / ep  # off-rank rows under uniform routing
    remote_rows = size_bytes * (ep - per_node) / (ep - 1)
    network = size_bytes * remote_nodes_per_token(cfg, link.nodes) / rows_per_token
    nvlink = (size_bytes - remote_rows) + remote_rows * (per_node - 1) / per_node
    return (link.call_latency_s + latency_steps("all_to_all", ep) * link.latency_s
            + max(network / link.rail_Bps, nvlink / link.intra_bandwidth_Bps))
