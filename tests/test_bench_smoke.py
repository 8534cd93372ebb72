"""The benchmark command runs end to end at a tiny size, so it cannot rot."""

import json
import os
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from bench import bench_cp, bench_pp
from bench.predicted_vs_measured import QUICK_LAYOUTS

ROOT = Path(__file__).parents[1]
# The quick bench's parts each test reads, run as `python -m bench --quick --only PARTS`.
PARTS = {"suites": "overhead,dp,tp,pp,cp", "sections": "calibrate,predicted,scaling",
         "gpu": "gpu"}


def _bench(out: Path, parts: str) -> None:
    result = subprocess.run([sys.executable, "-m", "bench", "--quick", "--only", parts,
                             "--out", str(out)], timeout=900, capture_output=True, text=True)
    assert result.returncode == 0, f"bench --only {parts}: {result.stderr[-3000:]}"


def _cp_variants() -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tools.probes.cp_variants", "--quick"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": "."})


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Future]:
    """The bench's parts (name -> its benchmarks.md once it has run) and the CP variants'
    probe, started together when the first test needs them: each is mostly one busy core
    (start-up, one process's steps, the pictures), so two cores run them side by side."""
    def bench(parts: str, out: Path) -> Path:
        _bench(out, parts)
        return out

    with ThreadPoolExecutor(len(PARTS) + 1) as pool:
        started = {name: pool.submit(bench, parts,
                                     tmp_path_factory.mktemp(name) / "benchmarks.md")
                   for name, parts in PARTS.items()}
        yield {**started, "cp_variants": pool.submit(_cp_variants)}


def test_a_pipeline_peer_torch_cannot_run_on_gloo_is_named_not_run(monkeypatch):
    """torch 2.11's ScheduleZBVZeroBubble fails its own start-up on gloo (a message from a
    rank to itself); the bench says so and compares the other schedules, instead of exiting
    1. Every schedule's peer runs on the torch installed here where it is 2.12 or later."""
    import torch

    assert torch.__version__ < "2.12" or all(bench_pp.peer_refused(s) is None
                                             for s in bench_pp.PEERS)
    monkeypatch.setattr(torch, "__version__", torch.torch_version.TorchVersion("2.11.0+cu130"))
    refused = {s: why for s in bench_pp.PEERS if (why := bench_pp.peer_refused(s))}
    assert list(refused) == ["zb-v"]
    assert "2.11.0+cu130" in refused["zb-v"] and "2.12" in refused["zb-v"]
    assert bench_pp.peer_refused("zb-v", "cuda") is None  # gloo's refusal only


def test_bench_quick_writes_table_and_json(runs):
    out = runs["suites"].result()
    rows = json.loads(out.with_suffix(".json").read_text())["rows"]
    peers = " ".join(r["peer"] for r in rows)
    expected = ["plain PyTorch loop", "DDP", "FSDP2", "DTensor",
                *(bench_pp.PEERS[s] for s in bench_pp.PEERS if bench_pp.peer_refused(s) is None),
                "private API (torch.distributed.tensor.experimental._attention."
                "_templated_ring_attention, rotate alltoall)", "rotate allgather"]
    for peer in expected:
        assert peer in peers, peer
    # the CP rows ran only after every side matched unsharded attention (else the bench fails)
    cp_rows = [r for r in rows if r["suite"] == "cp"]
    assert [r["paraxis"] for r in cp_rows] == ["paraxis ring", "paraxis all_gather"]
    assert all("of unsharded)" in r["name"] for r in cp_rows)
    assert all(r["paraxis_tokens_per_s"] > 0 and r["peer_tokens_per_s"] > 0 for r in rows)
    table = out.read_text()
    assert "| work | ranks |" in table
    assert table.count("\n| ") == len(rows) + 1  # header plus one line per row


def test_bench_quick_calibrates_predicts_and_draws_scaling(runs):
    out = runs["sections"].result()
    doc = json.loads(out.with_suffix(".json").read_text())
    assert doc["rows"] == [] and set(doc["sections"]) == {"calibrate", "predicted", "scaling"}
    profile = json.loads((out.parent / "hardware-profile.json").read_text())
    assert profile == doc["sections"]["calibrate"]
    predicted = doc["sections"]["predicted"]
    assert len(predicted["rows"]) == len(QUICK_LAYOUTS)
    for row in predicted["rows"]:
        assert row["measured_step_s"] > 0 and row["predicted_step_s"] > 0
        assert row["error"] == row["predicted_step_s"] / row["measured_step_s"] - 1
    points = doc["sections"]["scaling"]["points"]
    assert {(p["kind"], p["axis"]) for p in points} == {
        (k, a) for k in ("dp", "pp") for a in ("hidden", "ranks")}
    assert (out.parent / "img" / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = out.read_text()
    for heading in ("## Calibration", "## Predicted vs measured", "## Scaling"):
        assert heading in text
    assert "![step time vs hidden size and vs ranks](img/scaling.png)" in text
    assert f"of {len(QUICK_LAYOUTS)} layouts within 25%" in text

    # a part run alone keeps the others' last results
    _bench(out, "calibrate")
    again = json.loads(out.with_suffix(".json").read_text())
    assert again["sections"]["predicted"] == predicted
    assert again["sections"]["calibrate"] != doc["sections"]["calibrate"]


def test_bench_quick_gpu_part_runs_its_code_without_a_gpu(runs):
    out = runs["gpu"].result()
    section = json.loads(out.with_suffix(".json").read_text())["sections"]["gpu"]
    # without CUDA the quick part runs every side's step on the CPU, uncompiled (no peak
    # known: no MFU); transformers is a peer where it is installed, torchao's float8
    # reference a side where torchao is
    assert [r["model"] for r in section["runs"]] == ["tiny", "tiny-llama"]
    for run in section["runs"]:
        sides = run["sides"]
        assert set(sides) == {"paraxis", "paraxis --compile", "paraxis fp8 --compile",
                              "reference", "transformers", "reference fp8",
                              "paraxis --compile --fused-loss",
                              "paraxis autocast-bf16 --compile"}
        for side in ("paraxis", "paraxis --compile", "paraxis fp8 --compile", "reference"):
            assert sides[side]["tokens_per_s"] > 0 and sides[side]["mfu"] is None, side
        assert sides["reference"]["ratio_to_best_peer"] <= 1.0
    assert "## One GPU" in out.read_text()
    # the host's CPU beside the figures: a step of few tokens is the host's
    assert section["host_cpu"] and f"host CPU {section['host_cpu']};" in out.read_text()


def test_cp_bench_sides_equal_unsharded_attention():
    """The CP bench's four sides (paraxis ring and all_gather, PyTorch's template rotating
    by all-to-all and by all-gather) give unsharded attention's output and gradients, here
    at 4 ranks with grouped-query attention (the quick bench runs 2 ranks, equal heads)."""
    errors = bench_cp.check(cp=4, seq=128, heads=4, kv_heads=2)
    assert set(errors) == {"paraxis ring", "paraxis all_gather", "alltoall", "allgather"}
    assert max(errors.values()) < 1e-5, errors


def test_cp_variants_bench_quick_prints_a_row_per_variant(runs):
    """`python -m tools.probes.cp_variants --quick`: checks the three variants against unsharded
    attention, then times all_to_all and all_gather against the ring."""
    result = runs["cp_variants"].result()
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [line for line in result.stdout.splitlines() if line.startswith("| causal")]
    assert [row.split(" | ")[1] for row in rows] == ["all_to_all", "all_gather"]
    assert all(float(row.split(" | ")[4].split()[0]) > 0 for row in rows)


def test_expert_tp_bench_quick_prints_measured_and_planned_speed():
    """`python -m tools.probes.expert_tp --quick`: checks etp=1 and etp=2 give one loss, then times
    them against each other beside the planner's ratio on the calibrated profile. The check
    that can fail is the loss equality inside `rows` (it raises); the ratios only have to
    exist, as the tiny model's timings on a shared machine prove nothing either way."""
    from tools.probes.expert_tp import rows

    measured, predicted = rows(quick=True)
    assert measured.ratio > 0 and predicted > 0


def test_a_bench_output_that_cannot_be_written_is_refused_before_anything_runs(tmp_path):
    """`python -m bench --out` names the report's file, `python -m bench.gpu --out` a
    folder: a folder for the first, or a file for the second (or a path through a file), is
    a one-line error with exit 2 before any part runs, and nothing is written."""
    from bench.__main__ import main

    blocker = tmp_path / "file"
    blocker.write_text("kept")
    (tmp_path / "taken.json").mkdir()  # where the report's figures would go
    for out in (tmp_path, blocker / "benchmarks.md", tmp_path / "taken.md",
                tmp_path / "report.json"):
        with pytest.raises(SystemExit) as exit_:
            main(["--only", "dp", "--out", str(out)])
        assert exit_.value.code == 2
    result = subprocess.run([sys.executable, "-m", "bench.gpu", "--quick", "--out",
                             str(blocker)], capture_output=True, text=True, timeout=120,
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": "."})
    assert result.returncode == 2 and "give a folder" in result.stderr, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "taken.json"]
    assert blocker.read_text() == "kept"
