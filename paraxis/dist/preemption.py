"""Preemption: a signal stops the run at the next step boundary, with a checkpoint.

    with StopRequest() as stop:             # SIGTERM, SIGHUP, SIGINT set a flag
        for step in ...:
            ...                              # the step
            signum = stop.agreed(device)     # every rank: one all-reduce (MAX) of the flag
            if signum: save; raise Preempted(signum, done, saved)

A scheduler preempts a job with SIGTERM (SLURM, Kubernetes), a closed terminal sends SIGHUP,
Ctrl-C SIGINT; torchrun passes SIGTERM to its ranks, and `paraxis train --nproc` passes any
of them on (`dist/launch.py`). The signal may reach one rank before another, or between
two collectives of a step, so no rank acts on it alone: at each step boundary the ranks
reduce their flags with one MAX all-reduce, and all of them save the same step and stop
together. A second Ctrl-C stops at once (KeyboardInterrupt), as users expect.

The exit code is 128 + the signal's number, as a shell reports a process a signal ended
(143 for SIGTERM), and rank 0 says in one line which step was saved.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import TYPE_CHECKING

from paraxis.spec.errors import ParaxisError

if TYPE_CHECKING:
    import torch

SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


class Preempted(ParaxisError):
    """The run stopped on a signal, every rank at the same step (not a failure: no restart)."""

    same_on_every_rank = True

    def __init__(self, signum: int, done: int, saved: str | None) -> None:
        self.exit_code = 128 + signum
        where = (f"saved {saved}; continue with --resume auto" if saved else
                 "no --checkpoint-dir, so nothing was saved")
        super().__init__(f"stopped by {signal.Signals(signum).name} after step {done}; {where}")


class CatchSignals:
    """`_handle` receives SIGNALS inside the `with` block (installed from the main thread
    only: Python runs handlers there); the previous handlers come back after it. `signum`:
    the first signal caught (0: none)."""

    def __init__(self) -> None:
        self.signum = 0
        self._previous: dict[int, object] = {}

    def __enter__(self) -> CatchSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: object) -> None:
        raise NotImplementedError


class StopRequest(CatchSignals):
    """The stop flag the signal handlers set, and the ranks' agreement on it."""

    def _handle(self, signum: int, frame: object) -> None:
        if self.signum and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now
        self.signum = self.signum or signum

    def agreed(self, device: torch.device) -> int:
        """The signal some rank received (0: none), the same on every rank: one MAX
        all-reduce of the flag over the world (none in a single process)."""
        import torch  # lazy: torch; CLI start-up imports this
        import torch.distributed as dist  # lazy: torch; CLI start-up imports this

        from paraxis.dist.watchdog import WATCH  # lazy: torch; CLI start-up imports this

        if not dist.is_initialized() or dist.get_world_size() == 1:
            return self.signum
        flag = torch.tensor([self.signum], dtype=torch.int32,
                            device=device if dist.get_backend() == "nccl" else "cpu")
        with WATCH.waiting("all_reduce (stop flag)"):
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return int(flag.item())


def stop_with_launcher(launcher_fd: int) -> None:
    """SIGTERM this process when its launcher dies, even by SIGKILL: `launcher_fd` is the
    read end of a pipe whose write end only the launcher holds, so a read returns at its
    death, when the kernel closes that end. The ranks then stop at their next step boundary,
    saving a checkpoint, instead of training on as orphans. If the launcher is already
    gone, at once."""
    def watch() -> None:
        while os.read(launcher_fd, 1):
            pass
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="paraxis-launcher-watch", daemon=True).start()
