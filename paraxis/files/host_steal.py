"""CPU time the hypervisor took from this (virtual) machine: a run's disturbance, measured.

On a VM a virtual CPU that is ready to run may still wait for the host to schedule it: Linux
counts that wait as "steal" time (/proc/stat, the eighth figure of the `cpu` line, in
clock ticks over all CPUs). Ranks that synchronise often suffer it far beyond its share
(`python -m tools.probes.host_steal` measures `paraxis demo`'s step against it;
tools/probes/README.md). A forecast made from a calibration cannot know what the host will
take during the run; the run can measure it, and a report can say so.

Reads a file; imports nothing else (the planner's `--verify` reads runs too). Where there
is no /proc/stat (not Linux) every reading is None.
"""

from __future__ import annotations

from pathlib import Path

PROC_STAT = Path("/proc/stat")
# The share of CPU time stolen above which a run or a calibration did not have this
# machine's cores as a quiet VM does (between the quiet and the disturbed runs of
# `tools.probes.host_steal`; docs/benchmarks.md's steal column spans 0-40%).
DISTURBED_STEAL = 0.08


def cpu_ticks(stat: Path = PROC_STAT) -> tuple[int, int] | None:
    """(stolen, total) clock ticks of all CPUs since boot; None where they cannot be read."""
    try:
        line = stat.read_text().split("\n", 1)[0]
    except OSError:
        return None
    fields = line.split()
    if not fields or fields[0] != "cpu" or len(fields) < 9:
        return None
    # user nice system idle iowait irq softirq steal (guest times are inside user/nice)
    ticks = [int(value) for value in fields[1:9]]
    return ticks[7], sum(ticks)


def stolen_share(start: tuple[int, int] | None, end: tuple[int, int] | None) -> float | None:
    """The share of CPU time stolen between two `cpu_ticks` readings (None if either is
    missing or no tick passed)."""
    if start is None or end is None or end[1] <= start[1]:
        return None
    return (end[0] - start[0]) / (end[1] - start[1])


class StealMeter:
    """Stolen share over a stretch of time: `with StealMeter() as meter: ...; meter.share`."""

    def __init__(self) -> None:
        self.start: tuple[int, int] | None = None
        self.share: float | None = None

    def __enter__(self) -> StealMeter:
        self.start = cpu_ticks()
        return self

    def __exit__(self, *exc: object) -> None:
        self.share = stolen_share(self.start, cpu_ticks())
