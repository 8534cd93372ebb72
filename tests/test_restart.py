"""Automatic restart: SIGKILL one rank of a 4-rank run at a random step; with --max-restarts
the run finishes, and its final weights equal an uninterrupted run's bit for bit."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from paraxis.dist.rank_server import rank_pids
from paraxis.model.checkpoint import read_full_state
from paraxis.model.checkpoint.entries import KINDS

ROOT = Path(__file__).resolve().parents[1]


def _command(root: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "paraxis", "train", "--nproc", "4", "--dp", "2", "--pp", "2",
            "--zero", "1", "--microbatches", "2", "--model", "tiny", "--steps", "8",
            "--global-batch", "8", "--seq-len", "32", "--checkpoint-dir", str(root / "ckpt"),
            "--checkpoint-every", "2", "--metrics-file", str(root / "metrics.jsonl"),
            "--quiet", *extra]


def _steps_logged(metrics: Path) -> int:
    return len(metrics.read_text().splitlines()) if metrics.exists() else 0


def _torchrun(root: Path, *extra: str, env: dict) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", *extra,
               "-m", "paraxis.train", "--dp", "2", "--zero", "1", "--model", "tiny",
               "--steps", "6", "--global-batch", "4", "--seq-len", "32",
               "--checkpoint-dir", str(root), "--checkpoint-every", "2", "--quiet"]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=170)


@pytest.fixture(scope="module")
def straight_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Future, Path]]:
    """The uninterrupted runs both tests compare with, started together in the background
    when the first test starts (a run's start-up leaves a core idle now and then, which the
    other run and the first test's faulty run take): name -> (its process, its folder)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    nproc, torchrun = tmp_path_factory.mktemp("nproc"), tmp_path_factory.mktemp("torchrun")
    with ThreadPoolExecutor(2) as pool:
        yield {"nproc": (pool.submit(subprocess.run, _command(nproc), env=env,
                                     capture_output=True, text=True, timeout=170), nproc),
               "torchrun": (pool.submit(_torchrun, torchrun, env=env), torchrun)}


@pytest.mark.slow
def test_a_killed_rank_restarts_and_ends_bit_identical(straight_runs, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    seed = random.randrange(1_000_000)
    chooser = random.Random(seed)
    kill_after, victim = chooser.randint(1, 6), chooser.randrange(4)
    faulty = tmp_path / "faulty"
    run = subprocess.Popen(_command(faulty, "--max-restarts", "2"), env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    killed = None
    while time.monotonic() < deadline and run.poll() is None:
        workers = rank_pids(run.pid)
        if _steps_logged(faulty / "metrics.jsonl") >= kill_after and len(workers) == 4:
            killed = sorted(workers)[victim]
            os.kill(killed, signal.SIGKILL)
            break
        time.sleep(0.05)
    _, stderr = run.communicate(timeout=170)
    context = f"seed {seed}: killed worker {victim} after step {kill_after}\n{stderr}"
    assert killed is not None, context
    assert run.returncode == 0, context
    straight, folder = straight_runs["nproc"]
    assert straight.result().returncode == 0, straight.result().stderr
    expected = read_full_state(folder / "ckpt", KINDS)[1]
    got = read_full_state(faulty / "ckpt", KINDS)[1]
    assert sorted(got) == sorted(expected)
    for name in expected:
        assert torch.equal(got[name], expected[name]), f"{name} ({context})"


@pytest.mark.slow
def test_torchrun_max_restarts_resumes_from_the_newest_checkpoint(straight_runs, tmp_path):
    """The same under torchrun's own --max-restarts: each restarted attempt must get fresh
    process-group keys in the agent's store (dist/groups.py), or it cannot connect."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PARAXIS_FAULT": "kill:rank=1,step=3"}
    restarted = _torchrun(tmp_path / "restarted", "--max-restarts", "1", env=env)
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    assert "exitcode: -9" in restarted.stderr  # the fault really fired (SIGKILL)
    straight, folder = straight_runs["torchrun"]
    assert straight.result().returncode == 0, straight.result().stderr
    expected = read_full_state(folder, KINDS)[1]
    got = read_full_state(tmp_path / "restarted", KINDS)[1]
    assert all(torch.equal(got[name], expected[name]) for name in expected)


def test_one_process_with_max_restarts_is_restarted_and_a_finished_run_stays_finished(
        tmp_path):
    """--max-restarts without --nproc runs the one rank under the launcher, which restarts
    it (it once died for good: only --nproc runs had a launcher); and a restart that finds
    the final checkpoint written ends the run complete (exit 0), where it was refused as
    bad input (exit 2) for asking no steps more."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def train(root: Path, *extra: str, fault: str | None = None
              ) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "paraxis", "train", "--model", "tiny", "--steps", "4",
             "--global-batch", "4", "--seq-len", "32", "--checkpoint-dir", str(root / "ckpt"),
             "--checkpoint-every", "2", "--quiet", *extra],
            env={**env, **({"PARAXIS_FAULT": fault} if fault else {})},
            capture_output=True, text=True, timeout=170)

    # bit for bit the run of one process alone: the launched rank computes on the same
    # threads (several CPU ranks take one each)
    straight = train(tmp_path / "straight")
    restarted = train(tmp_path / "restarted", "--max-restarts", "1", fault="kill:rank=0,step=3")
    assert straight.returncode == 0 and restarted.returncode == 0, restarted.stderr
    assert "restarting every rank" in restarted.stderr
    want, got = (read_full_state(root / "ckpt" / "step-00000004", kinds=KINDS)[1]
                 for root in (tmp_path / "straight", tmp_path / "restarted"))
    assert sorted(got) == sorted(want) and all(torch.equal(got[k], want[k]) for k in want)
    # the launcher's restart of a run whose final checkpoint exists: complete, exit 0
    done = train(tmp_path / "straight", "--resume", str(tmp_path / "straight" / "ckpt"),
                 fault=None)
    assert done.returncode == 2  # asked as a fresh command: nothing to train, said so
    again = subprocess.run(
        [sys.executable, "-m", "paraxis", "train", "--model", "tiny", "--steps", "4",
         "--global-batch", "4", "--seq-len", "32", "--resume",
         str(tmp_path / "straight" / "ckpt"), "--quiet"],
        env={**env, "TORCHELASTIC_RESTART_COUNT": "1"}, capture_output=True, text=True,
        timeout=170)
    assert again.returncode == 0, again.stderr
