"""The distributed test harness: real gloo ranks, errors surfaced, no hangs; the `on_ranks`
decorator gives a body its rank, layout and groups."""

import contextlib
import multiprocessing as mp
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from paraxis.dist.hidden_gpus import SEEN_GPUS, UNSET, gpus_seen
from paraxis.dist.testing import (
    RankContext,
    RankFailed,
    can_fork_autograd,
    on_ranks,
    report,
    run_distributed,
    run_on_ranks,
)
from paraxis.spec.layout import Layout


def _sum_of_ranks() -> float:
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    return t.item()


@pytest.mark.parametrize("world", [4, 8])
def test_all_reduce_of_rank_ids(world):
    assert run_distributed(_sum_of_ranks, world) == [world * (world - 1) / 2] * world


def test_ranks_start_again_at_another_port_when_theirs_was_taken(monkeypatch):
    """A port free when picked can be taken before rank 0 binds it (another test's process):
    the launch is tried again at a fresh port, and only that failure is retried."""
    import socket

    import paraxis.dist.testing as testing

    taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    picked = []
    real = testing.free_port

    def first_one_taken() -> int:
        picked.append(taken.getsockname()[1] if not picked else real())
        return picked[-1]

    monkeypatch.setattr(testing, "free_port", first_one_taken)
    with taken:
        assert run_distributed(_sum_of_ranks, 2, timeout_s=60) == [1.0, 1.0]
    assert len(picked) == 2
    with pytest.raises(RankFailed, match="rank 2 failed"):  # any other failure: not retried
        run_distributed(_rank_two_fails, 4)
    assert len(picked) == 3


def _rank_two_fails() -> None:
    if dist.get_rank() == 2:
        raise ValueError("rank two is broken")
    dist.barrier()  # the others would wait here forever


def test_failing_rank_fails_the_caller_with_its_error():
    started = time.monotonic()
    with pytest.raises(RankFailed, match="rank 2 failed(.|\n)*rank two is broken"):
        run_distributed(_rank_two_fails, 4, timeout_s=60)
    assert time.monotonic() - started < 30


def _report_and_exit(results, read) -> None:
    report(results, read, 2, "ok", {"logits": torch.arange(6.0).reshape(2, 3)})
    os._exit(0)


def test_a_tensor_a_rank_returned_is_read_however_late_the_caller_reads_it():
    # A busy caller reads a rank's message late: its tensor is shared memory that the caller
    # fetches from the rank, so the rank waits until the caller has read (it exited before,
    # and its message was lost: the rank was read as hung).
    context = mp.get_context("fork")
    results, read = context.Queue(), context.Event()
    rank = context.Process(target=_report_and_exit, args=(results, read))
    rank.start()
    rank.join(timeout=2)
    assert rank.is_alive()  # it waits for its caller
    number, status, value = results.get(timeout=10)
    read.set()
    rank.join(timeout=10)
    assert (number, status, rank.exitcode) == (2, "ok", 0)
    assert torch.equal(value["logits"], torch.arange(6.0).reshape(2, 3))


def _one_rank_hangs() -> None:
    if dist.get_rank() == 0:
        time.sleep(3600)


def test_hang_becomes_a_failure():
    with pytest.raises(RankFailed, match=r"rank\(s\) \[0, 1\] did not finish"):
        run_distributed(_one_rank_hangs, 2, timeout_s=3)


@on_ranks(2)
def test_decorator_runs_the_body_on_every_rank(ctx):
    assert dist.get_world_size() == 2
    assert torch.get_num_threads() == 1


def _backward_on_a_rank() -> tuple[int, int]:
    weight = torch.ones(2, requires_grad=True)
    (weight * dist.get_rank()).sum().backward()
    return int(weight.grad[0]), os.getppid()


@contextlib.contextmanager
def _autograd_device_threads() -> Iterator[None]:
    """A thread named as autograd's engine names its device threads: this process then looks
    like one where torch.compile's tracing started them (some torch builds do, with no GPU)."""
    named, done = threading.Event(), threading.Event()
    task: list[Path] = []

    def hold() -> None:
        task.append(Path(f"/proc/self/task/{threading.get_native_id()}"))
        (task[0] / "comm").write_text("pt_autograd_0")
        named.set()
        done.wait()

    thread = threading.Thread(target=hold)
    thread.start()
    named.wait()
    try:
        yield
    finally:
        done.set()
        thread.join()
        deadline = time.monotonic() + 10  # join returns before the OS thread is gone
        while task[0].exists() and time.monotonic() < deadline:
            time.sleep(0.01)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads Linux's /proc")
def test_a_process_that_cannot_fork_autograd_starts_its_ranks_from_the_rank_server():
    before = can_fork_autograd()  # False where an earlier test traced, under some torch builds
    with _autograd_device_threads():
        assert not can_fork_autograd()
        ranks = run_distributed(_backward_on_a_rank, 2)
        assert [grad for grad, _ in ranks] == [0, 1]
        assert all(parent != os.getpid() for _, parent in ranks)  # the rank server's children
        test_decorator_runs_the_body_on_every_rank()  # a decorated body pickles by its name
        with pytest.raises(RankFailed, match="make the body a module-level function"):
            run_distributed(lambda: None, 2)
    assert can_fork_autograd() == before


@on_ranks("dp=2,tp=2")
def test_context_of_a_2x2_layout(ctx, tmp_path):
    # rank = dp_rank * tp + tp_rank: the tp pairs are {0, 1} and {2, 3}
    assert (ctx.rank, ctx.world_size) == (dist.get_rank(), 4)
    assert ctx.layout == Layout(dp=2, tp=2)
    assert (ctx.groups.dp_rank, ctx.groups.tp_rank) == (ctx.rank // 2, ctx.rank % 2)
    t = torch.tensor([float(ctx.rank)])
    dist.all_reduce(t, group=ctx.groups.tp_group)
    assert t.item() == [1.0, 5.0][ctx.groups.dp_rank]
    t = torch.tensor([float(ctx.rank)])
    dist.all_reduce(t, group=ctx.groups.dp_group)
    assert t.item() == [2.0, 4.0][ctx.groups.tp_rank]
    (tmp_path / f"rank-{ctx.rank}").touch()  # pytest's fixtures reach every rank
    dist.barrier()
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"rank-{r}" for r in range(4)]


def _where(ctx: RankContext, tag: str) -> tuple[str, int, str, int | None]:
    tp = ctx.groups.tp_group
    return tag, os.getpid(), str(ctx.layout), None if tp is None else dist.get_world_size(tp)


def test_several_layouts_run_in_one_launch_each_with_its_groups():
    layouts = ["dp=4", "dp=2,tp=2,zero=1", Layout(tp=4)]
    results = run_on_ranks(layouts, _where, "x")
    assert len(results) == 3 and all(len(by_rank) == 4 for by_rank in results)
    assert [by_rank[0][2] for by_rank in results] == [str(Layout(dp=4)),
                                                      str(Layout(dp=2, tp=2, zero=1)),
                                                      str(Layout(tp=4))]
    assert [by_rank[0][3] for by_rank in results] == [None, 2, 4]
    for rank in range(4):  # the same four processes ran every layout
        assert len({by_rank[rank][1] for by_rank in results}) == 1
    assert len({by_rank[1] for by_rank in results[0]}) == 4
    with pytest.raises(ValueError, match="one world size"):
        run_on_ranks(["dp=2", "dp=4"], _where, "x")


@on_ranks(["dp=2", "tp=2"], timeout_s=60)
def _fails_on_rank_1_under_tp(ctx):
    assert ctx.layout.tp == 1 or ctx.rank == 0, "rank 1 may not run tp=2"


def test_a_failing_rank_fails_the_decorated_test_with_its_traceback():
    with pytest.raises(RankFailed, match=r"(?s)rank 1 failed:.*in _fails_on_rank_1_under_tp\n.*"
                                         r"rank 1 may not run tp=2.*while running layout "
                                         r"dp=1,tp=2"):
        _fails_on_rank_1_under_tp()


def test_a_body_must_take_the_context_first():
    def body():
        pass

    with pytest.raises(TypeError, match="must take the RankContext as its first parameter"):
        on_ranks(2)(body)


def test_one_named_gpu_for_several_local_ranks_is_one_line(monkeypatch):
    """--device cuda:0 with several ranks on the node would put them all on one GPU, which
    NCCL refuses ("Duplicate GPU"): say so before anything starts."""
    from paraxis.dist.groups import pick_device
    from paraxis.spec.errors import ParaxisError
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    with pytest.raises(ParaxisError, match="names one GPU for every rank"):
        pick_device("cuda:0")
    assert pick_device("cpu").type == "cpu"


def _seen() -> str:
    return os.environ.get("CUDA_VISIBLE_DEVICES", UNSET)


def test_the_suite_sees_no_gpu_and_its_spawned_gpu_ranks_see_what_it_could():
    """On a GPU machine a backward in this process would start autograd's per-GPU threads,
    and every CPU rank forked after it would fail its first backward: tests/conftest.py hides
    the GPUs (`hide_gpus`); a rank spawned for `device="cuda"` gets them back."""
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "" and torch.cuda.device_count() == 0
    with gpus_seen(), mp.get_context("spawn").Pool(1) as pool:
        assert pool.apply(_seen) == os.environ[SEEN_GPUS]
    assert _seen() == ""


def test_gpus_seen_where_the_variable_was_never_set(monkeypatch):
    """A process that inherits `hide_gpus`'s mark with no CUDA_VISIBLE_DEVICES at all (a rank
    the suite spawned, or a GPU machine that never set it) sees every GPU inside `gpus_seen`
    and leaves the variable as it found it."""
    monkeypatch.setenv(SEEN_GPUS, UNSET)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with gpus_seen():
        assert "CUDA_VISIBLE_DEVICES" not in os.environ
    assert "CUDA_VISIBLE_DEVICES" not in os.environ
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with gpus_seen():
        assert "CUDA_VISIBLE_DEVICES" not in os.environ
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""


def test_cuda_ranks_a_machine_cannot_place_are_refused_in_one_line():
    from paraxis.dist.launch import cuda_ranks_problem

    assert cuda_ranks_problem(2, "cuda", 2, None) is None
    assert cuda_ranks_problem(1, "cuda:1", 2, None) is None
    assert "shows no CUDA GPU (CUDA_VISIBLE_DEVICES='')" in cuda_ranks_problem(1, "cuda", 0, "")
    assert "--nproc 4 CUDA ranks need a GPU each, and this machine shows 1; use --nproc 1" in \
        cuda_ranks_problem(4, "cuda", 1, None)
    assert "names one GPU for all 2 ranks" in cuda_ranks_problem(2, "cuda:0", 8, None)


def test_the_modules_the_suite_starts_with_exist(request):
    """tests/conftest.py collects its slowest modules first, by file name: a renamed module
    would silently go back to its place in the order."""
    here = Path(__file__).parent
    first = request.config.pluginmanager.get_plugin(str(here / "conftest.py")).FIRST
    assert all((here / name).is_file() for name in first), first
    collected = [item.path.name for item in request.session.items]
    starts = [name for name in dict.fromkeys(collected) if name in first]
    assert starts == [name for name in first if name in collected]
