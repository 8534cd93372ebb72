"""Sharded checkpoints: save from any layout, load into any layout, read as full tensors.

    save_checkpoint(engine, root, step, groups, model_cfg.to_dict())   # every rank
    load_checkpoint(engine, resolve(path), model_cfg.to_dict(), rank)  # every rank
    read_full_state(path)                                               # one process

`entries` says what a rank holds in single-device coordinates, `save` writes and commits
atomically, `load` reassembles, `manifest` checks, `convert` rewrites offline.
"""

from paraxis.checkpoint.load import CheckpointReader, load_checkpoint, read_full_state
from paraxis.checkpoint.manifest import complete_checkpoints, resolve
from paraxis.checkpoint.save import save_checkpoint

__all__ = ["CheckpointReader", "complete_checkpoints", "load_checkpoint", "read_full_state",
           "resolve", "save_checkpoint"]
