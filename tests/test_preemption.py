"""Preemption, end to end: SIGTERM to the `--nproc` launcher saves a checkpoint at the next
step boundary and stops every rank (exit code 143, one line); SIGKILL of the launcher leaves
no orphan (the ranks get SIGTERM from the kernel, save and stop); the run then resumes,
taking over the dead launcher's lock, and ends bit-identical to an uninterrupted run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from paraxis.checkpoint import complete_checkpoints, read_full_state
from paraxis.checkpoint.entries import KINDS
from paraxis.checkpoint.ownership import pid_alive
from paraxis.config import RunConfig
from paraxis.testing import RankContext, run_on_ranks
from paraxis.train import run_training

ROOT = Path(__file__).resolve().parents[1]
STEPS = 12
TRAIN = ["train", "--nproc", "2", "--dp", "2", "--zero", "1", "--model", "tiny", "--steps",
         str(STEPS), "--global-batch", "4", "--seq-len", "32", "--device", "cpu", "--quiet",
         "--checkpoint-dir", "ck", "--metrics-file", "m.jsonl"]


def _straight(ctx: RankContext, folder: str) -> None:
    run_training(RunConfig.from_flags(model="tiny", steps=STEPS, global_batch=4, seq_len=32,
                                      device="cpu", quiet=True, layout=ctx.layout,
                                      checkpoint_dir=folder))


def _steps_logged(folder: Path) -> int:
    path = folder / "m.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def _interrupt(folder: Path, sig: signal.Signals, *extra: str) -> tuple[int, str, list[int]]:
    """Start the run, send `sig` to the launcher once two more steps are logged; return its
    exit code, its stderr and its ranks' pids."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    logged = _steps_logged(folder)
    launcher = subprocess.Popen([sys.executable, "-m", "paraxis", *TRAIN, *extra], cwd=folder,
                                env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 150
    while _steps_logged(folder) < logged + 2 and launcher.poll() is None:
        assert time.monotonic() < deadline, "the run did not start"
        time.sleep(0.05)
    children = Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children").read_text().split()
    ranks = [int(pid) for pid in children
             if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    launcher.send_signal(sig)
    _, stderr = launcher.communicate(timeout=150)
    return launcher.returncode, stderr, ranks


def _gone(pids: list[int], within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while any(pid_alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


@pytest.mark.slow
def test_preempted_and_killed_launchers_save_stop_their_ranks_and_resume_exactly(tmp_path):
    run_on_ranks("dp=2,zero=1", _straight, str(tmp_path / "straight"))

    code, stderr, ranks = _interrupt(tmp_path, signal.SIGTERM)
    saved = [step for step, _ in complete_checkpoints(tmp_path / "ck")]
    assert code == 143, stderr
    assert len(ranks) == 2 and _gone(ranks, 5), "ranks outlived their launcher"
    assert stderr.strip().splitlines() == [
        f"paraxis: error: stopped by SIGTERM after step {saved[-1]}; saved "
        f"ck/step-{saved[-1]:08d}; continue with --resume auto"], stderr
    assert 2 <= saved[-1] < STEPS and not (tmp_path / "ck" / "run.lock").exists()

    code, stderr, ranks = _interrupt(tmp_path, signal.SIGKILL, "--resume", "auto")
    assert code == -signal.SIGKILL
    assert _gone(ranks, 60), "orphan ranks after SIGKILL of the launcher"
    after = [step for step, _ in complete_checkpoints(tmp_path / "ck")]
    assert after[-1] > saved[-1], "the orphaned ranks did not save on their way out"

    resumed = subprocess.run([sys.executable, "-m", "paraxis", *TRAIN, "--resume", "auto"],
                             cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
                             capture_output=True, text=True, timeout=170)
    assert resumed.returncode == 0, resumed.stderr
    assert "paraxis: taking over checkpoint folder ck from dead run" in resumed.stderr
    steps = [line.split('"step": ')[1].split(",")[0]
             for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert steps == [str(s) for s in range(STEPS)]  # each step once, after two interruptions
    expected = read_full_state(tmp_path / "straight", KINDS)[1]
    got = read_full_state(tmp_path / "ck", KINDS)[1]
    assert sorted(got) == sorted(expected)
    assert all(torch.equal(got[name], expected[name]) for name in expected)
