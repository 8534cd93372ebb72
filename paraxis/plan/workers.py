"""A large search's shapes split over forked processes (`search.search`'s `workers`).

The search visits its shapes best first (`floor.Floors.best_first`). It visits the first
`LEAD_GROUPS` groups itself, so that its bound (`prune.Bound`) holds the fastest layouts
before it forks; then each process, with its own copy of that bound, takes the next group
not yet taken until none is left (`Tickets`; a group's shapes stay together: the search reads
its expert-parallel degrees in order), and the parent collects what each priced. A process's
bound is built from fewer layouts than the whole search's, so its limits are never below the
final ones: what it skips the serial search skips too, and the answer is the same; only the
counts of layouts priced and skipped differ, from run to run. Where a process may not fork
(`worker_count`) or may use one CPU, the search runs in it alone.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
import threading
from collections.abc import Callable, Hashable, Sequence
from multiprocessing.connection import Connection
from typing import TypeVar

T = TypeVar("T")
S = TypeVar("S")

LEAD_GROUPS = 4  # visited before forking: the bound then holds some of the fastest layouts
MAX_WORKERS = 4  # beyond, forking and collecting cost more than a 1024-GPU search saves
MIN_SHAPES = 256  # a smaller search answers in well under a second serially


def worker_count(shapes: int) -> int:
    """Processes to split a search of `shapes` shapes over: the CPUs this process may use,
    up to `MAX_WORKERS`; 1 for a small search or where this process may not fork: only on
    Linux (macOS' system libraries are not safe to fork), from one thread (another's locks
    would stay held in the child), and not from a daemonic process (which may have no
    children)."""
    if shapes < MIN_SHAPES or not sys.platform.startswith("linux") \
            or threading.active_count() > 1 or multiprocessing.current_process().daemon:
        return 1
    return max(1, min(MAX_WORKERS, len(os.sched_getaffinity(0))))


def grouped(items: Sequence[S], group: Callable[[S], Hashable]) -> list[list[S]]:
    """`items` as their groups, in the order each group first appears."""
    groups: dict[Hashable, list[S]] = {}
    for item in items:
        groups.setdefault(group(item), []).append(item)
    return list(groups.values())


class Tickets:
    """Indices 0, 1, 2... handed out once each to whichever process asks first: made before
    forking, shared by the processes forked after (a counter in shared memory)."""

    def __init__(self) -> None:
        self._next = multiprocessing.get_context("fork").Value("q", 0)

    def take(self) -> int:
        with self._next.get_lock():
            index = self._next.value
            self._next.value = index + 1
        return index


def run_forked(task: Callable[[], T], count: int) -> list[T]:
    """`task`'s result in this process and in up to `count` - 1 processes forked first, each
    with a copy of this process's state as it stands (fewer where the system refuses a fork:
    `task` must finish the work whichever processes run it, as the search's, taking groups
    by `Tickets`, does); theirs sent back pickled, this process's first. An exception in a task is
    raised here, the children still running stopped."""
    context = multiprocessing.get_context("fork")
    children = []
    for _ in range(count - 1):
        receive, send = context.Pipe(duplex=False)
        child = context.Process(target=_run, args=(task, send), daemon=True)
        try:
            child.start()
        except OSError:  # out of memory or processes: fewer run it
            receive.close()
            send.close()
            break
        send.close()
        children.append((child, receive))
    try:
        results = [task()]
        for child, receive in children:
            try:
                ok, value = receive.recv()
            except EOFError:
                child.join()
                raise RuntimeError(f"a search process ended without an answer (exit code "
                                   f"{child.exitcode})") from None
            if not ok:
                raise value
            results.append(value)
    finally:
        for child, receive in children:
            receive.close()
            if child.is_alive():
                child.terminate()
            child.join()
    return results


def _run(task: Callable[[], object], send: Connection) -> None:
    try:
        send.send((True, task()))
    except BaseException as error:  # noqa: BLE001 - raised again in the parent
        try:
            send.send((False, error))
        except Exception:  # noqa: BLE001 - an exception that does not pickle
            send.send((False, RuntimeError(f"{type(error).__name__}: {error}")))
    finally:
        send.close()
