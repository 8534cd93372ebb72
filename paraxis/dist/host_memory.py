"""Give freed tensor memory back to the operating system on CPU ranks.

glibc's malloc serves large blocks with mmap, which returns them to the system when freed,
and small ones from its heap, which keeps them. The line between the two moves: each time a
mmap'ed block is freed, the threshold rises to that block's size, up to 32 MiB. A training
step frees tensors of every size, so after the first step nearly all of them come from the
heap, and a freed activation or gathered ZeRO-3 unit stays resident. `python -m
tools.probes.memory_probes` measures it on the 0.8B Llama of docs/memory.md at dp=8 zero=3 (6 of
its 24 layers, one step): the largest rank's resident peak was 1,624 MiB with the moving
threshold and 1,430 MiB with it pinned at 1 MiB, for the same 1,100 MiB of tensors. Pinning
it is one `mallopt` call; PyTorch's CPU allocator has no cache of its own to tune instead.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number (malloc.h)
THRESHOLD_BYTES = 1 << 20  # blocks from 1 MiB up are mapped, and unmapped when freed


def return_freed_memory(threshold: int = THRESHOLD_BYTES) -> bool:
    """Pin glibc's mmap threshold (which also stops it moving); False where the C library
    is not glibc (nothing to do: musl and macOS return large blocks on their own)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, threshold))
