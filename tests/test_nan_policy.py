"""Numerical faults: a NaN/inf loss or gradient is caught on its step; `--on-nan skip` leaves
weights and optimizer state untouched and goes on, `--on-nan stop` exits non-zero naming the
step. Faults are injected into the real forward pass (`PARAXIS_FAULT=nan:step=S`, the token
embedding's output becomes NaN) or come from a genuinely diverging learning rate."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

import paraxis.parallelize as build
from paraxis.train.config import RunConfig
from paraxis.train.loop import run_training
from paraxis.train.nan_policy import NumericalFault, nonfinite

ROOT = Path(__file__).resolve().parents[1]
# Constant learning rate (no warmup, no decay), so runs of different lengths take the same
# steps and their weights can be compared bit for bit.
COMMON = dict(model="tiny", global_batch=4, seq_len=32, device="cpu", quiet=True,
              warmup=0, min_lr_ratio=1.0)
CLI = ["--model", "tiny", "--global-batch", "4", "--seq-len", "32", "--device", "cpu",
       "--quiet", "--warmup", "0"]


def test_verdicts():
    assert nonfinite(2.5, 1.0) is None
    assert nonfinite(math.nan, 1.0) == "loss is nan"
    assert nonfinite(2.5, math.inf) == "gradient norm is inf"
    assert nonfinite(2.5, math.inf, overflow_handled=True) is None  # fp16 scaler's business
    assert nonfinite(math.inf, math.inf, overflow_handled=True) == "loss is inf"


def train(monkeypatch, fault: str | None, **overrides) -> tuple[list[dict], object]:
    """run_training, keeping hold of the engine it builds."""
    engines = []
    real = build.build_engine
    monkeypatch.setattr(build, "build_engine",
                        lambda *a, **k: engines.append(real(*a, **k)) or engines[-1])
    if fault:
        monkeypatch.setenv("PARAXIS_FAULT", fault)
    else:
        monkeypatch.delenv("PARAXIS_FAULT", raising=False)
    records = run_training(RunConfig.from_flags(**{**COMMON, **overrides}))
    return records, engines[0]


def test_skip_leaves_weights_and_optimizer_state_untouched(monkeypatch):
    skipped, engine = train(monkeypatch, "nan:step=2", steps=3, on_nan="skip")
    assert skipped[2]["skipped"] == "loss is nan"
    assert all("skipped" not in r for r in skipped[:2])
    reference, ref_engine = train(monkeypatch, None, steps=2)
    for (name, p), q in zip(engine.model.named_parameters(), ref_engine.model.parameters(),
                            strict=True):
        assert torch.equal(p, q), name
    for p, q in zip(engine.model.parameters(), ref_engine.model.parameters(), strict=True):
        mine, theirs = engine.optimizer.state[p], ref_engine.optimizer.state[q]
        assert float(mine["step"]) == float(theirs["step"]) == 2
        assert torch.equal(mine["exp_avg"], theirs["exp_avg"])
        assert torch.equal(mine["exp_avg_sq"], theirs["exp_avg_sq"])
    assert [r["loss"] for r in skipped[:2]] == [r["loss"] for r in reference]


def test_skip_goes_on_training_after_the_bad_step(monkeypatch):
    records, _ = train(monkeypatch, "nan:step=1", steps=5, on_nan="skip")
    assert [("skipped" in r) for r in records] == [False, True, False, False, False]
    assert all(math.isfinite(r["loss"]) for i, r in enumerate(records) if i != 1)


def test_a_genuinely_diverging_run_stops_on_the_step_it_diverges(monkeypatch):
    """No injection: lr 1e4 makes step 0's update blow the weights up; step 1's gradient
    is NaN and is caught before it is applied."""
    monkeypatch.delenv("PARAXIS_FAULT", raising=False)
    with pytest.raises(NumericalFault, match=r"^step 1: gradient norm is nan; stopped"):
        run_training(RunConfig.from_flags(**{**COMMON, "lr": 1e4, "grad_clip": 0.0}, steps=3))


# The command-line runs, each in its own folder: one that stops, and one rank's NaN on two
# ranks that every rank must skip, for two layouts. They are mostly process start-up, so they
# run side by side, all started when the first test needs them.
# name: (flags, the fault)
LAUNCHED = {
    "stop": ([*CLI, "--steps", "5"], "nan:step=2"),
    # one dp rank's NaN reaches the other's all-reduce
    "dp": ([*CLI, "--steps", "4", "--nproc", "2", "--dp", "2", "--on-nan", "skip"],
           "nan:step=1,rank=1"),
    # crosses the stage boundary
    "pp": ([*CLI, "--steps", "4", "--nproc", "2", "--pp", "2", "--microbatches", "2",
            "--on-nan", "skip"], "nan:step=1,rank=0"),
}


def launch(flags: list[str], fault: str, folder: Path
           ) -> tuple[subprocess.CompletedProcess, Path]:
    """`python -m paraxis train FLAGS` with PARAXIS_FAULT: how it ended, its metrics file."""
    metrics = folder / "m.jsonl"
    result = subprocess.run(
        [sys.executable, "-m", "paraxis", "train", *flags, "--metrics-file", str(metrics)],
        capture_output=True, text=True, timeout=240,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PARAXIS_FAULT": fault})
    return result, metrics


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Future]:
    """Every run of LAUNCHED, started together: each test takes its own."""
    with ThreadPoolExecutor(len(LAUNCHED)) as pool:
        yield {name: pool.submit(launch, flags, fault, tmp_path_factory.mktemp(name))
               for name, (flags, fault) in LAUNCHED.items()}


def test_stop_exits_non_zero_naming_the_step(launched):
    result, metrics = launched["stop"].result()
    assert result.returncode == 3
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "paraxis: error: step 2: loss is nan; stopped before it changed the weights "
        "(--on-nan stop)"), result.stderr
    assert "--on-nan skip" in lines[0]
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == [0, 1]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dp", "pp"])
def test_every_rank_skips_the_same_step(launched, monkeypatch, name):
    result, metrics = launched[name].result()
    assert result.returncode == 0, result.stderr[-3000:]
    assert ("paraxis: warning: step 1: loss is nan; step skipped (--on-nan skip), weights "
            "unchanged") in result.stderr
    launched = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [("skipped" in r) for r in launched] == [False, True, False, False]
    # strict JSON (no NaN or Infinity, which JavaScript's and jq's parsers refuse): the
    # skipped step's loss is null, and `skipped` says what it was
    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    assert [json.loads(line, parse_constant=refuse)["step"]
             for line in metrics.read_text().splitlines()] == [0, 1, 2, 3]
    assert launched[1]["loss"] is None and launched[1]["skipped"] == "loss is nan"
    single, _ = train(monkeypatch, "nan:step=1", steps=4, on_nan="skip", min_lr_ratio=0.1)
    for a, b in zip(launched, single, strict=True):
        if "skipped" not in a:
            assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)


def test_a_stopped_run_keeps_only_good_checkpoints(monkeypatch, tmp_path):
    from paraxis.model.checkpoint import complete_checkpoints, read_full_state

    with pytest.raises(NumericalFault, match="step 3"):
        train(monkeypatch, "nan:step=3", steps=6, on_nan="stop", checkpoint_every=1,
              checkpoint_dir=str(tmp_path))
    # Steps 0-2 were good (checkpoints 1-3); step 3 was NaN and never reached a save.
    assert [step for step, _ in complete_checkpoints(tmp_path)] == [1, 2, 3]
    _, params = read_full_state(tmp_path)
    assert all(torch.isfinite(t).all() for t in params.values())


def test_an_fp16_overflow_skip_is_said_and_recorded(capsys):
    # lr 0.3 without clipping overflows tiny's fp16 gradients within a few steps: the loss
    # scaler skips those steps (not a fault), and the run says so, as --on-nan skip does
    cfg = RunConfig.from_flags(model="tiny", steps=5, global_batch=4, seq_len=32, lr=0.3,
                               warmup=0, grad_clip=0.0, precision="fp16", quiet=True)
    records = run_training(cfg)
    lowered = [r for r, before in zip(records[1:], records, strict=False)
               if r["loss_scale"] < before["loss_scale"]]
    assert lowered and all(r.get("skipped", "").startswith("fp16 gradients overflowed")
                           for r in lowered)
    assert sum("skipped" in r for r in records) == len(lowered) + (
        records[0]["loss_scale"] < 2.0**16)
    err = capsys.readouterr().err
    assert err.count("fp16 gradients overflowed; step skipped, loss scale lowered") == \
        sum("skipped" in r for r in records)
