"""The cost model on a calibrated CPU: ranks share cores, eager kernels, the optimizer."""

import pytest

from paraxis.plan.bubble import pipeline_figures
from paraxis.plan.comm import Link
from paraxis.plan.compute import (
    gathered_share,
    layer_forward_traffic_per_token_eager,
    optimizer_traffic_per_param,
)
from paraxis.plan.cost import evaluate
from paraxis.plan.hardware import build_cluster
from paraxis.plan.tp_layer import tp_layer_time
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import PRESETS
from paraxis.spec.precision import FP32_ADAM, MIXED_ADAM

MODEL = PRESETS["small-llama"].replace(n_layers=8)
CPU = {"name": "cpu-core", "peak_flops": 1e11, "matmul_efficiency": 1.0,
       "attention_flops": 4e10, "hbm_bandwidth_Bps": 7e9, "hbm_efficiency": 1.0,
       "memory_bytes": 3e9, "kernels": "eager", "nvlink_bandwidth_Bps": 1e9,
       "link_efficiency": 1.0, "intra_node_latency_s": 3e-4, "gpus_per_node": 8}


def cpu(ranks: int, cores: int = 2, available: float = 0.0):
    return build_cluster(gpus=ranks, overrides={**CPU, "cores_per_node": cores,
                                                "available_cores": available})


def price(layout: Layout, cores: int = 2, available: float = 0.0):
    return evaluate(MODEL, layout, cpu(layout.world_size, cores, available), 128, 16,
                    FP32_ADAM)


def test_ranks_beyond_the_cores_share_them():
    assert cpu(8).compute_share == 0.25 and cpu(2).compute_share == 1.0
    assert build_cluster("a100-80gb", 8).compute_share == 1.0  # GPUs own their device
    # other sessions leave our ranks one core of two: one rank still gets a whole core,
    # two share it, eight get an eighth each
    assert cpu(1, available=1.0).compute_share == 1.0
    assert cpu(2, available=1.0).compute_share == 0.5
    assert cpu(8, available=1.0).compute_share == 0.125
    assert cpu(1, available=0.5).compute_share == 0.5
    assert price(Layout(dp=2), available=1.0).time["compute"] == pytest.approx(
        price(Layout()).time["compute"])
    # the same work on 2 cores takes as long split 2 ways as 8 ways
    assert price(Layout(dp=8)).time["compute"] == pytest.approx(
        price(Layout(dp=2)).time["compute"])
    assert price(Layout(dp=2)).time["compute"] == pytest.approx(
        price(Layout(dp=1)).time["compute"] / 2)


def test_idle_pipeline_ranks_lend_their_cores():
    layout = Layout(pp=4, microbatches=8, schedule="1f1b")
    shared, own = price(layout, cores=2), price(layout, cores=4)
    bubble = pipeline_figures("1f1b", 4, 8).bubble_fraction
    # four ranks on four cores: the schedule's bubble, as on GPUs
    assert own.time["bubble"] / (own.time["bubble"] + own.time["compute"] + own.time["pp"]) \
        == pytest.approx(bubble)
    # on two cores the work (twice the compute at half a core) outlasts the critical path,
    # so the bubble costs nothing: idle ranks hand their core to the busy ones
    assert shared.time["bubble"] == 0.0
    assert shared.time["compute"] == pytest.approx(2 * own.time["compute"])
    # with one core of the two left to us the work bound doubles, the critical path not
    half = price(layout, cores=2, available=1.0)
    assert half.time["compute"] == pytest.approx(2 * shared.time["compute"])
    assert half.time["bubble"] == 0.0


def test_a_lone_stage_shares_the_cores_among_its_own_ranks():
    # 8 ranks on 2 cores, two stages of 4 (dp=2 x tp=2): while one stage idles in the
    # bubble, the other's 4 ranks get half a core each, not a whole one. With two
    # microbatches and the tiny model's TP calls at gloo's latency between time-shared ranks
    # (`paraxis demo`), the critical path at that share outlasts the work over the cores.
    layout = Layout(dp=2, tp=2, pp=2, microbatches=2, schedule="1f1b")
    cluster = build_cluster(gpus=8, overrides={**CPU, "cores_per_node": 2,
                                               "intra_node_latency_s": 1.5e-3})
    estimate = evaluate(PRESETS["tiny"], layout, cluster, 128, 16, FP32_ADAM)
    t, m = estimate.time, layout.microbatches
    bubble = pipeline_figures("1f1b", 2, 2).bubble_fraction
    slot, comm = t["compute"] / m, (t["tp"] + t["pp"]) / m
    share, stage_share = 0.25, 0.5  # 2 cores over 8 ranks; over one stage's 4
    critical = m * (slot * share / stage_share + comm) / (1 - bubble)
    assert critical > t["compute"] + t["tp"] + t["pp"]  # the bound that binds here
    assert t["bubble"] + t["compute"] + t["tp"] + t["pp"] == pytest.approx(critical)


def test_nothing_hides_communication_on_a_cpu():
    estimate = price(Layout(dp=2))
    assert estimate.time["dp"] == estimate.time["dp_total"] > 0
    gpu = evaluate(PRESETS["gpt2-124m"], Layout(dp=2), build_cluster("a100-80gb", 2), 128, 16)
    assert gpu.time["dp"] < gpu.time["dp_total"]  # DDP buckets (but the last) hide behind backward


def test_eager_traffic_counts_every_elementwise_kernel():
    h, q, kv, f = 256, 256, 128, 704  # small-llama: 8 heads, 4 kv heads, SwiGLU 704
    # norms 2 x 6h, rotary 10(q + kv), rows copy 2q, residuals 2 x 3h, SiLU and gate
    # product 5f; no grouped-head repeat: the kernel takes K, V at kv width (enable_gqa)
    assert layer_forward_traffic_per_token_eager(MODEL) == 12 * h + 10 * (q + kv) + \
        2 * q + 6 * h + 5 * f
    # tensor parallelism splits the heads and the MLP, not the norms and residuals
    assert layer_forward_traffic_per_token_eager(MODEL, tp=2) == 12 * h + 5 * (q + kv) + \
        q + 6 * h + 2.5 * f
    gpt2 = PRESETS["small"]
    # one LayerNorm kernel 2 x 2h, residuals 2 x 3h, rows copy 2q, one GELU kernel 2f
    assert layer_forward_traffic_per_token_eager(gpt2) == 10 * 256 + 2 * 256 + 2 * 1024


def test_optimizer_update_is_priced_by_bytes():
    # paraxis's runtime (torch's fused kernel, then its own norm and clipping passes), the
    # elementwise "eager" setting's AdamW; torch.optim.AdamW's foreach ops; Megatron's fused
    assert optimizer_traffic_per_param(FP32_ADAM, "eager") == 28 + 4 + 2 * 4
    assert optimizer_traffic_per_param(FP32_ADAM, "paraxis") == 28 + 4 + 2 * 4
    assert optimizer_traffic_per_param(FP32_ADAM, "foreach") == 21 * 4 + 3 * 4
    # bf16 with masters: the norm's read, then one pass (bf16 gradient, fp32 master and
    # moments in; master, moments and the bf16 weight out), after the gradients' gather
    # into one flat copy where they are the parameters' own
    assert optimizer_traffic_per_param(MIXED_ADAM, "paraxis") == 2 + (2 + 12) + (12 + 2)
    assert optimizer_traffic_per_param(MIXED_ADAM, "paraxis", gathered=1.0) == 30 + 2 + 2
    # on CPU ranks torch's fused kernel steps an fp32 copy (writing the unscaled copy back),
    # then the bf16 weight is written
    assert optimizer_traffic_per_param(MIXED_ADAM, "paraxis", one_pass=False) == \
        2 + (2 + 4) + (16 + 16) + (4 + 2)
    # gathered: all but the matrices of at least a bucket (25 MiB), alone in their units
    gpt2 = PRESETS["gpt2-124m"]
    assert gathered_share(gpt2, 1, 25 * 2**20, 2) == pytest.approx(
        1 - gpt2.vocab_size * 768 / gpt2.num_params())  # the tied embedding alone
    llama = PRESETS["llama3-8b"]
    d, f = 4096, 14336  # q and o (32 MiB) and the MLP's alone; k and v (8 MiB) are not
    alone = 2 * 128256 * d + 32 * (2 * d * d + 3 * d * f)
    assert gathered_share(llama, 1, 25 * 2**20, 2) == pytest.approx(
        1 - alone / llama.num_params())
    # over tp=8 a rank's MLP matrices are 14 MiB: the embedding and head alone are
    assert gathered_share(llama, 8, 25 * 2**20, 2) == pytest.approx(
        1 - 2 * 128256 * d / llama.num_params())
    assert optimizer_traffic_per_param(MIXED_ADAM, "fused") == 32
    one, sharded = price(Layout(dp=2)), price(Layout(dp=2, zero=1))
    assert sharded.time["optimizer"] == pytest.approx(one.time["optimizer"] / 2)


def test_fp32_activations_double_the_tp_traffic():
    cluster, big = build_cluster("a100-80gb", 2), PRESETS["llama2-7b"]
    mixed = evaluate(big, Layout(tp=2), cluster, 4096, 8, MIXED_ADAM)
    fp32 = evaluate(big, Layout(tp=2), cluster, 4096, 8, FP32_ADAM)
    # bandwidth-bound; the exposed part grows too, if by less (the GEMM windows stay)
    assert fp32.time["tp_total"] == pytest.approx(2 * mixed.time["tp_total"], rel=0.01)
    assert fp32.time["tp"] > 1.5 * mixed.time["tp"]


def test_eager_runtime_has_no_sp_regathers():
    # paraxis's autograd keeps the gathered input, so SP moves what the all-reduces did;
    # Megatron (fused) re-gathers the stored shards in the backward
    link = Link(1e9, 0.0, False)
    assert tp_layer_time(1e6, 2, True, link, regather=False) == pytest.approx(
        tp_layer_time(1e6, 2, False, link))
    sp = Layout(tp=2, sequence_parallel=True)
    eager = price(sp, cores=2).time["tp_total"]
    plain = price(Layout(tp=2), cores=2).time["tp_total"]
    # On CPU ranks each reduce-scatter is an all-to-all whose owner then adds the parts
    # (spec.collectives): the same bytes on the wire, and beside them the owners' sums, 5/2
    # of the buffer through memory, four a layer (two forward, two backward) over 8 layers,
    # and one at each end (the embedding's forward, the head's backward)
    boundary = 4 * 16 * 128 * MODEL.d_model  # fp32 activations of the one microbatch
    sums = (8 * 4 + 2) * boundary * 5 / 2 / CPU["hbm_bandwidth_Bps"]
    assert eager == pytest.approx(plain + sums, rel=1e-6)
    gpu = build_cluster("a100-80gb", 2)
    megatron = evaluate(MODEL, sp, gpu, 128, 16).time["tp_total"]
    assert megatron > evaluate(MODEL, Layout(tp=2), gpu, 128, 16).time["tp_total"]


def test_eager_dispatch_is_paid_per_layer_per_microbatch():
    """A calibrated layer overhead (one token's forward + backward) lands on every layer of
    every microbatch, time-shared like the kernels; without one (presets, older profiles)
    nothing changes, and GPUs never pay it."""
    import dataclasses

    from paraxis.plan.stages import stage_layers

    layout = Layout.parse("dp=2,tp=2,pp=2,zero=1,microbatches=2,schedule=1f1b")
    plain = cpu(8)
    slow = plain.replace(gpu=dataclasses.replace(plain.gpu, layer_overhead_s=1e-3))
    before = evaluate(MODEL, layout, plain, 128, 16, FP32_ADAM)
    after = evaluate(MODEL, layout, slow, 128, 16, FP32_ADAM)
    # the busiest stage's layers, every microbatch, at a quarter of a core (8 ranks, 2 cores)
    layers = (after.time["compute"] - before.time["compute"]) / layout.microbatches / 4e-3
    assert round(layers, 6) in stage_layers(MODEL, 2, 1, 128)
    gpu = build_cluster("a100-80gb", 8)
    a100 = gpu.replace(gpu=dataclasses.replace(gpu.gpu, layer_overhead_s=1.0))
    assert evaluate(MODEL, layout, a100, 128, 16).time == \
        evaluate(MODEL, layout, gpu, 128, 16).time


def test_a_calibrated_device_takes_no_presets_gemm_shape_term():
    """A profile's GEMM rate was measured at the model's shapes: its narrow GEMMs must not
    also pay the A100's fitted shape penalty (the preset build_cluster starts from). With
    it, small-llama's GEMMs (narrower side 256 each) were priced at 256 / (256 + 192) of
    the measured rate: every CPU layout over-forecast, dp=1 by 57% on an AMD EPYC."""
    one = cpu(1)
    assert one.gpu.gemm_half_width == 0.0
    assert build_cluster("a100-80gb", 8).gpu.gemm_half_width > 0  # the preset keeps its fit
    shaped = build_cluster(gpus=1, overrides={**CPU, "gemm_half_width": 192.0})
    assert shaped.gpu.gemm_half_width == 192.0  # a profile may state a shape term
    layout = Layout.parse("dp=1").validate(1, MODEL, 16, 128)
    plain, slow = (evaluate(MODEL, layout, c, 128, 16, FP32_ADAM).time["compute"]
                   for c in (one, shaped))
    # every GEMM of the model (layers and head) at the measured rate, forward + 2 backward
    gemm_flops = 3 * 2 * (MODEL.blocks_params(active=True)
                          + MODEL.d_model * MODEL.vocab_size) * 16 * 128
    assert slow - plain == pytest.approx(gemm_flops / CPU["peak_flops"] * 192 / 256,
                                         rel=0.02)


def test_optimizer_kernel_follows_the_runtime_and_can_be_named():
    """`auto` prices paraxis's AdamW beside eager kernels and Megatron's fused Adam beside
    fused ones; a source that ran torch.optim.AdamW's foreach ops names it."""
    def optimizer_s(changes: dict) -> float:
        cluster = build_cluster("h100-sxm-80gb", 1, 1, changes)
        return evaluate(PRESETS["gpt2-124m"], Layout(), cluster, 1024, 8,
                        MIXED_ADAM).time["optimizer"]

    eager = optimizer_s({"kernels": "eager"})
    assert eager == pytest.approx(optimizer_s({"kernels": "eager",
                                               "optimizer_kernel": "paraxis"}))
    assert eager < optimizer_s({"kernels": "eager", "optimizer_kernel": "foreach"})
    assert optimizer_s({"kernels": "fused"}) < eager
    with pytest.raises(ParaxisError, match="optimizer_kernel='apex' is unknown"):
        build_cluster("h100-sxm-80gb", 1, 1, {"optimizer_kernel": "apex"})
