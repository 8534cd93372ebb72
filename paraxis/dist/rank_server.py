"""The server ranks fork from, and what each rank takes from its launcher.

`paraxis train --nproc N` would otherwise start N interpreters that each import torch
(seconds each, on every core at once); multiprocessing's fork server imports it once, and
each rank forks from it with what the launcher gives it: its stdout and stderr, and the
read end of a pipe that tells it the launcher died. Forking a process that has run torch is
unsafe; forking one that only imported it is not, and is how CUDA ranks may start too.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import sys
from collections.abc import Callable, Sequence
from multiprocessing import forkserver, reduction
from pathlib import Path
from typing import Any

from paraxis.dist.preemption import stop_with_launcher


class Inherited:
    """Descriptors a rank takes from its launcher, whichever way it starts: stdout and
    stderr (a fork server's children would otherwise write where the server was started,
    pytest's capture of an earlier test, say) and the read end of the pipe that tells the
    rank its launcher died (`preemption.stop_with_launcher`)."""

    def __init__(self, launcher: int, stdio: tuple[int, ...] = (1, 2)) -> None:
        self.launcher, self.stdio = launcher, stdio

    def __reduce__(self) -> tuple:
        return Inherited._received, tuple(
            reduction.DupFd(fd) for fd in (self.launcher, *self.stdio))

    @staticmethod
    def _received(launcher: Any, *stdio: Any) -> Inherited:
        return Inherited(launcher.detach(), tuple(handle.detach() for handle in stdio))

    def attach(self) -> None:
        for target, fd in enumerate(self.stdio, start=1):
            if fd != target:
                os.dup2(fd, target)
                os.close(fd)
        stop_with_launcher(self.launcher)  # no orphans, even after a SIGKILL


def rank_context(fn: Callable[..., Any], preload: Sequence[str] = ()
                 ) -> mp.context.BaseContext:
    """How ranks start: forked from a fork server that imported torch, `fn`'s module and the
    modules named in `preload` (what `fn` imports as it runs) once (forking a process that
    has run torch is unsafe, forking one that only imported it is not, and is how CUDA ranks
    may start too), so N ranks cost one import of them instead of N (seconds each). Spawned
    where there is no fork server."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    context = mp.get_context("forkserver")
    modules = ["torch", "torch.distributed"]
    if fn.__module__ != "__main__":
        modules.append(fn.__module__)
    context.set_forkserver_preload([*modules, *preload])  # read once, when the server starts
    return context


def _start_server_quietly() -> None:
    """Start the fork server (once a process) with its stdout and stderr on /dev/null: the
    ranks write to the launcher's own (`Inherited`), and a server holding the launcher's
    would keep a caller reading them waiting until it exits, a second after the launcher.
    The server gets the launcher's import path in PYTHONPATH: before Python 3.13 it is
    started with its own (its working folder first), so where paraxis is not installed, or
    the launcher added a folder to sys.path, its preload found nothing and every rank
    imported the training stack itself."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved = [os.dup(1), os.dup(2)]
    quiet = os.open(os.devnull, os.O_WRONLY)
    path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(os.path.abspath(entry or os.curdir)
                                               for entry in sys.path)
    try:
        os.dup2(quiet, 1)
        os.dup2(quiet, 2)
        forkserver.ensure_running()
    finally:
        if path is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = path
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, quiet):
            os.close(fd)


def rank_pids(launcher_pid: int) -> list[int]:
    """The pids of the ranks a launcher process started, by rank (Linux /proc): the children
    of its fork server (or, spawned, its own children running multiprocessing's spawn_main);
    fewer while they start or after they end."""
    def children(pid: int) -> list[int]:
        try:
            return [int(child) for child in
                    Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            return []

    def command(pid: int) -> bytes:
        try:
            return Path(f"/proc/{pid}/cmdline").read_bytes()
        except (FileNotFoundError, ProcessLookupError):
            return b""

    ranks = []
    for child in children(launcher_pid):
        if b"multiprocessing.forkserver" in command(child):
            ranks += children(child)
        elif b"spawn_main" in command(child):
            ranks.append(child)
    return sorted(ranks)


def start_rank_server(fn: Callable[..., Any], preload: Sequence[str] = ()
                      ) -> mp.context.BaseContext:
    """`rank_context(fn, preload)`, its fork server started (once a process): called before
    the launcher's own checks, the server imports torch while they run (two cores do both)."""
    context = rank_context(fn, preload)
    if context.get_start_method() == "forkserver":
        _start_server_quietly()
    return context


def stop_rank_server() -> None:
    """Stop this process's fork server, if one runs (once its ranks have ended, or before
    any started): at once, as nothing of it needs saving (left alone it outlives the
    launcher by its interpreter's teardown, a second, or by the rest of its torch import
    when bad input stops the launcher first). The next launch starts another. It reaches
    the server through multiprocessing's private handle (one server a process, stopped by
    its own tests so); where that is missing the server is left to end with this process."""
    server = getattr(forkserver, "_forkserver", None)
    pid, stop = getattr(server, "_forkserver_pid", None), getattr(server, "_stop", None)
    if pid is None or stop is None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    stop()  # closes its pipe and reaps it
