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


def test_sighup_and_sigint_stop_like_sigterm_and_a_second_ctrl_c_stops_at_once():
    """Every signal of SIGNALS sets the flag (a closed terminal, Ctrl-C), the exit code is
    128 + its number, and a second SIGINT raises at once (`runtime/preemption.py`)."""
    from paraxis.runtime.preemption import Preempted, StopRequest

    for sig in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
        with StopRequest() as stop:
            os.kill(os.getpid(), sig)
            time.sleep(0.01)  # Python runs the handler at the next bytecode boundary
            assert stop.agreed(torch.device("cpu")) == sig  # a single process: its own flag
        error = Preempted(sig, 4, "ck/step-00000004")
        assert error.exit_code == 128 + sig and error.same_on_every_rank
        assert str(error).startswith(f"stopped by {sig.name} after step 4; saved ck/")
    with pytest.raises(KeyboardInterrupt), StopRequest():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_DFL  # the handlers were put back


def test_the_launcher_passes_each_signal_to_its_ranks_as_sigterm():
    """SIGHUP or SIGINT to the launcher reaches each rank as SIGTERM (which saves a
    checkpoint; a second SIGINT would not); a second signal SIGKILLs them."""
    from paraxis.runtime.launch import _PassSignals

    for first in (signal.SIGHUP, signal.SIGINT):
        children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
                    for _ in range(2)]
        for child in children:
            child.exitcode = None  # what multiprocessing.Process offers the launcher
        with _PassSignals(children) as passing:
            os.kill(os.getpid(), first)
            time.sleep(0.01)
            assert passing.signum == first
            assert [child.wait(timeout=30) for child in children] == [-signal.SIGTERM] * 2
        children = [subprocess.Popen([sys.executable, "-c", "import signal, time; "
                                      "signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                      "print('ready', flush=True); time.sleep(60)"],
                                     stdout=subprocess.PIPE, text=True)]
        children[0].exitcode = None
        assert children[0].stdout.readline() == "ready\n"
        with _PassSignals(children):
            os.kill(os.getpid(), first)
            time.sleep(0.3)
            os.kill(os.getpid(), first)  # a rank that does not stop: the second one kills
            time.sleep(0.01)
            assert children[0].wait(timeout=30) == -signal.SIGKILL
