"""Preemption's signals: SIGTERM, SIGHUP and SIGINT each stop a run at a step boundary
(`dist/preemption.py`), and the `--nproc` launcher passes them on to its ranks. The end
to end test (SIGTERM, then SIGKILL of the launcher, then a resume that ends bit-identical)
shares its uninterrupted reference run with the fault trials in `tests/test_faults.py`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch


def test_sighup_and_sigint_stop_like_sigterm_and_a_second_ctrl_c_stops_at_once():
    """Every signal of SIGNALS sets the flag (a closed terminal, Ctrl-C), the exit code is
    128 + its number, and a second SIGINT raises at once (`dist/preemption.py`)."""
    from paraxis.dist.preemption import Preempted, StopRequest

    hangup = signal.getsignal(signal.SIGHUP)  # SIG_IGN under nohup
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
    assert signal.getsignal(signal.SIGHUP) is hangup  # the handlers were put back


def test_the_launcher_passes_each_signal_to_its_ranks_as_sigterm():
    """SIGHUP or SIGINT to the launcher reaches each rank as SIGTERM (which saves a
    checkpoint; a second SIGINT would not); a second signal SIGKILLs them."""
    from paraxis.dist.launch import _PassSignals

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


def test_the_launcher_ends_as_the_signal_it_received():
    """The ranks received SIGTERM from the launcher whatever the launcher received; their
    line and exit code then say the launcher's signal: 130 for Ctrl-C, 129 for a closed
    terminal, as a shell reports them. Other lines pass unchanged."""
    from paraxis.dist.launch import _as_received

    said = {"stopped by SIGTERM after step 3; saved ck/step-00000003": 143,
            "the data is bad": 2}
    assert _as_received(said, signal.SIGINT) == {
        "stopped by SIGINT after step 3; saved ck/step-00000003": 130, "the data is bad": 2}
    assert set(_as_received(said, signal.SIGHUP).values()) == {129, 2}
    assert _as_received(said, signal.SIGTERM) == said


@pytest.mark.slow
def _catches_sigterm(pid: int) -> bool:
    """Whether process `pid` has a handler for SIGTERM (Linux: SigCgt in /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    return False


def test_a_stop_signal_is_heard_inside_a_long_evaluation(tmp_path):
    """An evaluation of 1e11 held-out batches: SIGTERM stops it within EVAL_STOP_EVERY
    batches, with the step's checkpoint (before, it was heard only after the evaluation)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    run = subprocess.Popen(
        [sys.executable, "-m", "paraxis", "train", "--steps", "5", "--quiet", "--seq-len", "32",
         "--global-batch", "4", "--device", "cpu", "--eval-every", "1", "--eval-batches",
         "100000000000", "--checkpoint-dir", str(tmp_path / "ck")],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": root}, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not _catches_sigterm(run.pid):  # the training loop's handler is in place
        assert run.poll() is None and time.monotonic() < deadline, "the run did not start"
        time.sleep(0.05)
    time.sleep(2)  # the first step (a tiny model's), then well into its evaluation
    run.send_signal(signal.SIGTERM)
    _, stderr = run.communicate(timeout=60)
    assert run.returncode == 143, stderr
    assert "stopped by SIGTERM after step" in stderr and "saved" in stderr, stderr
