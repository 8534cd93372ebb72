"""A frozen rank (SIGSTOP: its heartbeat thread stops with it) is named as the silent one in
the stall line, at the step the run is stuck in, while its peer waits for it; no traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from paraxis.dist.rank_server import rank_pids

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_a_stopped_rank_is_named_silent_at_the_step_it_stopped(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    launcher = subprocess.Popen(
        [sys.executable, "-m", "paraxis", "train", "--nproc", "2", "--model", "tiny",
         "--steps", "100000", "--global-batch", "4", "--seq-len", "32", "--device", "cpu",
         "--quiet", "--timeout-s", "8", "--metrics-file", "m.jsonl"],
        cwd=tmp_path, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(
        line.rstrip("\n") for line in launcher.stderr))
    reader.start()
    metrics = tmp_path / "m.jsonl"
    try:
        deadline = time.monotonic() + 150
        while not metrics.exists() or len(metrics.read_text().splitlines()) < 3:
            assert time.monotonic() < deadline and launcher.poll() is None, "\n".join(lines)
            time.sleep(0.05)
        ranks = rank_pids(launcher.pid)
        os.kill(ranks[1], signal.SIGSTOP)
        # Once the stall line names it, the frozen rank is killed (a run that ends itself
        # when a wait times out is tests/test_hang.py's); else rank 0's wait times out.
        deadline = time.monotonic() + 120
        while launcher.poll() is None and time.monotonic() < deadline and not any(
                "rank 1 silent" in line or "(silent (no heartbeat))" in line for line in lines):
            time.sleep(0.05)
        if launcher.poll() is None:
            os.kill(ranks[1], signal.SIGKILL)
        code = launcher.wait(timeout=120)
    finally:
        launcher.kill()
        reader.join(timeout=10)
    text = "\n".join(lines)
    assert code != 0 and "Traceback" not in text, text
    stalls = [line for line in lines if line.startswith("paraxis: stalled at step ")]
    assert stalls, text
    last = stalls[-1]
    assert "rank 1 silent (no heartbeat)" in last or (
        "rank 1 no progress" in last and "(silent (no heartbeat))" in last), text
    step = int(last.split("paraxis: stalled at step ")[1].split(":")[0])
    logged = len(metrics.read_text().splitlines())
    assert step in (logged - 1, logged), f"stalled at step {step}, {logged} steps logged"
    assert "rank 0 waiting" in last, text  # the peer is shown waiting, not as the culprit
