"""No silent hangs, end to end: a rank stops before a collective (or a pipeline message) and
the run ends by itself, every waiting rank naming its wait, within timeout + 30 s.

The stall is real: `PARAXIS_FAULT=hang:rank=R,step=S` makes rank R sleep forever at step S
(`paraxis/train/faults.py`); everything after that is the shipped code path.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ["train", "--model", "tiny", "--steps", "4", "--global-batch", "8", "--seq-len", "32",
         "--device", "cpu", "--quiet"]


def run_with_timestamps(args: list[str], fault: str, cwd: Path) -> tuple[int, list, float]:
    """Run `python -m paraxis ARGS` with PARAXIS_FAULT; return its exit code, its stderr lines
    with the time each arrived, and the time it exited."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PARAXIS_FAULT": fault}
    process = subprocess.Popen([sys.executable, "-m", "paraxis", *args], cwd=cwd, env=env,
                               stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    lines: list[tuple[float, str]] = []
    reader = threading.Thread(target=lambda: lines.extend(
        (time.monotonic(), line.rstrip("\n")) for line in process.stderr))
    reader.start()
    try:
        code = process.wait(timeout=240)
    finally:
        process.kill()
    exited = time.monotonic()
    reader.join(timeout=10)
    return code, lines, exited


# The two runs below are mostly waits (for the timeout, the heartbeat, the watchdog), so
# they run side by side, both started when the first of the two tests needs them.
# name: (--timeout-s, the layout's flags, the fault)
HUNG = {"collective": (5, ["--nproc", "4", "--dp", "4"], "hang:rank=2,step=1"),
        "stage": (4, ["--nproc", "2", "--pp", "2", "--microbatches", "2"], "hang:rank=1,step=1")}


@pytest.fixture(scope="module")
def hung_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Future]:
    """Both runs, started together: each test takes its own (exit code, stderr lines with
    their arrival times, exit time)."""
    with ThreadPoolExecutor(2) as pool:
        yield {name: pool.submit(run_with_timestamps,
                                 [*TRAIN, *flags, "--timeout-s", str(timeout_s)], fault,
                                 tmp_path_factory.mktemp(name))
               for name, (timeout_s, flags, fault) in HUNG.items()}


@pytest.mark.slow
def test_a_rank_that_hangs_before_a_collective_ends_the_run(hung_runs):
    timeout_s = HUNG["collective"][0]
    code, lines, exited = hung_runs["collective"].result()
    text = "\n".join(line for _, line in lines)
    assert code != 0, text
    assert "Traceback" not in text
    for rank in (0, 1, 3):
        assert (f"paraxis: error: rank {rank}: timed out after 5 s waiting on all_reduce over "
                "the dp group (ranks 0,1,2,3) at step 1; ") in text, text
    # The heartbeat named the culprit while the others waited for it...
    stalls = [(t, line) for t, line in lines if line.startswith("paraxis: stalled at step 1")]
    assert stalls, text
    assert any("rank 2 no progress for" in line and "(not in a communication call)" in line
               for _, line in stalls), text
    assert any("ranks 0,1,3 waiting" in line for _, line in stalls), text
    # ...and the run was over within timeout + 30 s of the stall (reported stall_s after it
    # began, so this bound is conservative).
    assert exited - stalls[0][0] < timeout_s + 30


@pytest.mark.slow
def test_a_pipeline_stage_that_hangs_is_named_by_its_neighbour(hung_runs):
    timeout_s = HUNG["stage"][0]
    code, lines, exited = hung_runs["stage"].result()
    text = "\n".join(line for _, line in lines)
    assert code != 0, text
    assert "Traceback" not in text
    assert ("paraxis: error: rank 0: timed out after 4 s waiting on recv from rank 1 (pp) at "
            "step 1; ") in text, text
    # The hung rank itself is ended by its own watchdog (or by the launcher): the run is
    # over within timeout + 30 s of the neighbour's report, never a hang.
    reported = next(t for t, line in lines if line.startswith("paraxis: error: rank 0:"))
    assert exited - reported < timeout_s + 30, text
