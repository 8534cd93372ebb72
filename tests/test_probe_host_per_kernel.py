"""tools/probes/host_per_kernel.py cuts bench.gpu's models to a width where a GPU step is the
host's: the cut models keep their layers and build and train as paraxis and the reference
(on CPU here; the probe itself needs CUDA)."""

from __future__ import annotations

import torch

from bench import gpu
from bench.common import token_batch
from tools.probes.host_per_kernel import cut


def test_the_cut_models_keep_their_layers_and_train():
    for name in ("gpt2-124m", "llama3-8b/8"):
        full = gpu.model(name)
        cfg = cut(full, 64, 512)
        assert (cfg.n_layers, cfg.d_model, cfg.vocab_size, cfg.head_dim) == (
            full.n_layers, 64, 512, 64)
        x, y = token_batch(cfg.vocab_size, 1, 16, torch.device("cpu"))
        for side in ("paraxis", "reference"):
            gpu.build_side(side, cfg, x, y, False, torch.device("cpu"))()


def test_every_recorded_gpu_run_is_priced_beside_its_measurement(tmp_path):
    """tools/probes/planner_gpu_runs.py: each paraxis side of a bench.gpu json, priced on the
    json's preset with the side's kernels, beside its measured step; other sides and other
    jsons are left out."""
    import json

    from tools.probes.planner_gpu_runs import rows

    run = {"model": "gpt2-124m", "batch": 8, "seq": 1024, "sides": {
        "paraxis --compile": {"step_time_s": 0.03},
        "reference": {"step_time_s": 0.02, "kernels_per_step": 500}}}
    (tmp_path / "h200-run").mkdir()
    (tmp_path / "h200-run" / "gpt2.json").write_text(json.dumps(
        {"preset": "h200", "runs": [run]}))
    (tmp_path / "h200-run" / "profile.json").write_text(json.dumps({"sides": {}}))
    [row] = rows(tmp_path)
    priced = gpu.planned(gpu.model("gpt2-124m"), 8, 1024, "h200")["paraxis --compile"]
    assert row["side"] == "paraxis --compile" and row["measured"] == 0.03
    assert row["planner"] == priced.step_time_s
    assert row["reference_per_kernel"] == 0.02 / 500
