"""Start N ranks on this machine, watch them, stop them together (`paraxis train --nproc N`).

    launch(run_training, (cfg,), nproc=4)     # rank 0's return value comes back

Each rank runs `fn(*args)` in its own process with the environment torchrun would give it
(RANK, WORLD_SIZE, MASTER_ADDR, ...), so the function `torchrun -m paraxis.train` reaches on
every rank runs here unchanged: one machine needs no torchrun, and several machines use
torchrun with its own flags (`torchrun --nnodes 2 --nproc-per-node 8 --rdzv-endpoint
host:port -m paraxis.train ...`). `fn` must be a module-level function (it is pickled by
name). The ranks fork from a server process that imported torch and `fn`'s module once
(`rank_server`), and take this process's environment, folder, stdout and stderr as they are
at the launch.

Nothing listens beyond loopback unless `host` says so: this process hosts the rendezvous
store on a socket bound to 127.0.0.1 (torch's elastic agent binds its stores to every
interface, whatever address it is given), the ranks join it as clients (torchrun's
agent-store convention), and gloo is pinned to the loopback interface.

Each rank reports its own failure in one line (`bad_input.run_guarded`); when one fails, the
others get a moment to report theirs, then are stopped, and this process adds one line
naming the ranks that failed.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import socket
import sys
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paraxis.dist.bad_input import decide, run_guarded
from paraxis.dist.host_memory import return_freed_memory
from paraxis.dist.preemption import CatchSignals
from paraxis.dist.rank_server import Inherited, start_rank_server, stop_rank_server
from paraxis.files.checkpoint_manifest import complete_checkpoints
from paraxis.files.host import available_host_bytes
from paraxis.spec.errors import CommFailure, ParaxisError, RunFailed

if TYPE_CHECKING:
    from multiprocessing.queues import Queue

LOOPBACK = "127.0.0.1"
# A rank's memory before it builds any model: the interpreter, torch and gloo (about 220 MB
# resident per idle CPU rank, measured on a 2-core Linux host with PyTorch 2.13)
RANK_BASELINE_BYTES = 0.22e9


def _rank_entry(fn: Callable[..., Any], args: tuple, one_thread: bool, debug: bool,
                env: dict[str, str], results: Queue, inherited: Inherited) -> None:
    inherited.attach()
    os.environ.clear()  # the launcher's environment now, not the fork server's at its start
    os.environ.update(env)
    import torch  # lazy: torch, preloaded by the fork server

    from paraxis.dist.groups import end_rank_process  # lazy: torch, after the rank's env is set

    # torch read OMP_NUM_THREADS when the fork server imported it: the rank's value, now
    torch.set_num_threads(1 if one_thread else int(env["OMP_NUM_THREADS"]))
    if one_thread:  # CPU ranks share the machine's cores: one thread each avoids oversubscription
        return_freed_memory()  # and its memory: freed tensors go back (dist/host_memory.py)
    returned: list[Any] = []

    def body() -> int:
        try:
            returned.append(fn(*args))
            return 0
        except ParaxisError as error:
            if not _told_launcher(error, results, debug):
                # No lingering after the line (`CommFailure.linger_s`, for torchrun, which
                # ends the job at its first exit): this launcher itself waits for the rest.
                error.linger_s = 0.0
                raise
            return error.exit_code

    code = run_guarded(body, debug=debug)
    if code:
        sys.exit(code)  # the rank already said why, in one line
    if env["RANK"] == "0":
        results.put(("result", returned[0]))
    results.close()
    results.join_thread()
    end_rank_process(0)  # gloo's threads may still hold tensors: no finalization


def _told_launcher(error: ParaxisError, results: Queue, debug: bool) -> bool:
    """Bad input (exit code 2) and what every rank says alike (a preemption) go to the
    launcher, which prints each distinct line once: one line, not one per rank."""
    if debug or not (error.exit_code == 2 or getattr(error, "same_on_every_rank", False)):
        return False
    decide(error)  # marks the attempt as ended by bad input: a peer that lost this rank is quiet
    results.put(("error", str(error), error.exit_code))
    results.close()
    results.join_thread()
    return True


def launch(fn: Callable[..., Any], args: tuple, nproc: int, host: str = LOOPBACK,
           max_restarts: int = 0, debug: bool = False, timeout_s: float = 600.0,
           device: str = "auto", checkpoint_dir: str | None = None) -> Any:
    """Run `fn(*args)` on `nproc` local ranks; return what rank 0's call returned.

    max_restarts: when any rank dies (killed, an exception, out of memory), every rank is
    stopped and all start again, up to this many times, with TORCHELASTIC_RESTART_COUNT set
    as under torchrun --max-restarts (training resumes from its newest checkpoint then:
    `train/resume.py`). timeout_s bounds the store's waits; `device` says whether the
    ranks run on the CPU (then one thread each); `checkpoint_dir` is where the ranks save,
    named when a signal stops them without a line of their own.
    """
    import torch  # lazy: torch; CLI start-up imports this

    # several CPU ranks share the cores, one thread each; one rank (launched to be restarted)
    # computes as the process would alone, on torch's own thread count
    cpu = device == "cpu" or (device == "auto" and not torch.cuda.is_available())
    one_thread = cpu and nproc > 1
    threads = os.environ.get("OMP_NUM_THREADS", "1" if nproc > 1 else
                             str(torch.get_num_threads()))
    try:
        for attempt in range(max_restarts + 1):
            try:
                return _launch_once(fn, args, nproc, host, debug, attempt, timeout_s,
                                    one_thread, checkpoint_dir, threads)
            except RunFailed as failure:
                if attempt == max_restarts:
                    raise
                print(f"paraxis: {failure}; restarting every rank from the newest checkpoint "
                      f"(restart {attempt + 1} of {max_restarts})", file=sys.stderr, flush=True)
        raise AssertionError("unreachable")
    finally:
        stop_rank_server()  # nothing of the run outlives it


def _launch_once(fn: Callable[..., Any], args: tuple, nproc: int, host: str, debug: bool,
                 attempt: int, timeout_s: float, one_thread: bool,
                 checkpoint_dir: str | None, threads: str = "1") -> Any:
    import torch.distributed as dist  # lazy: torch; CLI start-up imports this

    # The store listens on a socket bound to `host` alone (TCPStore would bind them all);
    # the store owns the socket from here on and closes it.
    try:
        listener = socket.create_server((host, 0), backlog=max(128, 4 * nproc))
    except OSError as error:
        raise ParaxisError(f"--rdzv-host {host} cannot be listened on here ({error.strerror});"
                           " give an address of this machine (127.0.0.1 for one machine)"
                           ) from None
    port = listener.getsockname()[1]
    try:
        store = dist.TCPStore(host, port, is_master=True, master_listen_fd=listener.detach(),
                              wait_for_workers=False, timeout=timedelta(seconds=timeout_s))
    except dist.DistError as error:
        raise RunFailed(f"the launcher's rendezvous store did not start within --timeout-s "
                        f"{timeout_s:g} ({str(error).splitlines()[0][:120]}); give a larger "
                        "--timeout-s") from None
    common = {"MASTER_ADDR": host, "MASTER_PORT": str(port), "WORLD_SIZE": str(nproc),
              "LOCAL_WORLD_SIZE": str(nproc), "TORCHELASTIC_USE_AGENT_STORE": "True",
              "TORCHELASTIC_RESTART_COUNT": str(attempt),
              "OMP_NUM_THREADS": threads}
    if host == LOOPBACK and "GLOO_SOCKET_IFNAME" not in os.environ:
        common["GLOO_SOCKET_IFNAME"] = "lo"
    context = start_rank_server(fn)
    results = context.Queue()
    watched, alive = os.pipe()  # `alive` closes when this process dies: the ranks then stop
    processes = [context.Process(target=_rank_entry, name=f"paraxis-rank-{rank}", args=(
        fn, args, one_thread, debug,
        {**os.environ, **common, "RANK": str(rank), "LOCAL_RANK": str(rank)}, results,
        Inherited(watched))) for rank in range(nproc)]
    try:
        for process in processes:
            process.start()
    finally:
        os.close(watched)
    try:
        with _PassSignals(processes) as signals:
            return _watch(processes, results, timeout_s, signals, checkpoint_dir)
    finally:
        _stop(processes)
        os.close(alive)
        del store


class _PassSignals(CatchSignals):
    """While the ranks run, SIGTERM, SIGHUP or SIGINT to the launcher reaches them (as
    SIGTERM: a terminal's Ctrl-C already reached them as SIGINT, and a second SIGINT would
    stop them without a checkpoint); they stop together at the next step boundary, saving a
    checkpoint (`dist/preemption.py`). A second signal stops them at once."""

    def __init__(self, processes: list) -> None:
        super().__init__()
        self.processes = processes
        self.count = 0  # signals received: a second one kills the ranks, nothing saved

    def _handle(self, signum: int, frame: object) -> None:
        passed = signal.SIGKILL if self.signum else signal.SIGTERM
        self.signum = self.signum or signum
        self.count += 1
        for process in self.processes:
            if process.exitcode is None and process.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, passed)


def _watch(processes: list, results: Queue, timeout_s: float, signals: _PassSignals,
           checkpoint_dir: str | None = None) -> Any:
    """Wait for every rank to exit 0 (then return rank 0's result) or for one to fail."""
    returned, received = None, False
    said: dict[str, int] = {}  # lines the ranks left to the launcher -> their exit code
    while True:
        try:
            kind, *payload = results.get(timeout=0.1)
            if kind == "result":
                returned, received = payload[0], True
            else:
                said.setdefault(payload[0], payload[1])
        except queue.Empty:
            pass
        codes = [p.exitcode for p in processes]
        if all(code == 0 for code in codes):  # done (a signal that came too late changes nothing)
            return returned if received else results.get(timeout=timeout_s)[1]
        if signals.signum or any(code not in (None, 0) for code in codes):
            _wait_for_the_rest(processes, results, said, signals)
            if signals.signum:
                said = _as_received(said, signals.signum)
            if said:  # bad input or a preemption: the same line from every rank, once
                error = ParaxisError("; ".join(said))
                error.exit_code = max(said.values())
                raise error
            if signals.signum:
                error = ParaxisError(stopped_line(signals.signum, signals.count, checkpoint_dir))
                error.exit_code = 128 + signals.signum
                raise error
            raise RunFailed(failure_summary([p.exitcode for p in processes]))


def _as_received(said: dict[str, int], signum: int) -> dict[str, int]:
    """The ranks' preemption lines as the launcher's own signal: it passed them SIGTERM
    whatever it received, so a Ctrl-C or a closed terminal ends as 130 or 129, as documented."""
    passed = f"stopped by {signal.SIGTERM.name}"
    received = f"stopped by {signal.Signals(signum).name}"
    return {line.replace(passed, received): (128 + signum if code == 128 + signal.SIGTERM
                                             else code)
            for line, code in said.items()}


def _wait_for_the_rest(processes: list, results: Queue, said: dict[str, int],
                       signals: _PassSignals) -> None:
    """After a failure the others' waits expire a moment later: let them say so. After a
    signal, wait for every rank to save and stop (their watchdog bounds it)."""
    deadline = time.monotonic() + CommFailure.linger_s + 2.0
    while any(p.exitcode is None for p in processes) and (
            signals.signum or time.monotonic() < deadline):
        with contextlib.suppress(queue.Empty):
            kind, *payload = results.get(timeout=0.1)
            if kind == "error":
                said.setdefault(payload[0], payload[1])
    with contextlib.suppress(queue.Empty):  # lines put just before their rank exited
        while True:
            kind, *payload = results.get(timeout=0.2)
            if kind == "error":
                said.setdefault(payload[0], payload[1])


def _stop(processes: list) -> None:
    """Stop whoever is still running: the run failed, so there is nothing to save (SIGKILL:
    SIGTERM would ask them to save at the next step, with a peer gone)."""
    for process in processes:
        if process.exitcode is None:
            process.kill()
    for process in processes:
        process.join()


def stopped_line(signum: int, count: int, checkpoint_dir: str | None) -> str:
    """What a signal to the launcher ended when no rank said so itself (a rank stopped within
    the training steps saves and says which step): a second signal killed the ranks, or the
    first came while they started up or finished; then what --checkpoint-dir holds now."""
    how = ("a second signal stopped the ranks at once, without saving" if count > 1 else
           "the ranks were outside the training steps (starting up or finishing), where a "
           "signal saves nothing")
    if not checkpoint_dir:
        saved = "no --checkpoint-dir, so nothing was saved"
    elif checkpoints := complete_checkpoints(Path(checkpoint_dir)):
        step, path = checkpoints[-1]
        saved = (f"the newest checkpoint is {path} (step {step}): continue from it with "
                 "--resume auto")
    else:
        saved = f"no checkpoint was saved in {checkpoint_dir}"
    return f"stopped by {signal.Signals(signum).name}: {how}; {saved}"


def failure_summary(codes: list[int | None]) -> str:
    """"rank 1 was killed by SIGKILL, rank 0 was stopped by the launcher (of 2 ranks); ..." in
    one line. A rank that exited with a code said why in its own line (`run_guarded`, or
    Python's traceback); a rank killed by a signal wrote nothing, so the line says where such
    a signal comes from instead of pointing at a line that is not there."""
    parts, signals, exited = [], set(), False
    for rank, code in enumerate(codes):
        if code is None:
            parts.append(f"rank {rank} was stopped by the launcher")
        elif code < 0:
            signals.add(signal.Signals(-code).name)
            parts.append(f"rank {rank} was killed by {signal.Signals(-code).name}")
        elif code > 0:
            exited = True
            parts.append(f"rank {rank} exited with code {code}")
    why = []
    if signals:
        source = ("the kernel's out-of-memory killer or a kill command (`dmesg` names the "
                  "first)" if signals == {"SIGKILL"} else "outside the run or a crash in "
                  "native code")
        why.append(f"a rank killed by {' or '.join(sorted(signals))} writes no line of its "
                   f"own: the signal came from {source}")
    if exited:
        why.append("a rank that exited with a code said why in its own line above (--debug "
                   "for tracebacks)")
    return "; ".join([f"{', '.join(parts)} (of {len(codes)} ranks)", *why])


TORCHRUN_VARIABLES = ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT")


def check_rank_environment(nproc: int) -> None:
    """Refuse torchrun's variables half set, or naming another world than --nproc: left in
    the shell by an earlier job, they would make this process wait for peers that never come."""
    if "WORLD_SIZE" not in os.environ:
        return
    world = os.environ["WORLD_SIZE"]
    unset = "unset " + " ".join(TORCHRUN_VARIABLES)
    missing = [name for name in TORCHRUN_VARIABLES if name not in os.environ]
    message = None
    if missing:
        message = (f"WORLD_SIZE={world} is set but {', '.join(missing)} "
                   f"{'is' if len(missing) == 1 else 'are'} not: torchrun sets them together; "
                   f"{unset} (left from another job?), or start the run with torchrun")
    elif nproc > 1 and world != str(nproc):
        message = (f"--nproc {nproc} starts its own ranks, but WORLD_SIZE={world} says this "
                   f"process is one of {world} torchrun ranks; {unset} (left from another "
                   "job?), or drop --nproc under torchrun")
    if message:
        error = ParaxisError(message)
        error.not_a_rank = True  # no job store to agree through: its variables are the fault
        raise error


def check_cuda_ranks(nproc: int, device: str, share_gpu: bool = False) -> None:
    """Refuse, before any rank starts, `--device cuda` where no GPU is visible and more
    CUDA ranks on this machine than the GPUs it shows (each rank takes its own GPU, unless
    `share_gpu`; torchrun across hosts places its ranks itself)."""
    if not device.startswith("cuda"):
        return
    import torch  # lazy: torch; CLI start-up imports this

    message = cuda_ranks_problem(nproc, device, torch.cuda.device_count(),
                                 os.environ.get("CUDA_VISIBLE_DEVICES"), share_gpu)
    if message:
        raise ParaxisError(message)


def cuda_ranks_problem(nproc: int, device: str, gpus: int, visible: str | None,
                       share_gpu: bool = False) -> str | None:
    """What is wrong with `nproc` ranks on `device` where `gpus` GPUs are visible (None:
    nothing); `visible` is CUDA_VISIBLE_DEVICES, named in the message where it is set."""
    shown = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
    if gpus == 0:
        return (f"--device {device} was asked for but this machine shows no CUDA GPU{shown}; "
                "use --device cpu")
    if share_gpu:
        return None
    if device != "cuda" and nproc > 1:  # every rank would share that one GPU
        return (f"--device {device} names one GPU for all {nproc} ranks; use --device cuda "
                "(each rank takes its own), or add --share-gpu")
    if nproc > gpus:
        return (f"--nproc {nproc} CUDA ranks need a GPU each, and this machine shows {gpus}"
                f"{shown}; use --nproc {gpus}, --device cpu for {nproc} CPU ranks, or "
                f"--share-gpu to run them on the {gpus} (slow: collectives through the host)")
    return None


def check_host_memory(nproc: int) -> None:
    """Refuse more ranks than this machine's available memory holds even idle, before any
    starts: the kernel's out-of-memory killer would otherwise end the largest process, which
    may not be one of them."""
    need, have = nproc * RANK_BASELINE_BYTES, available_host_bytes()
    if need > have:
        most = max(1, int(have // RANK_BASELINE_BYTES))
        raise ParaxisError(f"--nproc {nproc} ranks need about {need / 1e9:,.0f} GB before any "
                           f"model ({RANK_BASELINE_BYTES / 1e9:g} GB each: Python, torch and "
                           f"gloo) and this machine has {have / 1e9:,.1f} GB available; use "
                           f"--nproc {most} or fewer")


def warn_if_oversubscribed(nproc: int, device: str) -> None:
    """One line when CPU ranks outnumber the cores this process may use: the run works,
    only slower (every rank wants a core of its own)."""
    import torch  # lazy: torch; CLI start-up imports this

    if device.startswith("cuda") or (device == "auto" and torch.cuda.is_available()):
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if cores and nproc > cores:
        print(f"paraxis: warning: {nproc} ranks on {cores} CPU core{'s' * (cores > 1)}: they "
              f"will share cores and every step will be slower; for speed use --nproc {cores}",
              file=sys.stderr, flush=True)
