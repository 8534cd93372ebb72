"""Checks of a run config for values that used to fail late, after training had started (a
traceback at the first save), or to be silently ignored. `RunConfig.check` calls them, so
they run before anything is created, in the process that starts the run."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

from paraxis.spec.errors import ParaxisError

if TYPE_CHECKING:
    from paraxis.spec.layout import Layout
    from paraxis.spec.model_config import ModelConfig
    from paraxis.train.config import RunConfig


def check_late_failures(cfg: RunConfig) -> None:
    """One-line errors for the seed, gradient clip, peak TFLOP/s, --memory-gb and
    --predicted-step-s (auto or not), --exit-after, a negative
    --prefetch, an interleaved schedule without a pipeline, packing with context parallelism,
    and every folder the run will write."""
    train, opt, ckpt, log = cfg.train, cfg.optimizer, cfg.checkpoint, cfg.logging
    if not 0 <= train.seed < 2**63:  # torch.manual_seed takes a signed 64-bit integer
        raise ParaxisError(f"--seed {train.seed} must be between 0 and 2**63 - 1 (numpy's "
                           "and torch's generators take non-negative 64-bit seeds)")
    if not opt.grad_clip >= 0 or opt.grad_clip == math.inf:
        raise ParaxisError(f"--grad-clip {opt.grad_clip} must be a finite number >= 0 "
                           "(0 turns it off)")
    if log.peak_tflops is not None and not 0 < log.peak_tflops < math.inf:
        raise ParaxisError(f"--peak-tflops {log.peak_tflops} must be a positive number "
                           "(one device's peak, e.g. 989 for an H100's bf16)")
    for flag, value, unit in (("--memory-gb", cfg.auto.memory_gb, "GB per rank"),
                              ("--predicted-step-s", cfg.auto.predicted_step_s, "seconds")):
        if value is not None and not 0 < value < math.inf:  # with or without --layout auto
            raise ParaxisError(f"{flag} {value} must be a positive number of {unit}; leave "
                               "the flag out for the default")
    if ckpt.exit_after is not None and not ckpt.dir:
        raise ParaxisError("--exit-after needs --checkpoint-dir: it stops with a "
                           "checkpoint to continue from")
    if cfg.data.prefetch < 0:
        raise ParaxisError(f"--prefetch {cfg.data.prefetch} must be >= 0 (0: no read-ahead)")
    layout = cfg.layout
    if layout.pp == 1 and (layout.schedule == "interleaved" or layout.virtual_stages > 1):
        raise ParaxisError(f"schedule={layout.schedule} needs pp > 1 (it runs "
                           f"{layout.virtual_stages if layout.virtual_stages > 1 else 'several'}"
                           " model chunks on each pipeline stage); raise pp or use "
                           "schedule=1f1b")
    for flag, given in (("--checkpoint-dir", ckpt.dir), ("--tensorboard", log.tensorboard),
                        ("--metrics-file", log.metrics_file)):
        if given is not None and not given.strip():  # "" would write into the working folder
            raise ParaxisError(f"{flag} is empty; give a path, or leave the flag out")
    for flag, folder in (("--checkpoint-dir", ckpt.dir), ("--tensorboard", log.tensorboard)):
        if folder:
            check_writable_folder(Path(folder), flag)


def check_writable_folder(path: str | Path, flag: str, example: str = "pictures") -> None:
    """Fail before training if the folder `path` cannot be created or written in; a flag's
    empty text (which Path reads as the current folder) is refused."""
    if isinstance(path, str):
        if not path.strip():
            raise ParaxisError(f"{flag} is empty; give a folder, e.g. {example}")
        path = Path(path)
    if path.exists() and not path.is_dir():
        raise ParaxisError(f"{flag} {path} is a file, not a folder; choose another path")
    folder = path
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise ParaxisError(f"{flag} {path} cannot be written ({folder} is not a writable "
                           "folder); choose another path")


def check_writable(path: Path, flag: str) -> None:
    """Fail before training (and before creating anything) if `path` cannot be written."""
    if path.is_dir():
        raise ParaxisError(f"{flag} {path} is a folder; give a file name inside it")
    folder = path.parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise ParaxisError(f"{flag} {path} cannot be written ({folder} is not a writable "
                           "folder); choose another path")


def outermost_missing(path: Path) -> Path | None:
    """The outermost folder of `path` (itself included) that does not exist yet: what
    creating `path` makes, and what to remove again if nothing lands in it (None: none)."""
    return next((folder for folder in reversed((path, *path.parents))
                 if not folder.exists()), None)


def host_ram_bytes() -> float:
    """This machine's RAM."""
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def available_host_bytes() -> float:
    """Memory a new allocation can have now (the kernel's MemAvailable), else the RAM."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return host_ram_bytes()


def check_states_fit(model: ModelConfig, layout: Layout, precision: str,
                     device_memory_bytes: float | None) -> None:
    """Refuse, before anything is allocated, a layout whose model states alone (parameters,
    gradients, optimizer states: the planner's count, which the runtime's tensors equal)
    exceed what one rank has: its GPU's memory, or on a CPU (`device_memory_bytes` None)
    this machine's available memory shared by the node's ranks."""
    from paraxis.plan.memory import layout_memory
    from paraxis.spec.precision import get_policy
    from paraxis.spec.state_bytes import Precision

    memory = layout_memory(model, layout, 1, 1, Precision.of(get_policy(precision)))
    states = memory["params"] + memory["grads"] + memory["optimizer"]
    if device_memory_bytes is None:
        ranks, available = int(os.environ.get("LOCAL_WORLD_SIZE", 1)), available_host_bytes()
        have = available / ranks
        where = (f"the {have / 1e9:,.1f} GB each of this machine's {ranks} ranks has of its "
                 f"{available / 1e9:,.1f} GB available" if ranks > 1 else
                 f"this machine's {available / 1e9:,.1f} GB available")
    else:
        have = device_memory_bytes
        where = f"its GPU's {have / 1e9:,.1f} GB"
    if states > have:
        raise ParaxisError(
            f"{model.name} at layout {layout} holds {states / 1e9:,.1f} GB of model states per "
            f"rank (parameters, gradients, optimizer; {precision}), more than {where}; shard "
            f"them over more ranks (--zero 3, --tp, --pp{', --ep, --etp' * model.is_moe}): "
            f"`paraxis plan --model {model.name} "
            "--gpus N` finds a layout that fits")
