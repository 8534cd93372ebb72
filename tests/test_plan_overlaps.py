"""The runtime switches the cost model prices as each runtime runs them: TP collectives
pipelined with GEMMs, the gradient sync's last bucket and ZeRO-1/2's parameter all-gather,
MoE dispatch of sequence shards under TP, and the host's kernel launches."""

import pytest

from paraxis.plan.comm import Link, all_gather_time, last_bucket_time, param_gather_time
from paraxis.plan.context import zero_link
from paraxis.plan.cost import evaluate
from paraxis.plan.hardware import build_cluster
from paraxis.plan.layer_cost import layer_times
from paraxis.plan.tp_layer import tp_layer_exposed_time
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import PRESETS

LLAMA_70B = PRESETS["llama3-70b"]


def flat_link() -> Link:
    return Link(100e9, 0.0, False)


def test_pipelined_tp_hides_the_forward_behind_its_gemms() -> None:
    link = flat_link()
    gather = all_gather_time(1e8, 8, link.bandwidth_Bps)
    wide, narrow = (1.0, 1.0), (gather / 2, gather / 2)
    blocking = tp_layer_exposed_time(1e8, 8, True, link, wide)
    assert blocking[0] > 0  # Megatron's default: the forward's collectives block
    assert tp_layer_exposed_time(1e8, 8, True, link, wide, row_windows_s=wide) == (0.0, 0.0)
    forward, _ = tp_layer_exposed_time(1e8, 8, True, link, narrow, row_windows_s=narrow)
    assert forward == pytest.approx(blocking[0] / 2)  # half of each past its window
    # without SP there is nothing to pipeline (userbuffers need it): as before
    assert tp_layer_exposed_time(1e8, 8, False, link, wide, row_windows_s=wide) == \
        tp_layer_exposed_time(1e8, 8, False, link, wide)


def test_tp_comm_overlap_all_moves_tp_off_the_critical_path() -> None:
    layout = Layout(dp=8, tp=8, zero=1, sequence_parallel=True, microbatches=16,
                    recompute="selective")
    steps = {mode: evaluate(LLAMA_70B, layout, build_cluster(
        "h100-sxm-80gb", 64, 8, {"tp_comm_overlap": mode}), 4096, 128)
        for mode in ("backward", "all")}
    assert steps["all"].time["tp"] < steps["backward"].time["tp"] / 1.5
    assert steps["all"].time["tp_total"] == steps["backward"].time["tp_total"]
    with pytest.raises(ParaxisError, match="tp_comm_overlap='sometimes' is unknown"):
        build_cluster("a100-80gb", 8, 8, {"tp_comm_overlap": "sometimes"})


def test_the_last_bucket_trades_calls_for_a_tail() -> None:
    link = flat_link()
    small = last_bucket_time(1e9, 64, 0, link, 2, 32, 25e6)
    large = last_bucket_time(1e9, 64, 0, link, 2, 32, 500e6)
    assert large > 10 * small  # a bigger bucket waits longer after the backward
    assert last_bucket_time(1e9, 64, 0, link, 2, 32, 0) == pytest.approx(
        last_bucket_time(1e9, 64, 0, link, 2, 32, 2e9 / 32))  # 0: one layer's
    assert last_bucket_time(1e9, 64, 3, link) == 0.0  # ZeRO-3 reduces per layer, prefetched
    # llama2-7b over 64 A100s (8 nodes): 25 MiB buckets pay a ring's 126 latencies 515
    # times; one bucket of all 13.5 GB hides nothing; between them lies the best size
    layout = Layout(dp=64, microbatches=4)
    exposed = {bucket: evaluate(PRESETS["llama2-7b"], layout, build_cluster(
        "a100-80gb", 64, 8, {"gradient_bucket_bytes": bucket}), 4096, 256).time["dp"]
        for bucket in (25 * 2**20, 5e8, 1e11)}
    assert exposed[5e8] < exposed[1e11] < exposed[25 * 2**20]
    assert build_cluster("a100-80gb", 8, 8).gpu.gradient_bucket_bytes == 25 * 2**20


def test_zero_parameter_gather_is_exposed_unless_the_runtime_overlaps_it() -> None:
    layout = Layout(dp=64, zero=1, microbatches=4)
    exposed, hidden = (evaluate(PRESETS["llama2-7b"], layout, build_cluster(
        "a100-80gb", 64, 8, {"param_gather_overlap": flag}), 4096, 256) for flag in (False, True))
    gather = param_gather_time(PRESETS["llama2-7b"].num_params(), 64, 1,
                               zero_link(layout, build_cluster("a100-80gb", 64, 8)))
    assert gather > 0
    assert exposed.time["dp"] - hidden.time["dp"] == pytest.approx(0.8 * gather, rel=0.05)
    assert param_gather_time(1e9, 64, 0, flat_link()) == 0.0  # ZeRO-0 gathers nothing


def test_sequence_shard_dispatch_sends_a_tp_share_of_the_tokens() -> None:
    cfg = PRESETS["mixtral-8x7b"]
    layout = Layout(dp=16, tp=4, ep=8, etp=4, zero=1, sequence_parallel=True,
                    microbatches=8)
    times = {how: layer_times(cfg, layout, build_cluster(
        "h100-sxm-80gb", 64, 8, {"expert_tp_dispatch": how}), 4096, 1, moe=True)
        for how in ("every_rank", "sequence_shard")}
    assert times["sequence_shard"]["ep_total"] < times["every_rank"]["ep_total"] / 2
    # without SP every tp rank holds every token: nothing to shard
    plain = Layout(dp=16, tp=4, ep=8, etp=4, zero=1, microbatches=8)
    assert len({layer_times(cfg, plain, build_cluster(
        "h100-sxm-80gb", 64, 8, {"expert_tp_dispatch": how}), 4096, 1, moe=True)["ep_total"]
        for how in ("every_rank", "sequence_shard")}) == 1


def test_small_microbatches_run_host_bound() -> None:
    cfg, cluster = PRESETS["llama2-7b"], build_cluster("h100-sxm-80gb", 8, 8)
    free = build_cluster("h100-sxm-80gb", 8, 8, {"kernel_launch_s": 0.0})
    per_sequence = {}
    for name, at in (("launches", cluster), ("free", free)):
        one, sixteen = (evaluate(cfg, Layout(tp=8, sequence_parallel=True, microbatches=16 // m),
                                 at, 256, 16).step_time_s for m in (1, 16))
        per_sequence[name] = one / sixteen
    assert per_sequence["launches"] > 2 * per_sequence["free"]  # micro-batch 1 is charged
    # long microbatches keep the GPU busier than the host: launches change nothing
    long = [evaluate(cfg, Layout(dp=8, zero=3), at, 4096, 8).step_time_s
            for at in (cluster, free)]
    assert long[0] == long[1]


def test_megatron_buckets_grow_with_the_data_parallel_degree() -> None:
    from paraxis.plan.comm import gradient_bucket_bytes

    gpu = build_cluster("h100-sxm-80gb", 8, 8, {"gradient_bucket_rule": "megatron"}).gpu
    assert gradient_bucket_bytes(gpu, 8, 4) == 40e6 * 4  # the 40M-parameter floor
    assert gradient_bucket_bytes(gpu, 1024, 4) == 1024e6 * 4  # 1M parameters a rank
    # 1024 ranks over a thin network: Megatron's buckets pay far fewer ring latencies
    layout = Layout(dp=1024, microbatches=1)
    overrides = {"nics_per_node": 4, "inter_node_bandwidth_Bps": 12.5e9}
    exposed = [evaluate(PRESETS["llama2-7b"], layout, build_cluster(
        "h100-sxm-80gb", 1024, 8, {**overrides, "gradient_bucket_rule": rule}), 2048,
        1024).time["dp"] for rule in ("fixed", "megatron")]
    assert exposed[1] < exposed[0] / 2
    with pytest.raises(ParaxisError, match="gradient_bucket_rule='often' is unknown"):
        build_cluster("a100-80gb", 8, 8, {"gradient_bucket_rule": "often"})
