"""Run a test body on real ranks (processes, gloo, one thread each) as if it were one process.

A distributed test reads like a single-process test: the decorator starts the ranks, joins
them in a process group, builds the groups of the layout, and hands the body a `RankContext`:

    from paraxis.dist.testing import on_ranks

    @on_ranks("dp=2,tp=2")                 # world size from the layout: 4 ranks
    def test_tp_pairs(ctx, tmp_path):      # ctx first; pytest fixtures and params after it
        assert ctx.groups.tp_rank == ctx.rank % 2
        ...                                # assert inside: a failing rank fails the test

    @on_ranks(["dp=4", "dp=2,tp=2,zero=1"])  # several layouts of one world, one launch:
    def test_each(ctx):                      # the body runs once per layout, in order,
        ...                                  # each time with that layout's own groups

Starting ranks is the expensive part (~2 s for 4 here), so a test that covers several
layouts of one world size runs them in one launch. A test that compares with a single-device
run computed in the parent calls `run_on_ranks` and gets the bodies' return values back:

    losses = run_on_ranks("pp=2,microbatches=4", train, cfg)   # [rank 0's, rank 1's]
    losses = run_on_ranks(["dp=2", "tp=2"], train, cfg)          # [[dp=2 by rank], [tp=2 ...]]

A body whose layout changes with other per-case data makes the groups itself with
`ctx.with_layout(layout)`. A layout is a `Layout`, its text ("dp=2,tp=2") or a plain world
size (n: the layout dp=n), for bodies that only need n ranks.

Any rank's exception is raised in the caller with that rank's traceback (and the layout it
ran); a rank that does not finish within `timeout_s` fails the call instead of hanging it.
Processes are forked (the cheapest start on this machine), so bodies may be closures, and
meet at a fresh TCP port. A process whose autograd engine has started its device threads
cannot fork ranks that run autograd (`can_fork_autograd`); its ranks start from the rank server
instead, and then the body must pickle: a module-level function, or an `on_ranks` test.
With `device="cuda"` each rank takes the GPU of its local rank and joins over NCCL; those
ranks are spawned, not forked (a forked child cannot use CUDA once its parent has touched
it), so the body must then be a module-level function given to `run_on_ranks`.
`run_distributed(fn, world_size)` is the layer below: `fn` with no context.

A process that forks CPU ranks must not see a GPU (`paraxis.dist.hidden_gpus`): the test suite
hides them from itself; the ranks `device="cuda"` spawns see them again (`gpu_count()`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import json
import multiprocessing as mp
import os
import queue
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing import reduction
from pathlib import Path
from typing import Any, TypeVar, overload

import torch
import torch._inductor.config
import torch.distributed as dist

from paraxis.dist.groups import ParallelGroups, backend_for, build_groups, pick_device
from paraxis.dist.hidden_gpus import SEEN_GPUS, gpus_seen
from paraxis.dist.rank_server import Inherited, start_rank_server, stop_rank_server
from paraxis.spec.layout import Layout


class RankFailed(AssertionError):
    """A rank raised; the message carries its traceback."""


LayoutLike = Layout | str | int
"""A layout, its text ("dp=2,tp=2"), or a world size n (the layout dp=n)."""

T = TypeVar("T")


def as_layout(layout: LayoutLike) -> Layout:
    """The `Layout` a test names: itself, parsed from text, or dp=n for a world size n."""
    if isinstance(layout, Layout):
        return layout
    if isinstance(layout, str):
        return Layout.parse(layout)
    return Layout(dp=layout)


@dataclass(frozen=True)
class RankContext:
    """What a test body gets on its rank: who it is, the layout, and that layout's groups
    (`groups.dp_rank`, `groups.tp_group`, `groups.next_stage_rank`, ...), already built."""

    rank: int
    world_size: int
    layout: Layout
    groups: ParallelGroups

    def with_layout(self, layout: LayoutLike) -> RankContext:
        """The same ranks under another layout of this world, with its groups created now.
        Creating groups is collective: every rank calls this, in the same order."""
        return _context(layout)


def _context(layout: LayoutLike) -> RankContext:
    layout = as_layout(layout)
    return RankContext(dist.get_rank(), dist.get_world_size(), layout, build_groups(layout))


def _each_layout(body: Callable[..., Any], layouts: list[Layout], *args: Any,
                 **kwargs: Any) -> list[Any]:
    """On one rank: the body once per layout, each time with that layout's fresh groups."""
    results = []
    for layout in layouts:
        try:
            results.append(body(_context(layout), *args, **kwargs))
        except BaseException as error:
            error.add_note(f"(while running layout {layout})")
            raise
    return results


@overload
def run_on_ranks(layouts: LayoutLike, body: Callable[..., T], *args: Any,
                 timeout_s: float = ..., device: str = ..., **kwargs: Any) -> list[T]: ...


@overload
def run_on_ranks(layouts: list[LayoutLike], body: Callable[..., T], *args: Any,
                 timeout_s: float = ..., device: str = ..., **kwargs: Any) -> list[list[T]]: ...


def run_on_ranks(layouts: LayoutLike | list[LayoutLike], body: Callable[..., T], *args: Any,
                 timeout_s: float = 180.0, device: str = "cpu",
                 **kwargs: Any) -> list[T] | list[list[T]]:
    """Run `body(ctx, *args, **kwargs)` on the ranks of `layouts` (one launch) and return
    what it returned: by rank for one layout, by layout then by rank for a list of them."""
    __tracebackhide__ = True
    several = isinstance(layouts, list)
    wanted = [as_layout(layout) for layout in (layouts if several else [layouts])]
    world_size = wanted[0].world_size
    if any(layout.world_size != world_size for layout in wanted):
        raise ValueError("the layouts of one launch must have one world size; got "
                         + ", ".join(f"{layout} ({layout.world_size})" for layout in wanted))
    per_rank = run_distributed(functools.partial(_each_layout, body, wanted), world_size,
                               args, kwargs, timeout_s, device)
    by_layout = [[results[index] for results in per_rank] for index in range(len(wanted))]
    return by_layout if several else by_layout[0]


def on_ranks(layouts: LayoutLike | list[LayoutLike],
             timeout_s: float = 180.0) -> Callable[[Callable[..., Any]], Callable[..., None]]:
    """Decorator: the test body runs on every rank of `layouts` (once per layout for a
    list); pytest sees one test.

    The body's first parameter receives the `RankContext`; pytest fills the others (fixtures,
    parametrize arguments) in the parent, and they travel to the ranks. The body's return
    value is ignored: assert inside it (a failing rank fails the test with its traceback).
    """

    def wrap(body: Callable[..., Any]) -> Callable[..., None]:
        signature = inspect.signature(body)
        if not signature.parameters:
            raise TypeError(f"{body.__name__} must take the RankContext as its first "
                            "parameter: def test_...(ctx, ...)")

        @functools.wraps(body)
        def test(*args: Any, **kwargs: Any) -> None:
            __tracebackhide__ = True
            run_on_ranks(layouts, _DecoratedBody(body), *args, timeout_s=timeout_s, **kwargs)

        # pytest reads the signature to pick fixtures: it must not look for one named ctx.
        test.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=list(signature.parameters.values())[1:])
        test.rank_body = body  # type: ignore[attr-defined]  # how a rank finds it by name
        return test

    return wrap


class _DecoratedBody:
    """A body `on_ranks` decorated, pickled by the name of its test (ranks that start from
    the rank server take what pickles; the body's name holds the decorated test)."""

    def __init__(self, body: Callable[..., Any]) -> None:
        self.body = body

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.body(*args, **kwargs)

    def __reduce__(self) -> tuple:
        if "<locals>" in self.body.__qualname__:  # no name reaches it: pickling says so
            return _DecoratedBody, (self.body,)
        return _decorated_body, (self.body.__module__, self.body.__qualname__)


def _decorated_body(module: str, qualname: str) -> _DecoratedBody:
    test: Any = importlib.import_module(module)
    for name in qualname.split("."):
        test = getattr(test, name)
    return _DecoratedBody(test.rank_body)


# ------------------------------------------- the layer below: a plain function on N ranks


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# How long a rank that reported waits for its caller to read the report before it exits.
READ_WAIT_S = 60.0


def report(results: Any, read: Any, rank: int, status: str, value: Any) -> None:
    """Put a rank's outcome on the caller's queue and stay until the caller has read every
    rank's (`read`, an Event it sets): a tensor goes through the queue as shared memory,
    which the caller fetches from this process as it reads the message, so a rank that had
    exited by then would lose its message (and be read as hung)."""
    results.put((rank, status, value))
    results.close()
    results.join_thread()
    read.wait(READ_WAIT_S)


def _rank_main(fn: Callable[..., Any], rank: int, world_size: int, port: int,
               args: tuple, kwargs: dict, results: Any, read: Any, collective_timeout_s: float,
               device: str = "cpu", share_gpu: bool = False,
               served: tuple[Inherited, dict[str, str]] | None = None) -> None:
    if served is not None:  # forked from the rank server: the caller's stdio and environment
        inherited, environment = served
        inherited.attach()
        os.environ.clear()
        os.environ.update(environment)
    torch.set_num_threads(1)
    # A forked rank inherits the parent's pool of compile workers (torch.compile starts one
    # on first use) without the threads that feed it, and would wait on it forever: it
    # compiles in its own process instead.
    torch._inductor.config.compile_threads = 1
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    try:
        # Device from the local rank, backend from the device, as paraxis.dist.launch does.
        chosen = pick_device(device, share_gpu)
        dist.init_process_group(backend_for(chosen, share_gpu),
                                init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world_size,
                                device_id=chosen if chosen.type == "cuda" and not share_gpu
                                else None,
                                timeout=timedelta(seconds=collective_timeout_s))
        value = fn(*args, **kwargs)
        dist.barrier()
        dist.destroy_process_group()
        outcome = ("ok", value)
    except BaseException:  # noqa: BLE001 - every failure must reach the parent
        outcome = ("error", traceback.format_exc())
    try:
        report(results, read, rank, *outcome)
    finally:
        os._exit(0)  # skip atexit handlers inherited from the pytest process


# A rank's collectives time out this long after the caller's deadline: a rank left waiting
# for one that hangs would otherwise fail its collective at about the same moment the caller
# gives up, and which of the two is reported first would depend on how late each was
# scheduled (the caller read as "rank 1 failed: ... timeout" instead of a hang).
HANG_MARGIN_S = 10.0


# ------------------------------------------------------------ GPUs, seen by spawned ranks


@functools.cache
def gpu_count() -> int:
    """How many GPUs a rank spawned with `device="cuda"` sees (asked of a new process when
    this one hides them; no NVIDIA device file, no GPU, and no process started)."""
    if SEEN_GPUS not in os.environ:
        return torch.cuda.device_count()
    if not Path("/dev/nvidiactl").exists():
        return 0
    with gpus_seen():
        answer = subprocess.run([sys.executable, "-c", "import torch; "
                                 "print(torch.cuda.device_count())"],
                                capture_output=True, text=True, timeout=120)
    return int(answer.stdout.strip() or 0)


def run_distributed(fn: Callable[..., Any], world_size: int, args: tuple = (),
                    kwargs: dict | None = None, timeout_s: float = 180.0,
                    device: str = "cpu", share_gpu: bool = False) -> list[Any]:
    """Run `fn(*args, **kwargs)` on `world_size` ranks; return each rank's result, by rank.
    `share_gpu`: the ranks join `shared_gpu.BACKEND` (gloo through the host), taking the
    GPUs in turn where `device` is "cuda"."""
    __tracebackhide__ = True  # pytest shows the rank's traceback, not this loop
    for attempt in range(PORT_TRIES):
        try:
            return _launch(fn, world_size, args, kwargs, timeout_s, device, share_gpu)
        except RankFailed as failure:
            # The port was free when picked and taken before rank 0 bound it (another test's
            # process): the ranks start again at another, as PyTorch's own distributed tests
            # do (`retry_on_connect_failures`).
            if attempt == PORT_TRIES - 1 or "EADDRINUSE" not in str(failure):
                raise
    raise AssertionError("unreachable")


# Launches a run of ranks may take when the free port it picked is taken before rank 0 binds it.
PORT_TRIES = 3


def _launch(fn: Callable[..., Any], world_size: int, args: tuple, kwargs: dict | None,
            timeout_s: float, device: str, share_gpu: bool) -> list[Any]:
    __tracebackhide__ = True
    served = device != "cuda" and not can_fork_autograd()
    if served:
        try:
            reduction.ForkingPickler.dumps((fn, args, kwargs))
        except Exception as error:  # noqa: BLE001 - whatever pickling raised, in one line
            raise RankFailed(
                "this process can no longer fork ranks (autograd started its device threads "
                "here, as torch.compile's tracing does on some torch builds: PyTorch's wiki, "
                "Autograd-and-Fork), so its ranks start from the rank server, which takes only "
                f"what pickles ({error}): make the body a module-level function and its "
                "arguments picklable") from None
    context = (mp.get_context("spawn") if device == "cuda"
               else start_rank_server(_rank_main) if served else mp.get_context("fork"))
    results, read = context.Queue(), context.Event()
    port = free_port()
    watched, alive = os.pipe() if served else (-1, -1)  # `alive` closes when this process dies
    processes = [context.Process(target=_rank_main, daemon=True,
                                 args=(fn, rank, world_size, port, args, kwargs or {}, results,
                                       read, timeout_s + HANG_MARGIN_S, device, share_gpu,
                                       (Inherited(watched), dict(os.environ)) if served
                                       else None))
                 for rank in range(world_size)]
    try:
        with gpus_seen() if device == "cuda" else contextlib.nullcontext():
            for process in processes:
                process.start()
    except BaseException:
        if served:
            os.close(alive)
        raise
    finally:
        if served:
            os.close(watched)
    collected: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(collected) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(set(range(world_size)) - set(collected))
                raise RankFailed(f"rank(s) {missing} did not finish within {timeout_s:.0f} s "
                                 "(a hang: a collective that some rank never joined?)")
            try:
                rank, status, value = results.get(timeout=min(remaining, 1.0))
            except queue.Empty:  # check for ranks that died without a word
                dead = [r for r, p in enumerate(processes)
                        if p.exitcode not in (None, 0) and r not in collected]
                if dead:
                    raise RankFailed(f"rank {dead[0]} died with exit code "
                                     f"{processes[dead[0]].exitcode}") from None
                continue
            if status == "error":
                raise RankFailed(f"rank {rank} failed:\n{value}")
            collected[rank] = value
    finally:
        read.set()  # every report read (or no more will be): the ranks may exit
        finished = len(collected) == world_size
        for process in processes:
            # After success each rank is exiting; after a failure the ranks still running wait
            # on the one that failed or hung, and end now.
            process.join(timeout=5 if finished else 0)
            if process.is_alive():
                process.kill()
                process.join()
        if served:  # the server preloaded only this module: a later launcher starts its own
            os.close(alive)
            stop_rank_server()
    return [collected[rank] for rank in range(world_size)]


def can_fork_autograd() -> bool:
    """Whether a child forked from this process can run autograd. Once autograd's engine has
    started its device threads here, a forked child's backward raises (PyTorch's wiki,
    Autograd-and-Fork); some torch builds start them on a backward through fake tensors,
    which torch.compile and flex attention trace with, even on a machine with no GPU. The
    engine names those threads pt_autograd_<device>, which Linux shows in /proc; where there
    is no /proc, forking is taken to be safe."""
    tasks = Path("/proc/self/task")
    if not tasks.is_dir():
        return True
    for task in tasks.iterdir():
        with contextlib.suppress(OSError):
            if (task / "comm").read_text().startswith("pt_autograd_"):
                return False
    return True


# ------------------------------------------------------- whole runs of the command line


def flag_args(flags: dict[str, Any]) -> list[str]:
    """`RunConfig.from_flags` keywords as `paraxis train` flags: seq_len=32 is `--seq-len 32`,
    True a bare switch (`quiet=True`: `--quiet`)."""
    args: list[str] = []
    for key, value in flags.items():
        args += [f"--{key.replace('_', '-')}"] + ([] if value is True else [str(value)])
    return args


def train_records(args: list[str], metrics: Path, nproc: int = 1,
                  timeout_s: float = 150) -> list[dict]:
    """Run `paraxis train args` in a new process (under torchrun with `nproc` ranks when
    nproc > 1) and return the records of its metrics file; a non-zero exit fails with the
    tail of its stderr."""
    launcher = [sys.executable, "-m", "paraxis", "train"]
    if nproc > 1:
        launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                    str(nproc), "--master-port", str(free_port()), "-m", "paraxis.train"]
    result = subprocess.run([*launcher, *args, "--metrics-file", str(metrics)],
                            capture_output=True, text=True, timeout=timeout_s)
    if result.returncode != 0:
        raise AssertionError(f"paraxis train exited {result.returncode}:\n"
                             f"{result.stderr[-2000:]}")
    return [json.loads(line) for line in metrics.read_text().splitlines()]


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Torch on one thread, as each rank runs: a test's tiny model in the test process runs
    several times slower on two threads when the machine's cores are busy."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
