"""GPU presets without fitted runs take the A100 fit over by measured ratios."""

from __future__ import annotations

import pytest

from paraxis.plan.hardware import GPUS, build_cluster
from paraxis.plan.rates import gemm_efficiency


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
