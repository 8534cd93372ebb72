"""The network model: rails, per-NIC bandwidth, the cross-node
algorithm, per-collective latency, switchable overlap rules, and cluster presets."""

import json

import pytest

from paraxis.cli import main
from paraxis.plan.comm import axis_link, collective_time, dp_sync_time, group_link
from paraxis.plan.cost import Overlap, evaluate
from paraxis.plan.hardware import CLUSTERS, build_cluster, cluster_preset
from paraxis.plan.search import Constraints, search
from paraxis.plan.search_flags import overlap_rules
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import PRESETS


def cluster(name: str, gpus: int = 64, **changes):
    preset = cluster_preset(name)
    return build_cluster(str(preset.pop("gpu")), gpus, 8, {**preset, **changes})


def test_rails_limit_a_ring_across_nodes() -> None:
    ranks = list(range(16))  # two whole nodes: 8 members per node
    dgx, one_nic = cluster("dgx-a100"), cluster("dgx-a100", nics_per_node=1)
    # 8 rails x 25 GB/s per node vs one NIC of 25 GB/s for all eight members
    assert group_link(ranks, dgx).bandwidth_Bps == pytest.approx(8 * 25e9 * 0.8)
    assert group_link(ranks, one_nic).bandwidth_Bps == pytest.approx(25e9 * 0.8)
    # one member per node: its own rail on a DGX; with one NIC, the other 7 groups of the
    # axis (one per node-mate) cross it at the same time, so an eighth of it
    assert group_link([0, 8], dgx).bandwidth_Bps == pytest.approx(25e9 * 0.8)
    assert group_link([0, 8], one_nic).rail_Bps == pytest.approx(25e9 * 0.8 / 8)
    assert group_link([0, 8], one_nic).bandwidth_Bps == pytest.approx(25e9 * 0.8 / 8)
    # each of 8 members sharing one NIC gets an eighth of it as its rail
    assert group_link(ranks, one_nic).rail_Bps == pytest.approx(25e9 * 0.8 / 8)


def test_hierarchical_collectives_pay_far_fewer_latencies() -> None:
    ranks = list(range(256))
    ring = group_link(ranks, cluster("dgx-a100", 256))
    tree = group_link(ranks, cluster("dgx-a100", 256, collective_algorithm="hierarchical"))
    small, large = 1e5, 1e10
    # small messages: 2(n-1) = 510 latencies against 2(k-1) + 2(N-1) = 14 + 62
    assert collective_time("all_reduce", small, 256, tree) < \
        0.3 * collective_time("all_reduce", small, 256, ring)
    # large messages: the same bytes cross the network, but the flat ring pipelines its
    # NVLink and network hops while the hierarchical legs run one after the other
    ring_s, tree_s = (collective_time("all_reduce", large, 256, link) for link in (ring, tree))
    assert ring_s < tree_s < 1.7 * ring_s


def test_every_collective_call_pays_its_latency() -> None:
    quiet = group_link(list(range(16)), cluster("dgx-a100", collective_latency_s=0.0))
    busy = group_link(list(range(16)), cluster("dgx-a100", collective_latency_s=1e-4))
    params, layers = 1e9, 80
    extra = dp_sync_time(params, 16, 3, busy, 4, layers=layers) - \
        dp_sync_time(params, 16, 3, quiet, 4, layers=layers)
    # ZeRO-3: 3 collectives per layer per microbatch
    assert extra == pytest.approx(3 * layers * 4 * 1e-4)


def test_zero3_prefetch_hides_one_layer_behind_one_layer() -> None:
    cfg, layout = PRESETS["llama2-70b"], Layout(dp=256, zero=3, microbatches=1,
                                                recompute="full")
    for name, hidden in (("dgx-a100", True), ("ethernet-1nic", False)):
        estimate = evaluate(cfg, layout, cluster(name, 256), 4096, 256)
        exposed, total = estimate.time["dp"], estimate.time["dp_total"]
        # on 8 rails a layer's traffic hides behind its compute; on one shared NIC it cannot
        assert (exposed < 0.5 * total) if hidden else (exposed > 0.5 * total)
        off = evaluate(cfg, layout, cluster(name, 256), 4096, 256,
                       overlap=Overlap(zero3_prefetch=False))
        assert off.time["dp"] == pytest.approx(total)


def test_overlap_rules_from_flags() -> None:
    assert overlap_rules(False, ["zero3", "tp"]) == Overlap(tp=False, zero3_prefetch=False)
    assert overlap_rules(True, []) == Overlap(dp=False, tp=False, pp=False,
                                              zero3_prefetch=False, cp=False)


def test_one_ethernet_nic_pushes_traffic_off_the_network() -> None:
    cfg = PRESETS["llama2-70b"]
    picks = {}
    for name in ("dgx-a100", "ethernet-1nic"):
        c = cluster(name, 64)
        ranked = search(cfg, c, 4096, 512, Constraints(tp_within_node=True)).ranked
        # the fastest as priced (on Ethernet within 0.5% of the one the ranking puts first,
        # which prefers fewer model-parallel ranks among times it counts as equal)
        best = min(ranked, key=lambda e: e.step_time_s)
        picks[name] = (best, c)
    # the course's shape holds on both: TP inside the node, PP across
    for best, c in picks.values():
        assert not axis_link(best.layout, "tp", c).crosses_nodes
    # the gradient all-reduce spans fewer nodes where one NIC serves the whole node
    (dgx, dgx_cluster), (eth, eth_cluster) = picks["dgx-a100"], picks["ethernet-1nic"]
    assert (axis_link(eth.layout, "dp", eth_cluster).nodes
            < axis_link(dgx.layout, "dp", dgx_cluster).nodes)


@pytest.mark.parametrize("name", list(CLUSTERS))
def test_cluster_presets_plan(capsys, name: str) -> None:
    code = main(["plan", "--params", "7e9", "--gpus", "16", "--global-batch", "64",
                 "--seq-len", "2048", "--cluster", name, "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["layouts"]
    hardware = {**doc["hardware"]["gpu"], **doc["hardware"]["cluster"]}
    for key, value in CLUSTERS[name].items():
        assert hardware["name" if key == "gpu" else key] == value


def test_bad_network_settings_are_one_line() -> None:
    with pytest.raises(ParaxisError, match="collective_algorithm='tree' is unknown"):
        cluster("dgx-a100", collective_algorithm="tree")
    with pytest.raises(ParaxisError, match="unknown cluster 'dgx-b300'"):
        cluster_preset("dgx-b300")
