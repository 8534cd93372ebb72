"""Units, and the default sizes that more than one module reads (no torch import)."""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TypeVar

Item = TypeVar("Item")

GB = 1e9  # decimal, as GPU datasheets and the course count memory (16 x 7e9 bytes = 112 GB)
MIB = 2**20  # binary, as the CUDA driver (nvidia-smi) and PyTorch's bucket sizes count

# The data-parallel gradient bucket: PyTorch DDP's bucket_cap_mb = 25, counted in MiB
# (torch/nn/parallel/distributed.py: "bucket_cap_mb: Single bucket size limit in MiB");
# paraxis's runtime fills buckets of this size; the planner prices their calls and memory.
DEFAULT_BUCKET_MB = 25.0
DEFAULT_BUCKET_BYTES = int(DEFAULT_BUCKET_MB * MIB)

# Memory held back from the model on every GPU: the CUDA context, NCCL workspaces and the
# allocator's slack (a round 2 GB; a CPU profile replaces it with a rank's measured baseline).
DEFAULT_RESERVED_BYTES = 2e9


def runs_within(items: Iterable[Item], nbytes: Callable[[Item], int], limit: float
                ) -> list[list[Item]]:
    """`items` in order, cut into consecutive runs of at most `limit` bytes (an item larger
    than `limit` alone): how gradient sums and checkpoint files are grouped."""
    runs: list[list[Item]] = [[]]
    size = 0
    for item in items:
        n = nbytes(item)
        if runs[-1] and size + n > limit:
            runs.append([])
            size = 0
        runs[-1].append(item)
        size += n
    return runs


def seconds(value: float, step: float) -> str:
    """`value` seconds, printed beside a step of `step` seconds: to hundredths where steps
    take a second or more, else to as many places as show a small model's hundredths of
    its step (0.0213 s, not 0.02)."""
    places = math.ceil(2 - math.log10(step)) if 0 < step < 1 else 2
    return f"{value:.{places}f}"


def gigabytes(value: float) -> str:
    """A memory size in GB as the planner's lines give a device's: whole GB, a small
    device's (under 10 GB) to 0.01 GB."""
    gb = value / GB
    return f"{gb:.{2 if gb < 10 else 0}f}"
