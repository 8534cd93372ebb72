"""What this rank is waiting on, so that a hang becomes one line that names it.

Every blocking communication point wraps its wait:

    with WATCH.waiting("all_reduce", group):          # a collective over a named group
        work.wait()
    with WATCH.waiting("recv", peer=2, axis="pp"):    # a point-to-point message
        work.wait()

which costs a clock read and a few attribute writes (no collective, no allocation). Every
process group carries the run's timeout (`init_process_group` and `new_group(timeout=...)`;
gloo raises once it has passed), and when a wait fails this record turns gloo's bare
"Timed out waiting 30000ms for recv operation to complete" into

    rank 3: timed out after 30 s waiting on all_reduce over the dp group (ranks 1,3) at step 7

The same record feeds the heartbeat (`dist/heartbeat.py`): the time of the last wait that
began or ended is this rank's last sign of progress.
"""

from __future__ import annotations

import time

import torch.distributed as dist

from paraxis.spec.errors import CommFailure

# Process group -> the layout axis it runs along ("dp", "tp", "pp", "dp_tp", ...), named by
# whoever creates the group (`runtime.distributed.build_groups`).
_AXES: dict[object, str] = {}

# Words gloo and NCCL use when a peer is gone rather than late.
_LOST_PEER = ("connection closed", "connection reset", "broken pipe", "socket", "peer")


def name_group(group: dist.ProcessGroup | None, axis: str) -> None:
    """Remember which axis `group` runs along, for the messages."""
    if group is not None:
        _AXES[group] = axis


def ranks_text(ranks: list[int]) -> str:
    """"1,3" for a few ranks; "0,8,...,56 (8 ranks)" for many."""
    if len(ranks) <= 8:
        return ",".join(str(r) for r in ranks)
    return f"{ranks[0]},{ranks[1]},...,{ranks[-1]} ({len(ranks)} ranks)"


# Until init_distributed sets the run's (`paraxis train --timeout-s`, default 600 there too):
# what process groups built outside a training run (tests, benchmarks) get.
DEFAULT_TIMEOUT_S = 600.0


class Watch:
    """This rank's current wait (op is None between waits) and its last sign of progress."""

    def __init__(self) -> None:
        self.rank = 0
        self.timeout_s = DEFAULT_TIMEOUT_S  # the run's; process groups are created with it
        self.step: int | None = None
        self.op: str | None = None
        self.group: dist.ProcessGroup | None = None
        self.peer: int | None = None
        self.axis: str | None = None
        self.since = time.monotonic()  # when the current wait began, or the last one ended
        self.on_wait = None  # a fault test's hook, called as a wait begins (train/faults.py)

    def configure(self, rank: int, timeout_s: float) -> None:
        self.rank, self.timeout_s = rank, timeout_s

    def begin_step(self, step: int) -> None:
        self.step, self.op, self.since = step, None, time.monotonic()

    def progress(self) -> None:
        """Long local work (writing a checkpoint) calls this to say it is not stuck."""
        self.since = time.monotonic()

    def waiting(self, op: str, group: dist.ProcessGroup | None = None, peer: int | None = None,
                axis: str | None = None, call: bool = True) -> Watch:
        """Record the wait that follows; use as `with WATCH.waiting(...):`. `call`: it is a
        communication call (`on_wait` counts those)."""
        self.op, self.group, self.peer, self.axis = op, group, peer, axis
        self.since = time.monotonic()
        if call and self.on_wait is not None:
            self.on_wait()
        return self

    def device_sync(self) -> Watch:
        """Record a wait on the device's queued work, where on NCCL the step's collectives end
        (their `wait` only queues them): named by the heartbeat like a communication call,
        but not one."""
        return self.waiting("the step's device sync (where its NCCL collectives end)",
                            call=False)

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, kind: type | None, error: BaseException | None, tb: object) -> bool:
        if kind is None:
            self.op, self.since = None, time.monotonic()
            return False
        if self.op is not None and issubclass(kind, RuntimeError) and _is_comm_failure(error):
            raise CommFailure(self.failure_text(str(error))) from error
        return False

    # ------------------------------------------------------------------------ words

    def wait_text(self) -> str | None:
        """"all_reduce over the dp group (ranks 1,3)" or "recv from rank 2 (pp)"."""
        if self.op is None:
            return None
        if self.peer is not None:
            where = "from" if self.op.startswith("recv") else "to"
            return f"{self.op} {where} rank {self.peer}" + (f" ({self.axis})" if self.axis else "")
        axis = self.axis or _AXES.get(self.group, "world" if self.group is None else "a")
        try:
            ranks = (dist.get_process_group_ranks(self.group) if self.group is not None
                     else list(range(dist.get_world_size())))
        except (RuntimeError, ValueError):  # the group is already torn down
            return f"{self.op} over the {axis} group"
        return f"{self.op} over the {axis} group (ranks {ranks_text(ranks)})"

    def failure_text(self, backend_message: str = "", waited_s: float | None = None) -> str:
        """The one line a rank prints when its wait failed or ran past the timeout."""
        waited = time.monotonic() - self.since if waited_s is None else waited_s
        at_step = f" at step {self.step}" if self.step is not None else ""
        text = backend_message.lower()
        # A peer whose own wait expired first closes its connections: a wait that had run
        # most of the timeout when its connection closed timed out too, a moment later.
        if ("timed out" in text or "timeout" in text or not text
                or waited >= 0.8 * self.timeout_s):
            what = f"timed out after {self.timeout_s:g} s"
            hint = ("a peer stalled or died (see its line); raise --timeout-s if this wait is "
                    "legitimately longer")
        else:
            what = f"lost a peer after {waited:.0f} s"
            hint = "a peer rank exited or its host went away (see its line)"
        return f"rank {self.rank}: {what} waiting on {self.wait_text()}{at_step}; {hint}"


def _is_comm_failure(error: BaseException | None) -> bool:
    text = str(error).lower()
    return "timed out" in text or "timeout" in text or any(w in text for w in _LOST_PEER)


WATCH = Watch()
