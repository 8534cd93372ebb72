"""Heartbeats, stall reports and the last-resort exit: one thread per rank.

Every `interval_s` each rank's thread writes to the rendezvous store (the TCPStore torchrun
or the launcher already runs at MASTER_ADDR:MASTER_PORT) its step, the seconds since its
last sign of progress (`WATCH.since`) and what it is waiting on. No collective, nothing on
the training step's path: the training thread only writes attributes.

- Rank 0 reads every rank's heartbeat and, when some rank has made no progress for
  `stall_s`, names it in the progress output, the stalled rank that is *not* waiting first
  (it is the likely culprit: the others wait for it):

      paraxis: stalled at step 3: rank 2 no progress for 4 s (not in a communication call);
      ranks 0,1,3 waiting 4 s on all_reduce over the dp group (ranks 0,1,2,3)

- Any rank with no progress for `timeout_s + grace_s` prints its one line and exits with
  code 3: the backend did not raise, or the rank is stuck outside any communication call
  (a spinning kernel, a dead file system), and a launcher then ends the job instead of
  waiting forever.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING

import torch.distributed as dist

from paraxis.dist.groups import restart_attempt
from paraxis.dist.watchdog import WATCH, ranks_text
from paraxis.spec.errors import RunFailed

if TYPE_CHECKING:
    from torch.distributed import TCPStore

# One key per rank and launch attempt: a restarted job must not read the last attempt's beats.
KEY = "paraxis/heartbeat/{attempt}/{rank}"


def _print_stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _print_stall(text: str | None) -> None:
    if text:
        _print_stderr(text)


# Where rank 0's stall lines go: the progress display replaces it while it is on screen.
stall_sink: Callable[[str | None], None] = _print_stall


class Heartbeat(threading.Thread):
    def __init__(self, rank: int, world: int, timeout_s: float) -> None:
        super().__init__(name="paraxis-heartbeat", daemon=True)
        self.rank, self.world, self.timeout_s = rank, world, timeout_s
        self.interval_s = min(5.0, max(0.5, timeout_s / 10))
        self.stall_s = max(2 * self.interval_s, min(60.0, timeout_s / 2))
        self.grace_s = max(5.0, min(30.0, timeout_s / 2))
        self._stop_event = threading.Event()
        self._store = None  # connected by the thread itself: training never waits for it
        self._keys = [KEY.format(attempt=restart_attempt(), rank=r) for r in range(world)]
        self._beats = 0
        self._seen: dict[int, tuple[int, float]] = {}  # rank -> (beat, rank 0's clock)
        self._last_picture: tuple = ()
        self._said_at = 0.0

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout=2 * self.interval_s)
        stall_sink(None)

    def run(self) -> None:
        self._store = _connect_store(self.interval_s)
        while not self._stop_event.wait(self.interval_s):
            idle_s = time.monotonic() - WATCH.since
            if idle_s > self.timeout_s + self.grace_s:
                self._give_up(idle_s)
            if self._store is None:
                continue
            try:
                self._beat(idle_s)
                if self.rank == 0:
                    self._report_stalls()
            except Exception:  # noqa: BLE001 - the store went away: keep the watchdog going
                self._store = None

    def _beat(self, idle_s: float) -> None:
        self._beats += 1
        self._store.set(self._keys[self.rank], json.dumps(
            {"beat": self._beats, "step": WATCH.step, "idle_s": idle_s,
             "waiting": WATCH.wait_text()}))

    def _beats_now(self) -> list[dict]:
        """Every rank's last beat; a rank that has not beaten yet (starting up, or frozen
        before its first beat) has the placeholder beat -2, which never changes."""
        if self._store.check(self._keys):
            return [json.loads(raw) for raw in self._store.multi_get(self._keys)]  # 1 trip
        none_yet = {"beat": -2, "step": None, "idle_s": 0.0, "waiting": None}
        return [json.loads(self._store.get(key)) if self._store.check([key]) else none_yet
                for key in self._keys]

    def _report_stalls(self) -> None:
        now = time.monotonic()
        stalled: list[tuple[int, dict]] = []
        for rank, beat in enumerate(self._beats_now()):
            seen_beat, seen_at = self._seen.get(rank, (-1, now))
            if beat["beat"] != seen_beat:
                self._seen[rank] = (beat["beat"], now)
                seen_at = now
            silent_s = now - seen_at  # the beat's age, as far as rank 0 can tell
            beat = {**beat, "idle_s": beat["idle_s"] + silent_s,
                    "silent": silent_s >= self.stall_s}  # its thread stopped: frozen or gone
            if beat["idle_s"] >= self.stall_s:
                stalled.append((rank, beat))
        if all(b["beat"] == -2 for _, b in stalled):
            stalled = []  # only ranks still starting up: not a stall (yet)
        # Say it when the picture changes, and again every stall_s while it lasts.
        picture = tuple((rank, beat["waiting"], beat.get("silent")) for rank, beat in stalled)
        if picture != self._last_picture or (stalled and now - self._said_at >= self.stall_s):
            self._last_picture, self._said_at = picture, now
            stall_sink(describe_stall(stalled) if stalled else None)

    def _give_up(self, idle_s: float) -> None:
        if WATCH.op is not None:
            line = WATCH.failure_text(waited_s=idle_s)
        else:
            at_step = f" at step {WATCH.step}" if WATCH.step is not None else ""
            line = (f"rank {self.rank}: no progress for {idle_s:.0f} s{at_step} and not in a "
                    "communication call (stuck in computation or I/O); exiting so the job "
                    "ends instead of hanging")
        _print_stderr(f"paraxis: error: {line}")
        os._exit(RunFailed.exit_code)


def describe_stall(stalled: list[tuple[int, dict]]) -> str:
    """One line naming the stalled ranks: the silent ones (no heartbeat: stopped, frozen or
    gone) first, then those in no communication call, then the ones waiting on them.

    A silent rank's last beat may be a few steps old (beats are seconds apart, steps may be
    faster), while its peers wait for it in the step it stopped at: its step is the later of
    the two. The line's step is the step the run is stuck in (the latest of them)."""
    waiting_steps = [b["step"] for _, b in stalled if b["waiting"] and not b.get("silent")
                     and b["step"] is not None]
    steps = [b["step"] for _, b in stalled if b["step"] is not None]
    step = max(steps, default=None)
    parts: list[str] = []
    for rank, beat in stalled:
        if beat.get("silent") and beat["waiting"]:
            stopped = max([beat["step"], *waiting_steps]) if beat["step"] is not None else None
            at = f", stopped at step {stopped}" if stopped is not None else ""
            parts.append(f"rank {rank} silent (no heartbeat) for {beat['idle_s']:.0f} s{at} "
                         f"(last seen waiting on {beat['waiting']})")
    for rank, beat in stalled:
        if not beat["waiting"]:
            state = ("silent (no heartbeat)" if beat.get("silent")
                     else "not in a communication call")
            if beat.get("silent") and beat["step"] is None and waiting_steps:
                beat = {**beat, "step": max(waiting_steps)}  # never beat: stuck with its peers
            at = f" at step {beat['step']}" if beat["step"] not in (step, None) else ""
            parts.append(f"rank {rank} no progress for {beat['idle_s']:.0f} s{at} ({state})")
    by_wait: dict[str, list[int]] = {}
    for rank, beat in stalled:
        if beat["waiting"] and not beat.get("silent"):
            by_wait.setdefault(beat["waiting"], []).append(rank)
    for waiting, ranks in by_wait.items():
        longest = max(b["idle_s"] for r, b in stalled if r in ranks)
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks_text(ranks)}"
        parts.append(f"{who} waiting {longest:.0f} s on {waiting}")
    at_step = f" at step {step}" if step is not None else ""
    return f"paraxis: stalled{at_step}: " + "; ".join(parts)


def _connect_store(timeout_s: float) -> TCPStore | None:
    """A client of the job's rendezvous store, or None when there is none to reach."""
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not host or not port:
        return None
    try:
        return dist.TCPStore(host, int(port), is_master=False,
                             timeout=timedelta(seconds=max(10.0, 2 * timeout_s)))
    except (RuntimeError, ValueError):
        return None


def start_heartbeat(rank: int, world: int, timeout_s: float) -> Heartbeat | None:
    """Start the thread for a multi-rank run (a single process has nobody to wait on)."""
    if world < 2:
        return None
    WATCH.configure(rank, timeout_s)
    WATCH.progress()
    thread = Heartbeat(rank, world, timeout_s)
    thread.start()
    return thread
