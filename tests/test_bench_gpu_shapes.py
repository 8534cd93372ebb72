"""tools.probes.gpu_shapes: GEMM and attention by shape, beside the planner's rate for each."""

from __future__ import annotations

import pytest
import torch

from paraxis.plan.hardware import GPUS
from tools.probes import gpu_shapes


def test_flop_counts_are_the_planners():
    assert gpu_shapes.gemm_flops(8192, 4096, 16384) == 2 * 8192 * 4096 * 16384
    # flash's own count: 4 s^2 d per head forward, half of it under a causal mask, and the
    # backward 2.5 forwards (FlashAttention-2 Sec. 4.1)
    full = gpu_shapes.attention_flops(batch=2, heads=16, seq_len=8192, head_dim=128, causal=False)
    assert full == pytest.approx(4 * 8192**2 * 128 * 16 * 2 * 3.5)
    assert gpu_shapes.attention_flops(2, 16, 8192, 128, causal=True) == pytest.approx(full / 2)


def test_each_shape_is_measured_beside_the_planners_rate_for_it():
    # On a CPU at tiny sizes with an H100 preset standing in: the code path a GPU runs.
    h100 = GPUS["h100-sxm-80gb"]
    setting = gpu_shapes.QUICK
    gemms = gpu_shapes.measure_gemms(torch.device("cpu"), torch.float32, setting, h100)
    assert [(g.width, g.m) for g in gemms] == [(16, 64), (16, 64), (32, 64), (32, 64)]
    assert all(g.flops_per_s > 0 for g in gemms)
    # the planner's GEMM rate grows with the narrower side
    assert gemms[0].planner_flops_per_s < gemms[2].planner_flops_per_s < h100.peak_flops
    attention = gpu_shapes.measure_attention(torch.device("cpu"), torch.float32, setting, h100)
    assert len(attention) == 4  # 2 sequence lengths x causal or not, one head dim
    causal = {a.seq_len: a.planner_flops_per_s for a in attention if a.causal}
    assert causal[32] < causal[64]  # FA2's rate grows with the sequence


def test_quick_run_renders_a_table_per_sweep(tmp_path):
    gpu_shapes.main(["--quick", "--out", str(tmp_path)])
    text = (tmp_path / "gpu-shapes.md").read_text()
    assert "## GEMMs" in text and "## Attention core" in text
    assert (tmp_path / "gpu-shapes.json").exists()
    if not torch.cuda.is_available():  # no preset on a CPU: no planner column to compare
        assert "planner preset none" in text
        assert "| 64 x 16 x 64 | 16 |" in text


def test_each_gpu_step_is_measured_beside_the_planners_forecast_of_it():
    # bench.gpu on a CPU at a tiny size with an H100 preset standing in: the code path a GPU
    # runs, every side measured, the planner pricing paraxis's sides (eager kernels for the
    # eager one, fused for the compiled one).
    from bench import gpu

    row = gpu.measure(torch.device("cpu"), "tiny", 2, 64, gpu.QUICK, GPUS["h100-sxm-80gb"])
    eager, compiled = row["sides"]["paraxis"], row["sides"]["paraxis --compile"]
    assert eager["step_time_s"] > 0 and eager["planner_step_time_s"] > 0
    assert eager["planner_memory_bytes"] > 0
    assert compiled["planner_step_time_s"] < eager["planner_step_time_s"]
    assert row["sides"]["paraxis fp8 --compile"]["planner_step_time_s"] > 0  # FP8 priced
    autocast = row["sides"]["paraxis autocast-bf16 --compile"]  # fp32 state, bf16 compute
    assert autocast["tokens_per_s"] > 0 and autocast["planner_step_time_s"] > 0
    assert row["sides"]["reference"]["tokens_per_s"] > 0
    assert gpu.model("llama3-8b/8").n_layers == 8  # "preset/L": the first L layers
    section = {"device": "cpu", "preset": "h100-sxm-80gb", "peak_flops": None, "steps": 2,
               "compiled": False, "torch": "x", "cuda": None, "runs": [row]}
    text = gpu.render(section)
    assert "| tiny (0M), 2 x 64 | paraxis |" in text
    assert "| tiny (0M), 2 x 64 | reference |" in text


def test_a_gpu_section_from_before_the_peers_still_renders():
    """docs/benchmarks.json keeps the last GPU run until a GPU replaces it; one written
    before the bench had peers (paraxis's step alone) renders as it was measured."""
    from bench import gpu

    old = {"device": "NVIDIA H100 80GB HBM3", "preset": "h100-sxm-80gb", "peak_flops": 989e12,
           "steps": 20, "torch": "2.11.0", "cuda": "13.0", "runs": [
               {"model": "gpt2-124m", "params": 124475904, "batch": 8, "seq": 1024,
                "step_time_s": 0.0452, "tokens_per_s": 181155.0, "mfu": 0.146,
                "peak_memory_bytes": 6.8 * 2**30, "planner_step_time_s": 0.0273}]}
    text = gpu.render(old)
    assert "paraxis's bf16 step alone" in text
    assert "| gpt2-124m (124M) | 8 x 1024 | 45.2 ms | 181,155 | 14.6% | 27.3 ms | -40% |" in text
