"""Alpha-beta collectives, the links a group spans, and TP collective counts."""

import pytest

from paraxis.plan.comm import (
    Link,
    all_gather_time,
    axis_link,
    dp_sync_time,
    p2p_time,
    reduce_scatter_time,
    ring_all_reduce_time,
    tp_collectives_per_layer,
)
from paraxis.plan.hardware import build_cluster
from paraxis.plan.tp_layer import tp_layer_exposed_time, tp_layer_time
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import Layout


def test_seeds_ring_all_reduce_example() -> None:
    # N = 8, X = 2 GB, B = 25 GB/s: 2 * 7 * 2 / (8 * 25) = 0.14 s; 12.5 GB/s doubles it.
    assert ring_all_reduce_time(2e9, 8, 25e9) == pytest.approx(0.14)
    assert ring_all_reduce_time(2e9, 8, 12.5e9) == pytest.approx(0.28)


def test_collective_building_blocks() -> None:
    assert ring_all_reduce_time(1e9, 1, 1e9) == 0.0
    # an all-reduce is a reduce-scatter followed by an all-gather
    assert ring_all_reduce_time(1e9, 4, 1e9, 1e-5) == pytest.approx(
        reduce_scatter_time(1e9, 4, 1e9, 1e-5) + all_gather_time(1e9, 4, 1e9, 1e-5))
    assert p2p_time(1e9, 1e9, 1e-3) == pytest.approx(1.001)


def test_tp_collectives_per_layer() -> None:
    plain = tp_collectives_per_layer(False)
    sp = tp_collectives_per_layer(True)
    assert plain["forward"] == {"all_reduce": 2, "all_gather": 0, "reduce_scatter": 0}
    assert plain["backward"] == plain["forward"]
    assert sp["forward"] == {"all_reduce": 0, "all_gather": 2, "reduce_scatter": 2}
    assert sp["backward"] == sp["forward"]
    # SP moves the same bytes as the all-reduces it replaces, plus Megatron's two re-gathers
    # of the sequence-sharded inputs it stored (Korthikanti et al. 2022 Sec. 4.2.2)
    link = Link(100e9, 0.0, False)
    assert tp_layer_time(1e8, 8, False, link) == pytest.approx(4 * ring_all_reduce_time(1e8, 8,
                                                                                      100e9))
    assert tp_layer_time(1e8, 8, True, link) == pytest.approx(
        tp_layer_time(1e8, 8, False, link) + 2 * all_gather_time(1e8, 8, 100e9))
    # full recomputation reruns the forward's collectives
    assert tp_layer_time(1e8, 8, False, link, passes=3) == pytest.approx(
        6 * ring_all_reduce_time(1e8, 8, 100e9))


def test_backward_tp_collectives_hide_behind_gradient_gemms() -> None:
    link = Link(100e9, 0.0, False)
    all_reduce = ring_all_reduce_time(1e8, 8, 100e9)
    gather = all_gather_time(1e8, 8, 100e9)
    wide = (1.0, 1.0)  # weight-gradient GEMMs far longer than any collective
    # forward: 2 all-reduces block; backward: both hide, only contention is paid
    assert tp_layer_exposed_time(1e8, 8, False, link, wide) == pytest.approx((2 * all_reduce, 0))
    assert tp_layer_exposed_time(1e8, 8, False, link, wide, contention=0.2)[1] == \
        pytest.approx(0.2 * 2 * all_reduce)
    # SP: the all-gathers of the row-parallel gradients stay exposed, the rest hides
    forward, backward = tp_layer_exposed_time(1e8, 8, True, link, wide)
    assert forward == pytest.approx(4 * gather) and backward == pytest.approx(2 * gather)
    # a GEMM shorter than its collective leaves the difference exposed
    short = (0.25 * all_reduce, 0.25 * all_reduce)
    assert tp_layer_exposed_time(1e8, 8, False, link, short)[1] == pytest.approx(1.5 * all_reduce)
    # without overlap the whole backward is exposed; tp = 1 has nothing to send
    assert tp_layer_exposed_time(1e8, 8, True, link, wide, overlap=False)[1] == pytest.approx(
        4 * gather + 2 * reduce_scatter_time(1e8, 8, 100e9))
    assert tp_layer_exposed_time(1e8, 1, False, link, wide) == (0.0, 0.0)


def test_groups_use_the_links_they_span() -> None:
    cluster = build_cluster("a100-80gb", 64, 8)
    inside = Layout(dp=2, tp=8, pp=4)
    assert not axis_link(inside, "tp", cluster).crosses_nodes
    assert axis_link(inside, "pp", cluster).crosses_nodes
    assert axis_link(inside, "dp", cluster).crosses_nodes
    nvlink = cluster.gpu.nvlink_bandwidth_Bps * cluster.gpu.link_efficiency
    assert axis_link(inside, "tp", cluster).bandwidth_Bps == pytest.approx(nvlink)
    # a TP group of 16 crosses nodes: 8 members per node drive the node's 8 NICs, and every
    # step pays the network's latency
    link = axis_link(Layout(dp=4, tp=16, pp=1), "tp", cluster)
    assert link.crosses_nodes and link.latency_s == cluster.inter_node_latency_s
    assert link.bandwidth_Bps == pytest.approx(8 * 25e9 * cluster.gpu.link_efficiency)
    # a DP group with one member per node gets a single NIC: a tenth of NVLink
    one_nic = axis_link(inside, "dp", cluster).bandwidth_Bps
    assert one_nic == pytest.approx(25e9 * cluster.gpu.link_efficiency) and one_nic < nvlink / 8
    # with tp = 1 a DP group of 8 stays inside the node
    assert not axis_link(Layout(dp=8, tp=1, pp=8), "dp", cluster).crosses_nodes


def test_dp_sync_volume_by_zero_stage() -> None:
    link = Link(10e9, 0.0, True)
    params = 1e9
    base = dp_sync_time(params, 8, 0, link)
    assert base == pytest.approx(ring_all_reduce_time(2e9, 8, 10e9))  # 2 x parameter bytes
    assert dp_sync_time(params, 8, 1, link) == pytest.approx(base)
    # ZeRO paper Sec. 7: ZeRO-3 moves 1.5x the bytes of ZeRO-1/2
    assert dp_sync_time(params, 8, 3, link) == pytest.approx(1.5 * base)
    assert dp_sync_time(params, 1, 3, link) == 0.0


def test_on_cpu_ranks_zero_is_priced_as_the_in_place_all_reduces_it_runs() -> None:
    """On gloo the runtime carries ZeRO's reduce-scatters and gathers by an all-reduce of the
    whole flat buffer (spec.collectives.zero_form, engine/data_parallel/flat.py): a CPU
    link prices each as that all-reduce, at its own calibrated fit; GPUs keep NCCL's."""
    from paraxis.plan.comm import collective_time, last_bucket_time, zero_time
    from paraxis.spec.collectives import zero_form

    assert [zero_form(op, True) for op in ("reduce_scatter", "all_gather")] == \
        ["all_reduce"] * 2
    assert zero_form("all_gather", False) == "all_gather"
    with pytest.raises(ValueError, match="ZeRO runs no 'all_to_all'"):
        zero_form("all_to_all", True)
    fits = (("all_reduce", 1e-4, 2e9), ("reduce_scatter", 1e-4, 0.3e9),
            ("all_gather", 1e-4, 0.5e9))
    nccl = Link(1e9, 1e-4, False, measured=fits)
    host = nccl._replace(through_host=True)
    for op in ("reduce_scatter", "all_gather"):
        assert zero_time(op, 8e6, 4, host, 3) == collective_time("all_reduce", 8e6, 4, host, 3)
        assert zero_time(op, 8e6, 4, nccl, 3) == collective_time(op, 8e6, 4, nccl, 3)
    for zero in (1, 2, 3):
        expected = {1: 2, 2: 1 + 4, 3: 3 * 4}[zero] * collective_time("all_reduce", 8e6, 4,
                                                                        host)
        assert dp_sync_time(4e6, 4, zero, host, microbatches=4) == pytest.approx(expected)
    assert last_bucket_time(4e6, 4, 1, host) == collective_time("all_reduce", 8e6, 4, host)
    # the CPU cluster's links say so; a GPU cluster's do not
    cpu = build_cluster(gpus=4, overrides={"name": "cpu-core", "peak_flops": 1e11,
                                           "memory_bytes": 3e9, "cores_per_node": 2,
                                           "gpus_per_node": 8})
    assert axis_link(Layout(dp=4, zero=1), "dp", cpu).through_host
    assert not axis_link(Layout(dp=4, zero=1), "dp", build_cluster("h100-sxm-80gb", 4, 8)
                         ).through_host


def test_zero2_reduces_every_microbatch_except_under_a_pipeline() -> None:
    """As the runtime does it (engine/data_parallel/buckets.py): ZeRO-2 reduce-scatters each
    microbatch's gradients; a pipeline's stage accumulates them whole and reduces once,
    ZeRO-1's traffic, and holds the whole gradients beside the shards until then."""
    from paraxis.plan.cost import evaluate
    from paraxis.spec.model_config import PRESETS

    link = Link(10e9, 0.0, True)
    zero1 = dp_sync_time(1e9, 8, 1, link, microbatches=4)
    zero2 = dp_sync_time(1e9, 8, 2, link, microbatches=4)
    scatter = zero1 / 2  # a reduce-scatter and an all-gather move the same bytes
    assert zero2 == pytest.approx(zero1 + 3 * scatter)
    assert dp_sync_time(1e9, 8, 2, link, microbatches=4, pipelined=True) == \
        pytest.approx(zero1)
    cfg = PRESETS["llama2-7b"]
    layouts = {zero: Layout(dp=8, pp=4, zero=zero, microbatches=8) for zero in (1, 2)}
    for reduce, extra in (("step", 1.0), ("microbatch", 0.0)):
        cluster = build_cluster("a100-80gb", 32, 8, {"pipeline_zero2_reduce": reduce})
        one, two = (evaluate(cfg, layouts[z], cluster, 2048, 64) for z in (1, 2))
        whole = one.memory["grads"]  # ZeRO-1 keeps the stage's gradients whole
        assert two.memory["grads"] == pytest.approx(whole / 8)
        assert two.memory["buffers"] - one.memory["buffers"] == pytest.approx(extra * whole)
        assert (two.time["dp_total"] > one.time["dp_total"] * 1.5) == (reduce == "microbatch")
    # a shard group of one rank (dp_shard=1): its shard is the whole gradient, and the stage
    # still accumulates the whole beside it, twice ZeRO-1's gradient bytes
    cluster = build_cluster("a100-80gb", 32, 8)
    one, two = (evaluate(cfg, layouts[z].replace(dp_shard=1), cluster, 2048, 64)
                for z in (1, 2))
    assert two.memory["grads"] == pytest.approx(one.memory["grads"])
    assert two.memory["buffers"] - one.memory["buffers"] == pytest.approx(one.memory["grads"])
    with pytest.raises(ParaxisError, match="pipeline_zero2_reduce"):
        build_cluster("a100-80gb", 8, 8, {"pipeline_zero2_reduce": "sometimes"})


@pytest.mark.parametrize("degrees", [dict(dp=4, tp=8, pp=2), dict(dp=2, tp=2, pp=8),
                                     dict(dp=16, tp=1, pp=4)])
def test_group_ranks_is_the_layouts_own_group_of_rank_0(degrees: dict) -> None:
    from paraxis.plan.comm import group_ranks

    layout = Layout(**degrees)
    for axis in ("dp", "tp", "pp"):
        assert group_ranks(layout, axis) == layout.group_of(0, axis)
