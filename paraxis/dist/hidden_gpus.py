"""A test process that forks CPU ranks must not see a GPU, and the GPU ranks it spawns must.

Once a backward has run in a process that sees a GPU, autograd keeps a thread per GPU, and a
child forked after that cannot run autograd at all (PyTorch wiki, "Autograd and Fork"). The
test suite therefore hides the GPUs from its own process before torch is imported
(tests/conftest.py), and `paraxis.dist.testing.run_distributed(..., device="cuda")` spawns its
ranks with them seen again. No torch here: hiding must come before CUDA starts.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

SEEN_GPUS = "PARAXIS_SEEN_GPUS"  # CUDA_VISIBLE_DEVICES as it was before `hide_gpus`
UNSET = "<unset>"


def hide_gpus() -> None:
    """Let this process see no GPU (call it before anything touches CUDA); the ranks that
    `run_distributed(..., device="cuda")` spawns see the GPUs it could see."""
    if SEEN_GPUS not in os.environ:
        os.environ[SEEN_GPUS] = os.environ.get("CUDA_VISIBLE_DEVICES", UNSET)
        os.environ["CUDA_VISIBLE_DEVICES"] = ""


@contextlib.contextmanager
def gpus_seen() -> Iterator[None]:
    """The environment of a spawned GPU rank: the GPUs from before `hide_gpus`."""
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    seen = os.environ.get(SEEN_GPUS)
    if seen is not None:
        _set_visible(None if seen == UNSET else seen)
    try:
        yield
    finally:
        if seen is not None:
            _set_visible(hidden)


def _set_visible(devices: str | None) -> None:
    """CUDA_VISIBLE_DEVICES set to `devices`, or unset for None (a process that inherited
    the marks of `hide_gpus` may have no such variable at all)."""
    if devices is None:
        os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = devices
