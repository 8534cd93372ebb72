"""A search split over forked processes (plan/workers.py): the same answer as one process
(tests/test_plan_prune.py compares both with the exhaustive search), its groups taken whole
and once each, a child's exception raised in the parent."""

import errno
import multiprocessing
import os
import subprocess
import sys
import threading
import time

import pytest

from paraxis.plan import workers
from paraxis.plan.hardware import build_cluster
from paraxis.plan.search import search
from paraxis.spec.errors import ParaxisError
from paraxis.spec.model_config import PRESETS


def test_groups_stay_whole_in_the_order_they_first_appear() -> None:
    items = [(2, "a"), (0, "b"), (2, "c"), (1, "d"), (0, "e")]
    assert workers.grouped(items, lambda item: item[0]) == [
        [(2, "a"), (2, "c")], [(0, "b"), (0, "e")], [(1, "d")]]


def test_each_index_goes_to_one_process_only() -> None:
    tickets = workers.Tickets()

    def take_ten() -> list[int]:
        return [tickets.take() for _ in range(10)]
    taken = [i for part in workers.run_forked(take_ten, 3) for i in part]
    assert sorted(taken) == list(range(30))


def test_the_task_runs_here_first_then_in_each_child() -> None:
    pids = workers.run_forked(os.getpid, 3)
    assert pids[0] == os.getpid() and len(set(pids)) == 3


def test_a_child_exception_is_raised_here() -> None:
    parent = os.getpid()

    def fails_in_a_child() -> None:
        if os.getpid() != parent:
            raise ParaxisError("no layout")
    with pytest.raises(ParaxisError, match="no layout"):
        workers.run_forked(fails_in_a_child, 2)


def test_an_exception_here_stops_the_children() -> None:
    started, parent = len(multiprocessing.active_children()), os.getpid()

    def fails_here() -> None:
        if os.getpid() == parent:
            raise ParaxisError("no layout")
        time.sleep(60)
    with pytest.raises(ParaxisError, match="no layout"):
        workers.run_forked(fails_here, 2)
    assert len(multiprocessing.active_children()) == started


def test_a_refused_fork_leaves_the_work_to_fewer_processes(monkeypatch) -> None:
    def refuse(self) -> None:  # noqa: ANN001 - as the system does, out of memory
        raise OSError(errno.ENOMEM, "Cannot allocate memory")
    monkeypatch.setattr(multiprocessing.context.ForkProcess, "start", refuse)
    assert workers.run_forked(os.getpid, 3) == [os.getpid()]
    cfg, cluster = PRESETS["mixtral-8x7b"], build_cluster("h100-sxm-80gb", 64, 8)
    one, split = (search(cfg, cluster, 8192, 128, workers=w) for w in (1, 2))
    assert [str(e.layout) for e in split.ranked] == [str(e.layout) for e in one.ranked]


def test_a_large_search_splits_and_answers_as_one_process() -> None:
    cfg, cluster = PRESETS["mixtral-8x7b"], build_cluster("h100-sxm-80gb", 256, 8)
    one = search(cfg, cluster, 8192, 512, workers=1)
    split = search(cfg, cluster, 8192, 512, workers=3)
    assert [(str(e.layout), e.step_time_s) for e in split.ranked[:6]] == \
        [(str(e.layout), e.step_time_s) for e in one.ranked[:6]]
    assert [str(r.layout) for r in split.too_big[:4]] == [str(r.layout) for r in one.too_big[:4]]


def test_small_searches_threads_and_daemons_stay_in_one_process() -> None:
    assert workers.worker_count(workers.MIN_SHAPES - 1) == 1
    # a fresh process of one thread (this one may run others' threads) takes its CPUs
    fresh = subprocess.run([sys.executable, "-c", "from paraxis.plan import workers; "
                            f"print(workers.worker_count({workers.MIN_SHAPES}))"],
                           capture_output=True, text=True, check=True)
    assert int(fresh.stdout) == min(workers.MAX_WORKERS, len(os.sched_getaffinity(0)))
    # a forked child is a daemon: it forks no further
    assert workers.run_forked(lambda: workers.worker_count(workers.MIN_SHAPES), 2)[1] == 1
    done = threading.Event()
    thread = threading.Thread(target=done.wait)
    thread.start()
    try:
        assert workers.worker_count(workers.MIN_SHAPES) == 1
    finally:
        done.set()
        thread.join()
