"""Sharded checkpoints: save from any layout, load into any layout, read as full tensors.

    save_checkpoint(engine, root, step, model_cfg.to_dict())   # every rank
    load_checkpoint(engine, resolve(path), model_cfg.to_dict(), rank)  # every rank
    read_full_state(path)                                               # one process

`entries` says what a rank holds in single-device coordinates, `save` writes and commits
atomically, `load` reassembles, `manifest` checks (pure Python), `convert` rewrites offline
and moves weights to and from Hugging Face. Names below are imported on first use, so the
manifest helpers stay importable without torch (the planner reads a checkpoint's model).
"""

import importlib
from typing import Any

_EXPORTS = {"CheckpointReader": "load", "load_checkpoint": "load", "read_full_state": "load",
            "complete_checkpoints": "manifest", "resolve": "manifest",
            "save_checkpoint": "save"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:  # PEP 562: exports load on first use
    if name not in _EXPORTS:
        raise AttributeError(f"module 'paraxis.checkpoint' has no attribute {name!r}")
    return getattr(importlib.import_module(f"paraxis.checkpoint.{_EXPORTS[name]}"), name)
