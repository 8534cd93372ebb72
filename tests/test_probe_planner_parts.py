"""tools/probes/planner_parts.py: its parts of a planned step add up to the planner's own step
(so its split is cost.py's, not a second model), kernels are classed by name, and the GEMM
curve it fits to measured shapes is the one they were made from."""

from __future__ import annotations

import json

import pytest

from tools.probes.planner_parts import (
    CLASSES,
    fit_gemm_curve,
    measured_parts,
    part_of,
    planned_parts,
    presets_changed,
)


@pytest.mark.parametrize("preset", ["h100-sxm-80gb", "h200"])
def test_the_parts_of_a_gpu_bound_step_are_the_planners_step(preset):
    parts = planned_parts(0, "paraxis --compile", preset)  # GPT-2 124M at 16 x 1024
    assert parts["host"] < parts["step"]  # the GPU, not the host, sets this step
    assert sum(parts[c] for c in CLASSES) == pytest.approx(parts["step"], rel=1e-9)


def test_the_eager_sides_parts_are_the_planners_step_with_the_host_free():
    # eager: each op its own pass over memory, the final norm's and the loss's among the
    # elementwise part; with launches free the step is the GPU's, and the parts add up to it
    with presets_changed(("h200",), kernel_launch_s=0.0):
        eager = planned_parts(0, "paraxis", "h200")
    compiled = planned_parts(0, "paraxis --compile", "h200")
    assert sum(eager[c] for c in CLASSES) == pytest.approx(eager["step"], rel=1e-9)
    assert eager["gemm"] == pytest.approx(compiled["gemm"], rel=1e-9)  # the same GEMMs
    assert eager["elementwise"] > 2 * compiled["elementwise"]


def test_kernels_are_classed_by_name(tmp_path):
    names = {"nvjet_sm90_tst_192x128_64x5_1x2_h_bz_coopB_NNT": "gemm",
             "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16": "attention",
             "void at::native::multi_tensor_apply_kernel<FusedOptimizerTensorListMetadata<4>>":
                 "optimizer",
             "triton_poi_fused_gelu_gelu_backward_view_5": "elementwise"}
    assert {name: part_of(name) for name in names} == names
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"paraxis --compile": {
        "wall_ms": 3.0, "busy_ms": 2.5, "kernels": 4,
        "top": [[name, 1, 0.5 + i] for i, name in enumerate(names)]}}))
    parts = measured_parts(profile, "paraxis --compile")
    assert [parts[c] for c in CLASSES] == [0.5, 1.5, 3.5, 2.5]
    assert (parts["busy"], parts["step"], parts["kernels"]) == (2.5, 3.0, 4)


def test_the_fitted_gemm_curve_is_the_one_the_shapes_follow(tmp_path):
    peak, efficiency, half = 1e15, 0.8, 150.0
    gemms = [{"k": w, "n": 4 * w, "flops_per_s": peak * efficiency * w / (w + half)}
             for w in (256, 512, 1024, 4096, 16384)]
    shapes = tmp_path / "shapes.json"
    shapes.write_text(json.dumps({"peak_flops": peak, "gemms": gemms}))
    fitted = fit_gemm_curve(shapes)
    assert fitted == pytest.approx((efficiency, half))
