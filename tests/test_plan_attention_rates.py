"""The attention core priced at its kernel's measured rate by shape (plan/attention_rates.py):
the fit on the published kernel charts, the planner's use of it, and what it does to the
held-out runs of docs/validation.md."""

import pytest

from paraxis.plan.attention_rates import (
    FITTED,
    IMPLEMENTATIONS,
    SEQ_LENS,
    kernel_flops,
)
from paraxis.plan.compute import layer_forward_flops_per_token
from paraxis.plan.cost import evaluate
from paraxis.plan.hardware import GPUS, build_cluster
from paraxis.plan.layer_cost import layer_times
from paraxis.plan.rates import attention_kernel_rate
from paraxis.spec.errors import ParaxisError
from paraxis.spec.kernels import FLASH
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import PRESETS
from validation.fit_attention import chart_points, errors, fit_all, rms

LLAMA = PRESETS["llama2-7b"]  # head dim 128


def test_the_committed_fit_is_what_the_fit_script_finds() -> None:
    # python -m validation.fit_attention: least squares on the chart points, nothing else
    assert fit_all() == FITTED
    assert 3 * len(FITTED) == 30  # parameters: r_max(64), r_max(128), s_half per fit


@pytest.mark.parametrize("key", list(FITTED), ids=lambda k: "-".join(map(str, k)))
def test_the_fit_reproduces_the_chart_points_within_its_rms(key) -> None:
    fit = FITTED[key]
    points = chart_points(*key)
    assert len(points) == 12
    assert rms(errors(fit, points)) == pytest.approx(fit.rms, abs=5e-5)
    assert fit.rms < 0.06  # every kernel's shape is captured by three numbers
    assert fit.s_half >= 0 and fit.r_max_64 > 0 and fit.r_max_128 > 0


def test_rates_grow_with_the_sequence_and_follow_the_peak() -> None:
    a100 = [kernel_flops("a100-80gb", 312e12, "fa2", s, 128) for s in SEQ_LENS]
    assert a100 == sorted(a100) and a100[-1] < 312e12
    # FA2 beats FA1, and "triton" (MosaicML's 2023 kernel) is priced as FA1
    assert kernel_flops("a100-80gb", 312e12, "fa1", 8192, 128) < a100[4]
    assert kernel_flops("h100-sxm-80gb", 989e12, "triton", 8192, 128) == kernel_flops(
        "h100-sxm-80gb", 989e12, "fa1", 8192, 128)
    # head dims between the measured 64 and 128 interpolate; others clamp
    mid = kernel_flops("a100-80gb", 312e12, "fa2", 4096, 96)
    ends = [kernel_flops("a100-80gb", 312e12, "fa2", 4096, d) for d in (64, 128)]
    assert mid == pytest.approx(sum(ends) / 2)
    assert kernel_flops("a100-80gb", 312e12, "fa2", 4096, 256) == ends[1]
    # an H100 PCIe runs the SXM's measured kernels at its own peak's share
    assert kernel_flops("h100-pcie-80gb", 756e12, "fa2", 4096, 128) == pytest.approx(
        kernel_flops("h100-sxm-80gb", 989e12, "fa2", 4096, 128) * 756 / 989)


def test_presets_name_the_kernel_pytorch_sdpa_runs() -> None:
    for name in ("a100-40gb", "a100-80gb"):
        assert GPUS[name].attention_impl == "fa2"
    for name in ("h100-sxm-80gb", "h100-pcie-80gb", "h200"):  # torch 2.11 on Hopper
        assert GPUS[name].attention_impl == "cudnn"
    assert GPUS["v100-32gb"].attention_impl == GPUS["l40s"].attention_impl == ""
    # a device of its own (a calibrated profile) takes no preset's kernel rates
    assert build_cluster("a100-80gb", 8, 8, {"name": "my-gpu"}).gpu.attention_impl == ""


def test_unknown_or_unmeasured_implementations_are_refused() -> None:
    with pytest.raises(ParaxisError, match="attention_impl='fa3' is unknown"):
        build_cluster("a100-80gb", 8, 8, {"attention_impl": "fa3"})
    with pytest.raises(ParaxisError, match="no kernel measurements for GPU 'l40s'"):
        build_cluster("l40s", 8, 8, {"attention_impl": "fa2"})
    with pytest.raises(ParaxisError, match="'cudnn' was not measured on GPU 'a100-80gb'"):
        build_cluster("a100-80gb", 8, 8, {"attention_impl": "cudnn"})
    assert set(IMPLEMENTATIONS) == {"", "fa1", "fa2", "triton", "cudnn"}


# Attention kernels paraxis's own step ran on an H100 (torch 2.11, SDPA's cuDNN kernel),
# from docs/gpu/gpu-profile.json: (model, layers, d_model, head dim, sequences, seq, attention
# kernels' seconds per step). The cuDNN fit never saw them.
PROFILED = [("gpt2-124m 8x1024", 12, 768, 64, 8, 1024),
            ("gpt2-124m 16x1024", 12, 768, 64, 16, 1024),
            ("gpt2-350m 8x1024", 24, 1024, 64, 8, 1024),
            ("gpt2-774m 8x1024", 36, 1280, 64, 8, 1024),
            ("gpt2-1.5b 4x1024", 48, 1600, 64, 4, 1024),
            ("llama3-8b/8 2x4096", 8, 4096, 128, 2, 4096)]


@pytest.mark.parametrize("run", PROFILED, ids=lambda r: r[0])
def test_the_cudnn_fit_matches_what_sdpa_ran_in_training_on_our_h100(run) -> None:
    import json
    from pathlib import Path

    name, layers, width, head_dim, sequences, seq = run
    profile = json.loads(Path("docs/gpu/gpu-profile.json").read_text())[name]
    flops = (1 + FLASH.backward_ratio) * FLASH.causal_fraction * 4 * seq * seq * width \
        * sequences * layers
    measured = flops / profile["by_kind_s"]["attention"]
    priced = kernel_flops("h100-sxm-80gb", 989e12, "cudnn", seq, head_dim)
    # measured 265-293 TFLOP/s (d = 64, 1K) and 460 (d = 128, 4K); priced 264 and 451
    assert priced == pytest.approx(measured, rel=0.11)


def _core_forward(cluster, tp: int = 1, seq: int = 8192, cp: int = 1) -> float:
    """Seconds of one layer's attention-core forward on one rank: what selective
    recomputation adds to the backward."""
    layout = Layout(tp=tp, cp=cp)
    none = layer_times(LLAMA, layout, cluster, seq, 1)
    selective = layer_times(LLAMA, Layout(tp=tp, cp=cp, recompute="selective"), cluster, seq,
                            1)
    return selective["backward"] - none["backward"]


@pytest.mark.parametrize("tp", [1, 4])
def test_the_core_takes_its_flops_over_the_fitted_rate(tp: int) -> None:
    cluster = build_cluster("a100-80gb", 8, 8)
    _, scores = layer_forward_flops_per_token(LLAMA, 8192)
    rate = kernel_flops("a100-80gb", 312e12, "fa2", 8192, LLAMA.head_dim) * tp
    assert _core_forward(cluster, tp) == pytest.approx(
        FLASH.causal_fraction * scores * 8192 / rate, rel=1e-9)
    # backward at the same rate on 2.5x the FLOPs (the charts time fwd + bwd together)
    none = layer_times(LLAMA, Layout(tp=tp), cluster, 8192, 1)
    gemm_only = layer_times(LLAMA, Layout(tp=tp), build_cluster(
        "a100-80gb", 8, 8, {"attention_impl": ""}), 8192, 1)
    gemm_core = FLASH.causal_fraction * scores * 8192 / (312e12 * 0.70 * tp)
    assert none["backward"] - gemm_only["backward"] == pytest.approx(
        FLASH.backward_ratio * (_core_forward(cluster, tp) - gemm_core), rel=1e-9)


def test_a_ring_step_is_priced_at_its_own_shape() -> None:
    cluster = build_cluster("h100-sxm-80gb", 8, 8, {"attention_impl": "fa2"})
    assert attention_kernel_rate(cluster, FLASH, 65536, 128, 4, 2) == pytest.approx(
        2 * kernel_flops("h100-sxm-80gb", 989e12, "fa2", 16384, 128, causal=False))


def test_the_preset_implementation_changes_the_step_as_its_rate_does() -> None:
    # Llama 3 8B at 32K tokens, where the core is about half of a layer's work
    cfg, seq = PRESETS["llama3-8b"], 32768
    steps = {}
    for impl in ("", "cudnn", "fa2", "fa1"):
        cluster = build_cluster("h100-sxm-80gb", 8, 8, {"attention_impl": impl})
        steps[impl] = evaluate(cfg, Layout(dp=8, zero=3, recompute="full"), cluster, seq, 8)
    # the GEMM rate (0.65 x 989 at these widths) beats cuDNN's ~500 TFLOP/s, which beats
    # FA2's ~330, which beats FA1's ~140
    assert (steps[""].step_time_s < steps["cudnn"].step_time_s < steps["fa2"].step_time_s
            < steps["fa1"].step_time_s)
    _, scores = layer_forward_flops_per_token(cfg, seq)
    work = FLASH.causal_fraction * (1 + FLASH.backward_ratio) * scores * seq * cfg.n_layers
    recomputed = work * (1 + 1 / (1 + FLASH.backward_ratio))  # full recompute: one more fwd
    rates = {i: kernel_flops("h100-sxm-80gb", 989e12, i, seq, cfg.head_dim) for i in
             ("fa1", "fa2")}
    assert steps["fa1"].time["compute"] - steps["fa2"].time["compute"] == pytest.approx(
        recomputed * (1 / rates["fa1"] - 1 / rates["fa2"]), rel=1e-6)


def test_the_math_kernel_and_measured_rates_are_untouched() -> None:
    # Megatron's 2021-22 math kernel (the fitted rows) and a calibrated attention_flops keep
    # their pricing whatever the preset's implementation
    for extra in ({"attention_kernel": "math"}, {"attention_flops": 150e12}):
        times = [layer_times(LLAMA, Layout(tp=2), build_cluster(
            "a100-80gb", 8, 8, {**extra, "attention_impl": impl}), 4096, 1)
            for impl in ("fa2", "fa1", "")]
        assert times[0] == times[1] == times[2]


# Held-out rows beyond 8K tokens (docs/validation.md, python -m validation): mean
# |error| 62.6% (all too fast) with the core at the GEMM rate, 14.6% with each source's kernel
# at its fitted rate (too slow now: -13.8% signed). The bound leaves 5 points for what the
# chart readings and the FA1 stand-in for MosaicML's Triton kernel leave uncertain, far below
# where the GEMM-rate pricing stood.
LONG_MEAN_ERROR_BOUND = 0.20


def test_long_sequence_held_out_rows_come_within_the_measured_bound() -> None:
    from validation.heldout_runs import HELD_OUT
    from validation.validate_heldout import is_fp8, price

    assert all(run.attention_impl in IMPLEMENTATIONS for run in HELD_OUT)
    # the bf16 rows, as docs/validation.md accounts them (its FP8 rows stand apart)
    long = [price(run) for run in HELD_OUT
            if run.seq_len > 8192 and not run.unpriced and not is_fp8(run)]
    errors_ = [r.error for r in long if r.error is not None]
    assert len(errors_) == 44
    mean = sum(map(abs, errors_)) / len(errors_)
    assert mean < LONG_MEAN_ERROR_BOUND
