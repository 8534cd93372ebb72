"""What every benchmark row shares: timing a training body on N ranks, and peak memory.

A body runs on every rank (real gloo processes, one thread each, via the test harness) and
returns `measure_steps(step_fn, ...)`'s figures; a row puts paraxis and its peer side by side.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from paraxis.testing import run_distributed


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


def measure_steps(step: Callable[[], None], steps: int, warmup: int = 2) -> dict:
    """Run `warmup` untimed steps, then `steps` timed ones; seconds per step (median), the CPU
    seconds this process used per step (median, all its threads) and the peak RSS of this
    rank over the timed steps."""
    for _ in range(warmup):
        step()
    reset_peak_rss()
    times, cpu = [], []
    for _ in range(steps):
        started, cpu_started = time.perf_counter(), time.process_time()
        step()
        times.append(time.perf_counter() - started)
        cpu.append(time.process_time() - cpu_started)
    return {"step_time_s": statistics.median(times), "cpu_time_s": statistics.median(cpu),
            "peak_rss_bytes": peak_rss_bytes()}


def engine_step(engine, x, y, lr: float = 1e-3, clip: float | None = None  # noqa: ANN001
                ) -> Callable[[], None]:
    """One paraxis training step on a fixed batch, as the training loop runs it."""

    def step() -> None:
        engine.forward_backward(x, y)
        if clip is not None:
            engine.clip_grad_norm(clip)
        engine.optimizer_step(lr)
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


def compare(name: str, ranks: int, tokens_per_step: int, paraxis: tuple[str, Callable],
            peer: tuple[str, Callable], repeats: int = 3) -> Row:
    """Run each body `repeats` times on `ranks` ranks, alternating, and keep the medians.

    A body returns `measure_steps(...)` on every rank; the slowest rank's time counts and the
    largest peak memory of any rank is reported.
    """
    results: dict[str, list[dict]] = {"paraxis": [], "peer": []}
    for _ in range(repeats):
        for key, (_, body) in (("paraxis", paraxis), ("peer", peer)):
            per_rank = run_distributed(body, ranks, timeout_s=900)
            results[key].append({
                "step_time_s": max(r["step_time_s"] for r in per_rank),
                "peak_rss_bytes": max(r["peak_rss_bytes"] for r in per_rank)})

    def median(key: str, field: str) -> float:
        return statistics.median(r[field] for r in results[key])

    return Row(name, ranks, paraxis[0], peer[0], tokens_per_step,
               median("paraxis", "step_time_s"), median("peer", "step_time_s"),
               int(median("paraxis", "peak_rss_bytes")), int(median("peer", "peak_rss_bytes")))
