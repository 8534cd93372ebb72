"""Three trials of the fault matrix (`bench/faults.py`; the whole matrix is `python -m bench
--only faults`) and the preemption of a launcher, against one uninterrupted run (2 ranks,
dp2 ZeRO-1): each run must end bit-identical to it (weights and AdamW moments), leave no
process behind and lose no checkpoint.

- A rank SIGKILLed between its shard file and the manifest of a save, in backward, and as
  it enters a collective: the run restarts itself (--max-restarts).
- SIGTERM to the `--nproc` launcher saves a checkpoint at the next step boundary and stops
  every rank (exit code 143, one line); SIGKILL of the launcher leaves no orphan (the ranks
  get SIGTERM from the kernel, save and stop); the run then resumes, taking over the dead
  launcher's lock, with each step in the metrics once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from bench import faults
from paraxis.dist.rank_server import rank_pids
from paraxis.files.checkpoint_ownership import pid_alive
from paraxis.model.checkpoint import complete_checkpoints

ROOT = Path(__file__).resolve().parents[1]
STEPS = 12  # room for two interruptions two steps apart, and a step after them


@pytest.fixture(scope="module")
def expected(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return faults.straight(2, tmp_path_factory.mktemp("faults") / "straight", STEPS)


@pytest.mark.slow
def test_three_seeded_kills_resume_exactly_with_no_orphan_and_no_checkpoint_lost(
        expected, tmp_path):
    # the three run side by side, each in its own folder: a trial is mostly process start-up
    # and waits, so together they take little more than the longest
    with ThreadPoolExecutor(3) as pool:
        trials = list(pool.map(lambda index, phase: faults.kill_trial(
            25 + index, 2, expected, tmp_path / f"kill-{index}", phase, STEPS),
            range(3), ("save", "backward", "collective")))
    for trial in trials:
        assert trial["restarted"], trial  # the fault fired and the launcher restarted
        assert trial["exit_code"] == 0 and trial["exact"], trial
        assert trial["orphans"] == 0 and trial["intact"] and not trial["foreign"], trial


def _steps_logged(folder: Path) -> int:
    path = folder / "m.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def _interrupt(folder: Path, sig: signal.Signals, *extra: str) -> tuple[int, str, list[int]]:
    """Start the run, send `sig` to the launcher once two more steps are logged; return its
    exit code, its stderr and its ranks' pids."""
    logged = _steps_logged(folder)
    launcher = subprocess.Popen(faults.command(2, *extra, steps=STEPS), cwd=folder,
                                env={**os.environ, "PYTHONPATH": str(ROOT)},
                                stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 150
    while _steps_logged(folder) < logged + 2 and launcher.poll() is None:
        assert time.monotonic() < deadline, "the run did not start"
        time.sleep(0.05)
    ranks = rank_pids(launcher.pid)
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
def test_preempted_and_killed_launchers_save_stop_their_ranks_and_resume_exactly(
        expected, tmp_path):
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

    resumed = subprocess.run(faults.command(2, "--resume", "auto", steps=STEPS), cwd=tmp_path,
                             env={**os.environ, "PYTHONPATH": str(ROOT)},
                             capture_output=True, text=True, timeout=170)
    assert resumed.returncode == 0, resumed.stderr
    assert "paraxis: taking over checkpoint folder ck from dead run" in resumed.stderr
    steps = [line.split('"step": ')[1].split(",")[0]
             for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert steps == [str(s) for s in range(STEPS)]  # each step once, after two interruptions
    got = faults.final_state(tmp_path)
    assert sorted(got) == sorted(expected)
    assert all(torch.equal(got[name], expected[name]) for name in expected)
