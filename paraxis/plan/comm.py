"""Communication cost: alpha-beta collectives over the links a group actually spans.

alpha = per-step latency, beta = 1 / bandwidth (Hockney 1994). A group inside one node rides
NVLink; a group that crosses nodes is limited by the network. Bandwidths are per GPU, one way,
scaled by the GPU's `link_efficiency` (achieved NCCL bus bandwidth / link bandwidth). Where a
calibration measured a collective for the group's size on a node as full as this one
(`Cluster.collectives`), its fitted alpha and bandwidth price that collective instead.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import NamedTuple

from paraxis.plan.hardware import GPU, Cluster
from paraxis.plan.rates import layer_rates
from paraxis.plan.sync_wait import nearest_count, sync_wait
from paraxis.plan.zero3 import Zero3Kept, Zero3Layer, zero3_pipeline_volume, zero3_volume
from paraxis.spec.collectives import reduce_scatter_form, zero_form
from paraxis.spec.errors import ParaxisError
from paraxis.spec.grid import grid_rank, node_of
from paraxis.spec.layout import Layout
from paraxis.spec.units import DEFAULT_BUCKET_BYTES

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "send_recv", "all_to_all")


class Link(NamedTuple):
    bandwidth_Bps: float  # achieved by a ring over the group (after link_efficiency)
    latency_s: float  # per ring step
    crosses_nodes: bool
    # (op, alpha_s, bandwidth_Bps) fitted by a calibration for this group (paraxis calibrate)
    measured: tuple[tuple[str, float, float], ...] = ()
    # Across nodes: the group's shape, what one member's rail (NIC share) achieves, the
    # cross-node algorithm, and the intra-node leg a hierarchical collective runs first.
    nodes: int = 1
    per_node: int = 1
    rail_Bps: float = 0.0
    algorithm: str = "ring"
    intra_bandwidth_Bps: float = 0.0
    intra_latency_s: float = 0.0
    call_latency_s: float = 0.0  # fixed cost of every collective call (launch, sync)
    datasheet_Bps: float = 0.0  # the ring's bandwidth before link_efficiency
    # CPU ranks: the group runs gloo's host-side algorithms, where other collectives carry
    # reduce-scatters and ZeRO's gathers (spec.collectives; `scatter_time`, `zero_time`)
    through_host: bool = False
    # what one rank adds arrays at, bytes/s (memory-bound, its share of a core): the host-side
    # reduce-scatter's sum; 0 where the collective sums in flight (NCCL)
    sum_Bps: float = 0.0

    def cost(self, op: str) -> tuple[float, float]:
        """(bandwidth_Bps, latency_s) that `op` sees on this link (a flat ring)."""
        for name, alpha, bandwidth in self.measured:
            if name == op:
                return bandwidth, alpha
        return self.bandwidth_Bps, self.latency_s


def ring_factor(op: str, n: int) -> float:
    """Bytes each rank sends per byte of the message (X: the full tensor)."""
    if op == "all_reduce":
        # Patarasuk & Yuan 2009 (ring): reduce-scatter + all-gather, 2(N-1) steps of X/N.
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter"):
        return (n - 1) / n  # Thakur et al. 2005: N-1 steps of X/N
    if op == "send_recv":
        return 1.0  # one message over one link
    if op == "all_to_all":
        # X is what the rank sends to the others (spec/expert_placement.all_to_all_bytes counts it);
        # NCCL's all-to-all posts every pair's send at once (Thakur et al. 2005, pairwise)
        return 1.0
    raise ParaxisError(f"unknown collective {op!r}; use one of {', '.join(COLLECTIVES)}")


# Ring steps per call, each paying one latency (alpha): (per rank beyond one, fixed)
_STEPS = {"all_reduce": (2, 0), "all_gather": (1, 0), "reduce_scatter": (1, 0),
          "send_recv": (0, 1), "all_to_all": (1, 0)}


def latency_steps(op: str, n: int) -> int:
    """Ring steps, each paying one latency (alpha)."""
    steps = _STEPS.get(op)
    if steps is None:
        ring_factor(op, n)  # rejects an unknown op with the one-line message
    per_rank, fixed = steps
    return per_rank * (n - 1) + fixed


def op_time(op: str, size_bytes: float, n: int, bandwidth_Bps: float,
            latency_s: float = 0.0) -> float:
    """alpha-beta time of one collective: steps * alpha + factor * X / bandwidth."""
    if op != "send_recv" and n <= 1:
        return 0.0
    return (latency_steps(op, n) * latency_s
            + ring_factor(op, n) * size_bytes / bandwidth_Bps)


def ring_all_reduce_time(size_bytes: float, n: int, bandwidth_Bps: float,
                         latency_s: float = 0.0) -> float:
    return op_time("all_reduce", size_bytes, n, bandwidth_Bps, latency_s)


def all_gather_time(size_bytes: float, n: int, bandwidth_Bps: float,
                    latency_s: float = 0.0) -> float:
    return op_time("all_gather", size_bytes, n, bandwidth_Bps, latency_s)


def reduce_scatter_time(size_bytes: float, n: int, bandwidth_Bps: float,
                        latency_s: float = 0.0) -> float:
    return op_time("reduce_scatter", size_bytes, n, bandwidth_Bps, latency_s)


def p2p_time(size_bytes: float, bandwidth_Bps: float, latency_s: float = 0.0) -> float:
    return op_time("send_recv", size_bytes, 2, bandwidth_Bps, latency_s)


def group_ranks(layout: Layout, axis: str) -> list[int]:
    """The ranks of rank 0's group along `axis`, from the Layout's rank grid (all groups of an
    axis have the same shape, so one stands for all): rank 0 moved along that axis alone."""
    return list(_axis_ranks(layout.grid, axis))


@functools.lru_cache(maxsize=4096)
def _axis_ranks(degrees: tuple[tuple[str, int], ...], axis: str) -> tuple[int, ...]:
    # a search asks for the same few grids thousands of times
    return tuple(grid_rank(dict(degrees), {axis: index}) for index in range(dict(degrees)[axis]))


def measured_fits(cluster: Cluster, group_size: int) -> tuple[tuple[str, float, float], ...]:
    """Calibrated (op, alpha_s, bandwidth_Bps) for a group of `group_size` inside a node with
    `cluster.gpus_per_node` ranks: the fit measured nearest to both counts, per op."""
    fits = []
    for op, by_world in sorted(cluster.collectives.items()):
        if not by_world:
            continue
        by_group = by_world[nearest_count(list(by_world), cluster.gpus_per_node)]
        if by_group:
            fit = by_group[nearest_count(list(by_group), group_size)]
            fits.append((op, float(fit["alpha_s"]), float(fit["bandwidth_Bps"])))
    return tuple(fits)


# A search prices thousands of layouts on one cluster, asking for the same few groups'
# links again and again: (id of the cluster, ranks) -> (that cluster, its link). The entry
# holds the cluster itself, so its id cannot be reused while the entry lives.
_LINKS: dict[tuple[int, tuple[int, ...]], tuple[Cluster, Link]] = {}


def group_link(ranks: Sequence[int], cluster: Cluster) -> Link:
    """Bandwidth and latency a collective over `ranks` sees."""
    key = (id(cluster), ranks if isinstance(ranks, tuple) else tuple(ranks))
    hit = _LINKS.get(key)
    if hit is not None and hit[0] is cluster:
        return hit[1]
    if len(_LINKS) >= 4096:
        _LINKS.clear()
    link = _group_link(key[1], cluster)
    _LINKS[key] = (cluster, link)
    return link


def _group_link(ranks: tuple[int, ...], cluster: Cluster) -> Link:
    # a search asks this of thousands of groups, some of thousands of ranks: a group whose
    # lowest and highest ranks share a node (as a TP group does) is read off those two
    low, high = cluster.node_of(min(ranks)), cluster.node_of(max(ranks))
    nodes = 1 if low == high else _nodes_spanned(tuple(ranks), cluster.gpus_per_node)
    gpu, efficiency = cluster.gpu, cluster.gpu.link_efficiency
    host = bool(cluster.cores_per_node)
    sums = layer_rates(cluster, 1)[2] if host else 0.0  # a rank's elementwise rate
    if nodes == 1:
        return Link(gpu.nvlink_bandwidth_Bps * efficiency, cluster.intra_node_latency_s,
                    False, measured_fits(cluster, len(ranks)) if len(ranks) > 1 else (),
                    call_latency_s=cluster.collective_latency_s + sync_wait(cluster, len(ranks)),
                    datasheet_Bps=gpu.nvlink_bandwidth_Bps, through_host=host, sum_Bps=sums)
    # Rails: every group of an axis runs its collective at once (the DP groups of all TP
    # ranks, say), so the node's NICs are shared by all its GPUs: each has min(1, NICs /
    # GPUs per node) of one NIC, whatever group it is in. NCCL runs one ring per NIC, so a
    # group's k members of a node move k such shares per node, never more than NVLink, and
    # a member's own share is its rail in a hierarchical collective. (With a NIC per GPU, as
    # on a DGX, every member has its own.)
    per_node = max(1, len(ranks) // nodes)
    nics = cluster.nics_per_node or cluster.gpus_per_node
    nic = cluster.inter_node_bandwidth_Bps
    share = nic * min(1.0, nics / cluster.gpus_per_node)  # one GPU's part of the NICs
    ring = min(per_node * share, gpu.nvlink_bandwidth_Bps)
    return Link(ring * efficiency, cluster.inter_node_latency_s, True, (), nodes,
                per_node, share * efficiency,
                cluster.collective_algorithm, gpu.nvlink_bandwidth_Bps * efficiency,
                cluster.intra_node_latency_s, cluster.collective_latency_s, ring, host, sums)


@functools.lru_cache(maxsize=4096)
def _nodes_spanned(ranks: tuple[int, ...], gpus_per_node: int) -> int:
    return len({node_of(rank, gpus_per_node) for rank in ranks})


def axis_link(layout: Layout, axis: str, cluster: Cluster) -> Link:
    return group_link(_axis_ranks(layout.grid, axis), cluster)


def tp_collectives_per_layer(sequence_parallel: bool,
                             mlp: str = "split") -> dict[str, dict[str, int]]:
    """Collectives one transformer layer issues over its TP group, per pass.

    Without SP (Shoeybi et al. 2019 Sec. 3): forward all-reduces after attention and after the
    MLP (the g operators), backward the two conjugate f operators. With SP (Korthikanti et al.
    2022 Sec. 4.2.2) each all-reduce becomes an all-gather + reduce-scatter pair. `mlp`: the
    feed-forward half split over tp ("split": a dense MLP, experts with etp = tp), whole on
    every rank ("whole": experts with etp = 1; its only collective is SP's all-gather, of its
    input forward and of its output's gradient backward), or whole on each rank's sequence
    shard ("shards": `spec.expert_placement.experts_on_sequence_shards`; its only call over tp
    sums the routing counts: `experts.routing_calls_seconds`)."""
    gather, scatter = {"split": (1, 1), "whole": (1, 0), "shards": (0, 0)}[mlp]
    if sequence_parallel:
        per_pass = {"all_reduce": 0, "all_gather": 1 + gather, "reduce_scatter": 1 + scatter}
    else:
        per_pass = {"all_reduce": 1 + scatter, "all_gather": 0, "reduce_scatter": 0}
    return {"forward": dict(per_pass), "backward": dict(per_pass)}


def collective_time(op: str, size_bytes: float, n: int, link: Link, calls: int = 1) -> float:
    """Seconds of `calls` collectives `op` (all_reduce, all_gather, reduce_scatter,
    send_recv, all_to_all) moving `size_bytes` in all over a group of n on `link`: the bytes at the
    link's bandwidth, each call paying its fixed latency and its algorithm's step latencies.

    Across nodes "ring" is one flat ring over all n (NCCL's default for large messages:
    2(n-1) latencies per all-reduce); "hierarchical" first runs the op inside each node over
    NVLink, then across the N nodes on each member's rail with 1/k of the bytes, then inside
    again (Jia et al. 2018; 2(k-1) + 2(N-1) latencies), the same bytes in far fewer steps.
    """
    if op != "send_recv" and n <= 1:
        return 0.0
    fixed = calls * link.call_latency_s
    if op == "all_to_all" and link.crosses_nodes:
        # A rank's sends to its node's members ride NVLink, the rest its own NIC share
        # (the rail) at once: the slower of the two parts sets the time.
        off_node = size_bytes * (n - link.per_node) / (n - 1)
        return fixed + calls * latency_steps(op, n) * link.latency_s + max(
            off_node / link.rail_Bps, (size_bytes - off_node) / link.intra_bandwidth_Bps)
    if (link.crosses_nodes and link.algorithm == "hierarchical" and op != "send_recv"
            and link.per_node > 1 and link.nodes > 1):
        k, nodes = link.per_node, link.nodes
        intra = op_time(op, size_bytes, k, link.intra_bandwidth_Bps) \
            + calls * latency_steps(op, k) * link.intra_latency_s
        inter = op_time(op, size_bytes / k, nodes, link.rail_Bps) \
            + calls * latency_steps(op, nodes) * link.latency_s
        return fixed + intra + inter
    bandwidth, latency = link.cost(op)
    return fixed + op_time(op, size_bytes, n, bandwidth) + calls * latency_steps(op, n) * latency


def leaving(all_to_all_input: float, n: int) -> float:
    """Bytes of an all-to-all's input that leave the rank: it keeps 1/n of it."""
    return all_to_all_input * (n - 1) / n


def scatter_time(size_bytes: float, n: int, link: Link) -> float:
    """Seconds of a reduce-scatter of activations (SP's, the all-gather CP's dK/dV) of
    `size_bytes` in over a group of n, as the runtime carries it on `link`
    (`spec.collectives.reduce_scatter_form`): a reduce-scatter, or an all-to-all of the
    (n-1)/n bound for the other ranks, whose owners add what they receive: a copy of the
    first of its n parts and n - 1 additions into it (`dist.collectives.SummedInto`), (3n -
    1) parts' bytes through memory at `Link.sum_Bps`."""
    if reduce_scatter_form(link.through_host) == "all_to_all":
        summed = size_bytes * (3 * n - 1) / n / link.sum_Bps if link.sum_Bps and n > 1 else 0.0
        return collective_time("all_to_all", leaving(size_bytes, n), n, link) + summed
    return collective_time("reduce_scatter", size_bytes, n, link)


def zero_time(op: str, size_bytes: float, n: int, link: Link, calls: int = 1) -> float:
    """Seconds of `calls` of ZeRO's `op` ("reduce_scatter" of gradients, "all_gather" of
    parameters) on flat buffers of `size_bytes` in all over a group of n, as the runtime
    carries them on `link` (`spec.collectives.zero_form`): `op` itself, or an all-reduce of
    the whole buffer in place."""
    return collective_time(zero_form(op, link.through_host), size_bytes, n, link, calls)


# One data-parallel step's collectives by ZeRO stage, each (op, the state it moves): ZeRO
# (Rajbhandari et al. 2020) Sec. 7: stages 0-2 move the gradients and parameters once (2P),
# ZeRO-3 gathers the parameters twice, for the forward and for the backward (3P: 1.5x).
ZERO_STEP_COLLECTIVES = {
    0: (("all_reduce", "grads"),),
    1: (("reduce_scatter", "grads"), ("all_gather", "params")),
    2: (("reduce_scatter", "grads"), ("all_gather", "params")),
    3: (("all_gather", "params"), ("all_gather", "params"), ("reduce_scatter", "grads")),
}


def zero_traffic_bytes(num_params: float, n: int, zero: int, grad_bytes: float = 2,
                       param_bytes: float = 2) -> float:
    """Bytes each of `n` data-parallel GPUs sends in one step of one microbatch, ring
    algorithms (`ring_factor`): the course's "ZeRO-3 adds 1.5x the communication of ZeRO-1".
    `dp_sync_time` prices the same collectives, with buckets, microbatches and latency."""
    size = {"grads": num_params * grad_bytes, "params": num_params * param_bytes}
    return sum(ring_factor(op, n) * size[state] for op, state in ZERO_STEP_COLLECTIVES[zero])


def dp_sync_time(stage_param_count: float, dp: int, zero: int, link: Link,
                 microbatches: int = 1, grad_bytes: float = 2, param_bytes: float = 2,
                 layers: int = 1, bucket_bytes: float = DEFAULT_BUCKET_BYTES,
                 zero3_reshard: str | None = None, pipelined: bool = False,
                 copies: int = 1, across: Link | None = None,
                 regather_bytes: float | None = None, kept: Zero3Kept | None = None) -> float:
    """Seconds per step to synchronise one stage's gradients (and parameters) over DP.

    ZeRO (Rajbhandari et al. 2020) Sec. 7: ZeRO-0/1 move 2 x the parameter bytes per GPU
    (ZeRO-0 an all-reduce; ZeRO-1 a reduce-scatter of the gradients and an all-gather of the
    updated parameters, as the runtime does); ZeRO-3 moves 3 x (two all-gathers of the
    parameters, forward and backward, plus the gradient reduce-scatter), one layer at a time.
    Sharded gradients (ZeRO-2/3) are not kept whole between microbatches, so their
    reduce-scatter (and ZeRO-3's gathers) repeat for every microbatch (Sec. 5.2-5.3; the
    runtime's `data_parallel/buckets.py`, as DeepSpeed and PyTorch FSDP do by default).
    Gradients travel in `bucket_bytes` buckets (PyTorch DDP, Li et al. 2020 Sec. 3.2.3): one
    call per bucket; `bucket_bytes` = 0: one call per layer (PyTorch FSDP's units).
    `pipelined`: under a pipeline (pp > 1) a stage accumulates its gradients whole and
    reduces them once per step, ZeRO-2 as ZeRO-1 (`pipeline_parallel/engine.py`);
    zero3_reshard: ZeRO-3 under a pipeline, whose gathers follow that choice
    (`zero3_pipeline_volume`).
    Hybrid sharding: `dp` is one shard group, and each rank's summed gradient shard (1/dp
    of the stage's) is then all-reduced over its `copies` on the `across` link, once a step
    (`data_parallel/buckets.py`; PyTorch HSDP, DeepSpeed ZeRO++'s hpZ).
    regather_bytes: ZeRO-3's backward gather, bytes per parameter (default `param_bytes`;
    less where FP8 weights are not gathered again: `fp8.regather_bytes_per_param`).
    kept: ZeRO-3's parameters gathered for the forward only (`Zero3Kept`).
    """
    return (copies_sync_time(stage_param_count, dp, zero, copies, across, grad_bytes, layers,
                             bucket_bytes)
            + _shard_group_sync(stage_param_count, dp, zero, link, microbatches, grad_bytes,
                                param_bytes, layers, bucket_bytes, zero3_reshard, pipelined,
                                param_bytes if regather_bytes is None else regather_bytes,
                                kept or Zero3Kept()))


def copies_sync_time(stage_param_count: float, dp: int, zero: int, copies: int,
                     across: Link | None, grad_bytes: float = 2, layers: int = 1,
                     bucket_bytes: float = DEFAULT_BUCKET_BYTES) -> float:
    """Hybrid sharding: seconds per step of the all-reduce of each rank's gradient shard
    (1/dp of the stage's, dp the shard group's size) over its `copies` on `across`, a call
    per bucket (ZeRO-3: per layer); 0 without hybrid sharding."""
    if copies <= 1 or across is None:
        return 0.0
    grads = stage_param_count * grad_bytes
    calls = layers if bucket_bytes <= 0 or zero == 3 else max(1, math.ceil(grads / bucket_bytes))
    return collective_time("all_reduce", grads / dp, copies, across, calls)


def _shard_group_sync(stage_param_count: float, dp: int, zero: int, link: Link,
                      microbatches: int, grad_bytes: float, param_bytes: float, layers: int,
                      bucket_bytes: float, zero3_reshard: str | None, pipelined: bool,
                      regather_bytes: float, kept: Zero3Kept) -> float:
    if dp <= 1:
        return 0.0
    if zero == 3 and zero3_reshard is not None:
        volume = zero3_pipeline_volume(stage_param_count, microbatches, zero3_reshard,
                                       param_bytes, grad_bytes, kept.once, kept.regathered,
                                       regather_bytes)
        gathers = 1 if zero3_reshard == "step" else 2 * microbatches  # passes over the stage
        return (zero_time("all_gather", volume["all_gather"], dp, link, gathers * layers)
                + zero_time("reduce_scatter", volume["reduce_scatter"], dp, link, layers))
    if zero == 3:
        volume = zero3_volume(stage_param_count, microbatches, kept, param_bytes, grad_bytes,
                              regather_bytes)
        return (zero_time("all_gather", volume["all_gather"], dp, link,
                          2 * microbatches * layers)
                + zero_time("reduce_scatter", volume["reduce_scatter"], dp, link,
                            microbatches * layers))
    grads = stage_param_count * grad_bytes
    params = stage_param_count * param_bytes
    buckets = layers if bucket_bytes <= 0 else max(1, math.ceil(grads / bucket_bytes))
    if zero in (1, 2):
        # reduce-scatter the gradients (ZeRO-1: once, accumulated; ZeRO-2: every microbatch,
        # once under a pipeline), then all-gather the updated parameters
        scatters = microbatches if zero == 2 and not pipelined else 1
        return (scatters * zero_time("reduce_scatter", grads, dp, link, buckets)
                + zero_time("all_gather", params, dp, link))
    return collective_time("all_reduce", grads, dp, link, buckets)


# Megatron-Core's DDP default (DistributedDataParallelConfig.bucket_size): max(40M, 1M x dp)
# parameters a bucket, "larger DP sizes need larger buckets to ensure collectives do not
# become latency-bound".
MEGATRON_BUCKET_PARAMS, MEGATRON_BUCKET_PARAMS_PER_RANK = 40e6, 1e6


def gradient_bucket_bytes(gpu: GPU, dp: int, grad_bytes: float) -> float:
    """Bytes of one gradient bucket over `dp` ranks by the runtime's rule
    (`GPU.gradient_bucket_rule`): "fixed", `GPU.gradient_bucket_bytes` (0: one per layer);
    "megatron", Megatron-Core's max(40M, 1M x dp) parameters."""
    if gpu.gradient_bucket_rule == "megatron":
        return max(MEGATRON_BUCKET_PARAMS, MEGATRON_BUCKET_PARAMS_PER_RANK * dp) * grad_bytes
    return gpu.gradient_bucket_bytes


def param_gather_time(stage_param_count: float, dp: int, zero: int, link: Link,
                      param_bytes: float = 2) -> float:
    """Seconds of ZeRO-1/2's all-gather of the updated parameters after the optimizer step
    (part of `dp_sync_time`): it cannot overlap the backward that came before it, only the
    next step's forward where the runtime starts it there (GPU.param_gather_overlap)."""
    if zero not in (1, 2) or dp <= 1:
        return 0.0
    return zero_time("all_gather", stage_param_count * param_bytes, dp, link)


def last_bucket_time(stage_param_count: float, dp: int, zero: int, link: Link,
                     grad_bytes: float = 2, layers: int = 1,
                     bucket_bytes: float = DEFAULT_BUCKET_BYTES) -> float:
    """Seconds of the last gradient bucket's reduction (ZeRO-0: all-reduce; 1/2:
    reduce-scatter): a bucket is reduced once its last gradient is computed, so the last one
    (the first layers' gradients) starts only when the backward ends and is never hidden
    (Li et al. 2020, PyTorch DDP, Sec. 3.2.3 and Fig. 7: larger buckets, fewer calls, a
    longer tail). `bucket_bytes` 0: one layer's gradients."""
    if dp <= 1 or zero == 3:
        return 0.0
    grads = stage_param_count * grad_bytes
    size = grads / layers if bucket_bytes <= 0 else min(grads, bucket_bytes)
    if zero == 0:
        return collective_time("all_reduce", size, dp, link)
    return zero_time("reduce_scatter", size, dp, link)


def zero3_layer_times(layer_params: float, dp: int, link: Link, grad_bytes: float = 2,
                      param_bytes: float = 2, regather_bytes: float | None = None,
                      kept: Zero3Kept | None = None, layers: int = 1) -> Zero3Layer:
    """Seconds of one layer's ZeRO-3 traffic per microbatch (Rajbhandari et al. 2020 Sec.
    5.3): the forward gathers its parameters; the backward gathers them again
    (`regather_bytes` a parameter, default `param_bytes`) but for what the runtime keeps
    (`kept`, a stage of `layers` layers: `Zero3Kept`), and reduce-scatters their gradients;
    a split backward's W gathers `kept.regathered` again."""
    kept = kept or Zero3Kept()
    again_bytes = param_bytes if regather_bytes is None else regather_bytes
    return Zero3Layer(
        zero_time("all_gather", layer_params * param_bytes, dp, link),
        zero_time("all_gather", layer_params * again_bytes
                  - kept.once / layers * kept.param_bytes, dp, link),
        zero_time("reduce_scatter", layer_params * grad_bytes, dp, link),
        zero_time("all_gather", kept.regathered / layers * again_bytes, dp, link))
