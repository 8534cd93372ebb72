"""What every benchmark row shares: timing a training body on N ranks, and peak memory.

A side of a row is a setup that runs on every rank (real gloo processes, one thread each,
via the test harness), builds its model and returns one training step; `compare` times
paraxis's step next to its peer's, alternating them in the same processes.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from paraxis.dist.testing import run_distributed
from paraxis.engine.contract import Engine
from paraxis.train.calibrate.kernels import sync as _sync


def reset_peak_rss() -> None:
    """Restart the kernel's peak-RSS counter (VmHWM) for this process (Linux >= 4.0)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def peak_rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def rank_device() -> torch.device:
    """This rank's device: its GPU when the ranks run over NCCL, else the CPU."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def token_batch(vocab_size: int, batch: int, seq: int, device: torch.device | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed random batch (seed 0) on `device` (default: this rank's): inputs and
    next-token targets."""
    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab_size, (batch, seq + 1), generator=generator)
    tokens = tokens.to(device or rank_device())
    return tokens[:, :-1], tokens[:, 1:]


def bench_device(ranks: int) -> str:
    """CUDA with NCCL when the machine has a GPU for every rank, else the CPU with gloo."""
    return "cuda" if torch.cuda.is_available() and torch.cuda.device_count() >= ranks else "cpu"


def _peak_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return peak_rss_bytes()


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    else:
        reset_peak_rss()


def measure_steps(step: Callable[[], None], steps: int, warmup: int = 2,
                  device: torch.device | None = None) -> dict:
    """Run `warmup` untimed steps, then `steps` timed ones; seconds per step (median), the CPU
    seconds this process used per step (median, all its threads) and the peak memory of this
    rank over the timed steps (RSS; on a GPU, allocated GPU memory). `device`: where the step
    runs (default: this rank's, `rank_device`)."""
    device = device or rank_device()
    for _ in range(warmup):
        step()
    _sync(device)
    _reset_peak(device)
    times, cpu = [], []
    for _ in range(steps):
        started, cpu_started = time.perf_counter(), time.process_time()
        step()
        _sync(device)
        times.append(time.perf_counter() - started)
        cpu.append(time.process_time() - cpu_started)
    return {"step_time_s": statistics.median(times), "cpu_time_s": statistics.median(cpu),
            "peak_memory_bytes": _peak_bytes(device)}


def engine_step(engine: Engine, x: torch.Tensor, y: torch.Tensor, lr: float = 1e-3,
                clip: float | None = None) -> Callable[[], None]:
    """One paraxis training step on a fixed batch, as the training loop runs it."""

    def step() -> None:
        if clip is None:  # as the peers it is compared with: no gradient norm at all
            engine.forward_backward(x, y)
            engine.optimizer_step(lr)
        else:  # the loop's step: nothing read from the device until it is all queued
            engine.train_step(x, y, lr, clip)
        engine.zero_grad()

    return step


@dataclass
class Row:
    """One line of the benchmark table: paraxis next to its peer on the same work."""

    name: str
    ranks: int
    paraxis: str
    peer: str
    tokens_per_step: int
    paraxis_step_time_s: float
    peer_step_time_s: float
    paraxis_peak_rss_bytes: int
    peer_peak_rss_bytes: int
    ratio_interval: tuple[float, float] = (0.0, 0.0)  # 95% bootstrap interval of `ratio`
    steps_timed: int = 0  # per side

    @property
    def paraxis_tokens_per_s(self) -> float:
        return self.tokens_per_step / self.paraxis_step_time_s

    @property
    def peer_tokens_per_s(self) -> float:
        return self.tokens_per_step / self.peer_step_time_s

    @property
    def ratio(self) -> float:
        """paraxis throughput / peer throughput (>= 1.0: paraxis is as fast or faster)."""
        return self.peer_step_time_s / self.paraxis_step_time_s

    def to_dict(self) -> dict:
        return {**asdict(self), "paraxis_tokens_per_s": self.paraxis_tokens_per_s,
                "peer_tokens_per_s": self.peer_tokens_per_s, "ratio": self.ratio}


Setup = Callable[[], Callable[[], None]]  # runs on every rank: builds, returns one step


def _paired_times(setups: tuple[Setup, Setup], steps: int, warmup: int) -> list[list[float]]:
    """Both sides built in the same processes, their steps alternated (ABBA...): a slow
    spell of this shared machine lands on both alike. Seconds per step, per side, from a
    common start to this rank's end (the step's time is the slowest rank's)."""
    step_fns = [setup() for setup in setups]
    for _ in range(warmup):
        for step in step_fns:
            step()
    times: list[list[float]] = [[], []]
    device = rank_device()
    for i in range(steps):
        for side in ((0, 1) if i % 2 == 0 else (1, 0)):
            # Every rank starts the step together, so no side inherits the other's tail
            # (a pipeline's last stage finishes before its first one does).
            _sync(device)
            dist.barrier()
            started = time.perf_counter()
            step_fns[side]()
            _sync(device)
            times[side].append(time.perf_counter() - started)
    return times


def _peak_memory(setup: Setup, steps: int, warmup: int) -> int:
    """Peak memory of this rank (RSS; on a GPU, allocated GPU memory) over `steps` steps of
    one side, run alone in its processes."""
    return measure_steps(setup(), steps, warmup)["peak_memory_bytes"]


def compare(name: str, ranks: int, tokens_per_step: int, paraxis: tuple[str, Setup],
            peer: tuple[str, Setup], steps: int, warmup: int = 2, repeats: int = 3,
            device: str | None = None) -> Row:
    """paraxis next to its peer on `ranks` ranks.

    Time: `repeats` runs, each building both sides in the same processes and alternating
    their steps (`_paired_times`); a step counts at its slowest rank, a side's figure is the
    median over all its steps, and the ratio's interval comes from `ratio_interval`.
    Alternating step by step matters here: on this shared 2-core machine the speed drifts by
    10-20% over seconds, which separate runs turn into noise as large as the differences
    being measured.
    Memory: each side alone in its own processes (largest peak RSS of any rank; on a GPU,
    the largest peak of allocated GPU memory).
    Device: `device` ("cpu": gloo) if given, else CUDA with NCCL where the machine has a GPU
    for every rank, else CPU with gloo.
    """
    device = device or bench_device(ranks)
    runs: list[list[tuple[float, float]]] = []  # per run: (paraxis, peer) seconds per step
    for _ in range(repeats):
        per_rank = run_distributed(lambda: _paired_times((paraxis[1], peer[1]), steps, warmup),
                                   ranks, timeout_s=900, device=device)
        runs.append([(max(r[0][i] for r in per_rank), max(r[1][i] for r in per_rank))
                     for i in range(steps)])
    peaks = [max(run_distributed(lambda s=setup: _peak_memory(s, min(steps, 3), 1), ranks,
                                 timeout_s=900, device=device))
             for setup in (paraxis[1], peer[1])]
    pairs = [pair for run in runs for pair in run]
    return Row(name, ranks, paraxis[0], peer[0], tokens_per_step,
               statistics.median(a for a, _ in pairs), statistics.median(b for _, b in pairs),
               peaks[0], peaks[1], ratio_interval(runs), len(pairs))


def ratio_interval(runs: list[list[tuple[float, float]]], draws: int = 2000,
                   seed: int = 0) -> tuple[float, float]:
    """95% interval of median(peer) / median(paraxis) by a two-stage bootstrap: draw the runs
    (process launches differ from each other more than steps within one do), then the step
    pairs within each drawn run (a paraxis step and the peer step next to it stay together:
    they saw the same machine)."""
    rng = random.Random(seed)
    ratios = []
    for _ in range(draws):
        sample = [pair for run in rng.choices(runs, k=len(runs))
                  for pair in rng.choices(run, k=len(run))]
        ratios.append(statistics.median(b for _, b in sample)
                      / statistics.median(a for a, _ in sample))
    ratios.sort()
    return ratios[int(0.025 * draws)], ratios[int(0.975 * draws) - 1]


def quick_flag(doc: str, quick_help: str) -> bool:
    """Whether the command line asks for `--quick` (a smoke run); `doc`'s first line is the
    command's description."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=quick_help)
    return parser.parse_args().quick
