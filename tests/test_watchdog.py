"""The wait record: a failed wait names its operation, group (or peer) and step; the heartbeat
names stalled ranks; the watchdog ends a rank stuck outside any communication call."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from paraxis.dist.heartbeat import describe_stall
from paraxis.dist.testing import RankContext, run_on_ranks
from paraxis.dist.watchdog import WATCH, name_group, ranks_text
from paraxis.spec.errors import CommFailure

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 2.0


def _peer_never_comes(ctx: RankContext, kind: str) -> str | None:
    """Rank 1 never joins; rank 0's wait expires after TIMEOUT_S and says what it was."""
    rank = dist.get_rank()
    group = dist.new_group([0, 1], timeout=timedelta(seconds=TIMEOUT_S))
    name_group(group, "dp")
    WATCH.configure(rank, TIMEOUT_S)
    WATCH.begin_step(7)
    if rank == 1:
        time.sleep(TIMEOUT_S + 1.5)
        return None
    tensor = torch.ones(4)
    try:
        if kind == "collective":
            with WATCH.waiting("all_reduce", group):
                dist.all_reduce(tensor, group=group)
        else:
            with WATCH.waiting("recv", peer=1, axis="pp"):
                dist.recv(tensor, src=1, group=group)
    except CommFailure as failure:
        return str(failure)
    return "the wait did not fail"


@pytest.mark.slow
@pytest.mark.parametrize("kind,waiting_on", [
    ("collective", "all_reduce over the dp group (ranks 0,1)"),
    ("p2p", "recv from rank 1 (pp)"),
])
def test_a_wait_that_times_out_names_what_it_waited_on(kind, waiting_on):
    message = run_on_ranks(2, _peer_never_comes, kind, timeout_s=60)[0]
    assert message.startswith(f"rank 0: timed out after 2 s waiting on {waiting_on} at step "
                              "7; "), message
    assert "--timeout-s" in message


def test_errors_that_are_not_about_communication_pass_through():
    WATCH.configure(0, 5.0)
    with pytest.raises(RuntimeError, match="shape mismatch"), WATCH.waiting("all_reduce"):
        raise RuntimeError("shape mismatch")
    assert WATCH.op == "all_reduce"  # left for the post-mortem, as a failed wait leaves it


def test_stall_line_puts_the_rank_that_is_not_waiting_first():
    beats = [(0, {"step": 3, "idle_s": 4.2, "waiting": "all_reduce over the dp group"}),
             (1, {"step": 3, "idle_s": 4.0, "waiting": "all_reduce over the dp group"}),
             (2, {"step": 3, "idle_s": 4.6, "waiting": None}),
             (3, {"step": 3, "idle_s": 9.0, "waiting": None, "silent": True})]
    assert describe_stall(beats) == (
        "paraxis: stalled at step 3: rank 2 no progress for 5 s (not in a communication "
        "call); rank 3 no progress for 9 s (silent (no heartbeat)); ranks 0,1 waiting 4 s on "
        "all_reduce over the dp group")


def test_stall_line_names_a_frozen_rank_as_silent_at_the_step_its_peers_wait_in():
    """A SIGSTOPped rank's last beat says it was waiting (on the previous step's all-reduce,
    beats being seconds apart); its peers wait for it at step 30: it is the silent one, and
    it stopped at step 30."""
    wait = "all_reduce over the dp group (ranks 0,1,2,3)"
    beats = [(0, {"step": 30, "idle_s": 9.0, "waiting": wait}),
             (1, {"step": 30, "idle_s": 9.0, "waiting": wait}),
             (2, {"step": 22, "idle_s": 12.0, "waiting": wait, "silent": True}),
             (3, {"step": 30, "idle_s": 9.0, "waiting": wait})]
    assert describe_stall(beats) == (
        f"paraxis: stalled at step 30: rank 2 silent (no heartbeat) for 12 s, stopped at step "
        f"30 (last seen waiting on {wait}); ranks 0,1,3 waiting 9 s on {wait}")


def test_ranks_text_abbreviates_long_groups():
    assert ranks_text([1, 3]) == "1,3"
    assert ranks_text(list(range(0, 64, 8))) == "0,8,16,24,32,40,48,56"
    assert ranks_text(list(range(16))) == "0,1,...,15 (16 ranks)"


def test_watchdog_ends_a_rank_stuck_outside_communication():
    """No progress for timeout + grace and not in any wait: one line, exit code 3."""
    script = textwrap.dedent("""
        import time
        from paraxis.dist.heartbeat import start_heartbeat
        from paraxis.dist.watchdog import WATCH
        WATCH.begin_step(5)
        start_heartbeat(rank=1, world=2, timeout_s=1.0)  # grace: 5 s
        time.sleep(60)  # stuck in 'computation'
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-c", script], env={**env, "PYTHONPATH": str(ROOT)},
                            capture_output=True, text=True, timeout=60)
    elapsed = time.monotonic() - started
    assert result.returncode == 3, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and re.fullmatch(
        r"paraxis: error: rank 1: no progress for [67] s at step 5 and not in a communication "
        r"call \(stuck in computation or I/O\); exiting so the job ends instead of hanging",
        lines[0]), result.stderr
    assert elapsed < 30
