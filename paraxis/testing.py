"""Run a function on N real ranks (processes, gloo, one thread each) and collect the results.

    from paraxis.testing import run_distributed

    def body(scale):                 # runs on every rank, process group already set up
        t = torch.tensor([float(dist.get_rank())])
        dist.all_reduce(t)
        return t.item() * scale

    assert run_distributed(body, world_size=4, args=(2,)) == [12.0] * 4

Any rank's exception is raised in the caller with that rank's traceback; a rank that does
not finish within `timeout_s` fails the call instead of hanging it. Processes are forked
(the cheapest start on this machine, ~2 s for 4 ranks) and meet at a fresh TCP port.
With `device="cuda"` each rank takes the GPU of its local rank and joins over NCCL; those
ranks are spawned, not forked (a forked child cannot use CUDA once its parent has touched
it), so `fn` must then be a module-level function.
"""

from __future__ import annotations

import functools
import json
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist


class RankFailed(AssertionError):
    """A rank raised; the message carries its traceback."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_main(fn: Callable[..., Any], rank: int, world_size: int, port: int,
               args: tuple, kwargs: dict, results: Any, collective_timeout_s: float,
               device: str = "cpu") -> None:
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    try:
        # Device from the local rank, backend from the device, as paraxis.runtime does.
        from paraxis.runtime.distributed import backend_for, pick_device

        chosen = pick_device(device)
        dist.init_process_group(backend_for(chosen),
                                init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world_size,
                                device_id=chosen if chosen.type == "cuda" else None,
                                timeout=timedelta(seconds=collective_timeout_s))
        value = fn(*args, **kwargs)
        dist.barrier()
        results.put((rank, "ok", value))
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - every failure must reach the parent
        results.put((rank, "error", traceback.format_exc()))
    finally:
        results.close()
        results.join_thread()
        os._exit(0)  # skip atexit handlers inherited from the pytest process


def run_distributed(fn: Callable[..., Any], world_size: int, args: tuple = (),
                    kwargs: dict | None = None, timeout_s: float = 180.0,
                    device: str = "cpu") -> list[Any]:
    """Run `fn(*args, **kwargs)` on `world_size` ranks; return each rank's result, by rank."""
    context = mp.get_context("spawn" if device == "cuda" else "fork")
    results = context.Queue()
    port = free_port()
    processes = [context.Process(target=_rank_main, daemon=True,
                                 args=(fn, rank, world_size, port, args, kwargs or {}, results,
                                       timeout_s, device))
                 for rank in range(world_size)]
    for process in processes:
        process.start()
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
            except Exception:  # queue.Empty: check for ranks that died without a word
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
        for process in processes:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join()
    return [collected[rank] for rank in range(world_size)]


def distributed(world_size: int, timeout_s: float = 180.0) -> Callable:
    """Decorator: the test body runs on `world_size` ranks; pytest sees one test.

    The body's return value is ignored; assert inside it (a failing rank fails the test with
    its own traceback).
    """

    def wrap(body: Callable[..., Any]) -> Callable[..., None]:
        @functools.wraps(body)
        def test(*args: Any, **kwargs: Any) -> None:
            run_distributed(body, world_size, args, kwargs, timeout_s)

        return test

    return wrap


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
