"""GPU presets: those without fitted runs take the A100 fit over by measured ratios; each
prices the dtype a step computes in on the units that run it."""

from __future__ import annotations

import pytest

from paraxis.plan.compute import model_flops_per_token
from paraxis.plan.cost import evaluate
from paraxis.plan.hardware import GPUS, build_cluster
from paraxis.plan.rates import for_precision, gemm_efficiency
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import PRESETS
from paraxis.spec.precision import PRECISIONS


def test_h100_gemm_curve_is_the_a100_fit_carried_over() -> None:
    a100, h100 = GPUS["a100-80gb"], GPUS["h100-sxm-80gb"]
    # the ceiling falls as the best measured matmul does: 80.3% vs 86.9% of peak (MAMF)
    assert h100.matmul_efficiency / a100.matmul_efficiency == pytest.approx(
        (794.5 / 989) / (271.2 / 312))
    # the half width grows with the machine balance, FLOP/s per byte/s of HBM
    balance = (h100.peak_flops / h100.hbm_bandwidth_Bps) / (a100.peak_flops
                                                           / a100.hbm_bandwidth_Bps)
    assert h100.gemm_half_width == pytest.approx(a100.gemm_half_width * balance)
    # H200: the same chip with faster HBM, so narrow GEMMs lose less than on H100
    assert GPUS["h200"].matmul_efficiency == h100.matmul_efficiency
    assert GPUS["h200"].gemm_half_width < h100.gemm_half_width


@pytest.mark.parametrize("width", [128, 1024, 8192])
def test_an_h100_gemm_is_faster_than_an_a100_one_but_less_than_peak_says(width) -> None:
    a100, h100 = build_cluster("a100-80gb", 8), build_cluster("h100-sxm-80gb", 8)
    a_rate = a100.gpu.peak_flops * gemm_efficiency(a100, width)
    h_rate = h100.gpu.peak_flops * gemm_efficiency(h100, width)
    assert 1.0 < h_rate / a_rate < h100.gpu.peak_flops / a100.gpu.peak_flops


def test_an_hbm_override_moves_a_carried_half_width_with_the_balance() -> None:
    # torchtitan's 96 GB H100s have HBM2e at 2.4 TB/s: the SXM's chip at a higher balance
    sxm = GPUS["h100-sxm-80gb"]
    slower = build_cluster("h100-sxm-80gb", 8, overrides={"hbm_bandwidth_Bps": 2.4e12}).gpu
    assert slower.gemm_half_width == pytest.approx(sxm.gemm_half_width * 3.35 / 2.4)
    assert slower.matmul_efficiency == sxm.matmul_efficiency
    # a stated curve wins; a fitted preset (A100) keeps its fit
    stated = build_cluster("h100-sxm-80gb", 8, overrides={"hbm_bandwidth_Bps": 2.4e12,
                                                          "gemm_half_width": 300.0}).gpu
    assert stated.gemm_half_width == 300.0
    a100 = build_cluster("a100-80gb", 8, overrides={"hbm_bandwidth_Bps": 1.5e12}).gpu
    assert a100.gemm_half_width == GPUS["a100-80gb"].gemm_half_width


@pytest.mark.parametrize("gpu", ["a100-80gb", "h100-sxm-80gb", "v100-32gb"])
def test_fp32_matmuls_are_priced_on_the_cuda_cores(gpu) -> None:
    """PyTorch leaves TF32 off: an fp32 step runs its GEMMs at the FP32 peak, not the
    tensor cores'. Priced at the bf16 peak, llama2-7b in fp32 on A100s came out at 184
    TFLOP/s a GPU, above even TF32's 156."""
    cfg, layout = PRESETS["llama2-7b"], Layout(dp=8, zero=3, microbatches=8)
    cluster = build_cluster(gpu, 8)
    fp32 = evaluate(cfg, layout, cluster, 4096, 64, PRECISIONS["fp32"])
    half = evaluate(cfg, layout, cluster, 4096, 64,
                    PRECISIONS["fp16" if gpu == "v100-32gb" else "bf16"])
    done = model_flops_per_token(cfg, 4096) * 64 * 4096 / 8 / fp32.step_time_s
    assert done < cluster.gpu.fp32_peak_flops  # FLOP/s a GPU, against the fp32 datasheet
    assert fp32.mfu <= 1 and fp32.step_time_s > 2 * half.step_time_s
    # priced once, whichever entry prices it: the rule is idempotent
    assert for_precision(for_precision(cluster, PRECISIONS["fp32"]), PRECISIONS["fp32"]) == \
        for_precision(cluster, PRECISIONS["fp32"])
    assert for_precision(cluster, PRECISIONS["bf16"]) is cluster


def test_bf16_is_refused_where_the_gpu_has_no_bf16_tensor_cores() -> None:
    v100 = build_cluster("v100-32gb", 8)
    with pytest.raises(ParaxisError, match="no bf16 tensor cores.*--precision fp16"):
        evaluate(PRESETS["tiny"], Layout(dp=8), v100, 128, 64, PRECISIONS["bf16"])
    evaluate(PRESETS["tiny"], Layout(dp=8), v100, 128, 64, PRECISIONS["fp16"])


def test_a_calibrated_device_keeps_its_own_fp32_rate() -> None:
    """A profile's peak_flops is what its cores measured in fp32: no preset's fp32 figure
    replaces it."""
    cpu = build_cluster("a100-80gb", 2, 2, {"name": "cpu-core", "peak_flops": 1e11,
                                           "cores_per_node": 2})
    assert for_precision(cpu, PRECISIONS["fp32"]) is cpu


def test_a_runs_mfu_counts_the_peak_of_what_it_computes_in(monkeypatch) -> None:
    """The runtime's MFU and the planner's share one peak: an fp32 run on an A100 against its
    CUDA cores' 19.5 TFLOP/s, a bf16 run against the tensor cores' 312."""
    import torch

    from paraxis.train.metrics import device_peak_flops

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    cuda = torch.device("cuda")
    assert device_peak_flops(cuda, precision="fp32") == 19.5e12
    assert device_peak_flops(cuda, precision="bf16") == 312e12
    assert device_peak_flops(cuda) == 312e12
