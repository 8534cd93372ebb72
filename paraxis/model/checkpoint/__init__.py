"""Sharded checkpoints: save from any layout, load into any layout, read as full tensors.

    save_checkpoint(engine, root, step, model_cfg.to_dict())   # every rank
    load_checkpoint(engine, resolve(path), model_cfg.to_dict(), rank)  # every rank
    read_full_state(path)                                               # one process

`entries` says what a rank holds in single-device coordinates, `save` writes and commits
atomically, `load` reassembles, `convert` rewrites offline and moves weights to and from
Hugging Face. The manifest, which the planner reads without torch, is
`paraxis/files/checkpoint_manifest.py`.
"""

from paraxis.files.checkpoint_manifest import complete_checkpoints, resolve
from paraxis.model.checkpoint.load import CheckpointReader, load_checkpoint, read_full_state
from paraxis.model.checkpoint.save import save_checkpoint

__all__ = ["CheckpointReader", "complete_checkpoints", "load_checkpoint", "read_full_state",
           "resolve", "save_checkpoint"]
