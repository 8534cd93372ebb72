"""Saving a sharded checkpoint: every rank writes its own pieces, rank 0 commits.

    save_checkpoint(engine, root, step, model_cfg, config_toml)   # on every rank

1. rank 0 creates `root/step-N.tmp/` (clearing a stale one a crash left behind);
2. each rank writes `rank-R.safetensors` (and `rank-R-1.safetensors`, ... past 256 MiB: one
   file's worth is copied at a time): the pieces it owns (`entries.Entry.owner`, so a
   replicated tensor is written once) and its RNG state;
3. rank 0 gathers every rank's piece list and checksum, writes `manifest.json` and
   `config.toml`, and renames the directory to `step-N`: the rename is the commit, so a crash
   at any earlier point leaves the previous checkpoint as the latest and this one invisible;
4. rank 0 deletes the run's own complete checkpoints beyond the newest `keep`.

Each step ends in a watched collective (a broadcast of rank 0's outcome, or the gather), and
a failed write on any rank (a full disk) is agreed on there: every rank raises the same
one-line `RunFailed` instead of the others waiting out the timeout.

The directory must be visible to every rank (one machine, or a shared filesystem across
nodes, as Megatron-LM and DeepSpeed assume).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors import SafetensorError
from safetensors.torch import save_file

from paraxis.dist.watchdog import WATCH
from paraxis.files.checkpoint_manifest import (
    FORMAT,
    MANIFEST,
    VERSION,
    complete_checkpoints,
    sha256_of,
    step_dir_name,
    with_checksum,
)
from paraxis.files.checkpoint_ownership import still_held, write_identity
from paraxis.files.host import flush_to_disk, plain_mode, sync_folder, write_error_reason
from paraxis.model.checkpoint.entries import Checkpointable, optimizer_steps
from paraxis.spec.errors import RunFailed
from paraxis.spec.units import runs_within

# Test hook: "STEP:RANK" makes that rank exit right after writing its shard file of that
# step's save, as a node dying mid-checkpoint would (the crash test in tests/).
FAIL_ENV = "PARAXIS_TEST_DIE_DURING_SAVE"


FILE_BYTES = 256 * 2**20  # the most piece bytes one file holds (a rank writes several)


def rank_file(rank: int, part: int = 0) -> str:
    """The rank's first file (which also holds its RNG state), or its part-th."""
    return f"rank-{rank:05d}.safetensors" if part == 0 else f"rank-{rank:05d}-{part}.safetensors"


def save_checkpoint(engine: Checkpointable, root: str | Path, step: int,
                    model: dict[str, Any], config_toml: str = "", keep: int = 0,
                    extra: dict[str, Any] | None = None,
                    run: dict[str, Any] | None = None) -> Path:
    """Write the engine's state as checkpoint `root/step-<step>`; collective. Returns its path.

    model: the ModelConfig as a dict (checked on load); extra: small JSON facts to keep
    (data position, ...); keep: how many complete checkpoints to retain (0: all; with `run`,
    only that run's own are ever pruned); run: the run that holds the folder ({"id", "token",
    "facts"}, `train/claim.py`): the save refuses if the folder's lock is no longer its
    own, and its first checkpoint records the run as the folder's owner.
    """
    root = Path(root)
    rank = dist.get_rank() if dist.is_initialized() else 0
    final = root / step_dir_name(step)
    tmp = root / (final.name + ".tmp")
    # Every failure (a full disk, a lost lock) is agreed on, so that every rank raises the
    # same one line instead of the others waiting out the timeout at the next barrier.
    problem = None
    if rank == 0:
        if run is not None and run.get("token") and not still_held(root, run["token"]):
            problem = (f"checkpoint folder {root} is no longer this run's (its lock was taken "
                       "over while this run was silent); stopping without saving")
        else:
            problem = _attempt(lambda: _fresh_dir(tmp), tmp, rank)
    _raise_agreed(_from_rank_0(problem))

    files: list[dict[str, Any]] = []
    pieces: list[dict[str, Any]] = []
    problem = _attempt(lambda: _write_pieces(engine, tmp, rank, files, pieces), tmp, rank)
    _maybe_die(step, rank)
    gathered = _gather({"files": files, "pieces": pieces, "problem": problem})
    problem = next((g["problem"] for g in gathered if g["problem"]), None)
    if problem and rank == 0:  # every rank is done with it: give its space back
        shutil.rmtree(tmp, ignore_errors=True)
    _raise_agreed(problem)

    problem = None
    if rank == 0:
        manifest = {
            "format": FORMAT, "version": VERSION, "step": step,
            "optimizer_steps": optimizer_steps(engine.optimizer), "has_optimizer": True,
            "layout": str(engine.layout), "world_size": len(gathered), "model": model,
            "files": {f["file"]: {"sha256": f["sha256"], "bytes": f["bytes"]}
                      for g in gathered for f in g["files"]},
            "pieces": [p for g in gathered for p in g["pieces"]],
            # fp16's dynamic loss scale (the same on every rank), so a resume keeps it
            "loss_scaler": (engine.loss_scaler.state_dict() if engine.loss_scaler is not None
                            else None),
            **(extra or {}),
            **({"run": {"id": run["id"]}} if run else {}),
        }

        def finish() -> None:
            commit(tmp, final, manifest, config_toml)
            if run is not None:
                write_identity(root, run["id"], run.get("facts"))
            prune(root, keep, run["id"] if run else None)

        problem = _attempt(finish, tmp, rank)
    _raise_agreed(_from_rank_0(problem))
    return final


def _fresh_dir(tmp: Path) -> None:
    """An empty `step-N.tmp/` (a crash may have left one behind)."""
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)


def _write_pieces(engine: Checkpointable, tmp: Path, rank: int, files: list[dict[str, Any]],
                  pieces: list[dict[str, Any]]) -> None:
    """This rank's files: the pieces it owns, at most FILE_BYTES of them per file."""
    entries = [e for e in engine.checkpoint_entries() if e.owner]
    for part, group in enumerate(runs_within(
            entries, lambda e: e.tensor.numel() * e.tensor.element_size(), FILE_BYTES)):
        # A copy of each piece: ZeRO's parameters are views of one flat buffer, and
        # safetensors stores tensors that share memory only once. One file's worth at a time,
        # so saving needs at most FILE_BYTES on top of what the rank holds.
        tensors = {e.key: e.tensor.detach().to("cpu", copy=True).contiguous() for e in group}
        if part == 0:
            tensors["rng/torch"] = torch.get_rng_state()
            if torch.cuda.is_available() and engine.device.type == "cuda":
                tensors["rng/cuda"] = torch.cuda.get_rng_state(engine.device)
        name = rank_file(rank, part)
        _write_tensors(tensors, tmp / name)
        del tensors
        files.append({"file": name, "sha256": sha256_of(tmp / name),
                      "bytes": (tmp / name).stat().st_size})
        pieces += [{**e.describe(), "file": name, "key": e.key} for e in group]
        WATCH.progress()  # long local work: not stuck


def _attempt(action: Callable[[], None], tmp: Path, rank: int) -> str | None:
    """Run `action`; a failed write (full disk, permissions) becomes one line (None: ok).
    safetensors reports its own write errors (SafetensorError: "No space left on device")."""
    try:
        action()
    except OSError as error:
        reason = f"{error.strerror}: {error.filename}"
    except SafetensorError as error:
        reason = write_error_reason(error)
    else:
        return None
    return (f"rank {rank}: cannot write checkpoint {tmp} ({reason}); free space or fix the "
            "folder, then resume from the previous checkpoint with --resume auto")


def _raise_agreed(problem: str | None) -> None:
    if problem:
        failure = RunFailed(problem)
        failure.same_on_every_rank = True  # every rank raises it: rank 0 says it
        raise failure


def _from_rank_0(problem: str | None) -> str | None:
    """Rank 0's outcome on every rank (the sync point a barrier was)."""
    if not dist.is_initialized():
        return problem
    box = [problem]
    with WATCH.waiting("broadcast (checkpoint save)"):
        dist.broadcast_object_list(box, src=0)
    return box[0]


def commit(tmp: Path, final: Path, manifest: dict[str, Any], config_toml: str) -> None:
    """Write the manifest last, then rename: the checkpoint appears complete or not at all."""
    if config_toml:
        (tmp / "config.toml").write_text(config_toml)
    _write_durably(tmp / MANIFEST, json.dumps(with_checksum(manifest), indent=1))
    if final.exists():  # the same step saved again (a resumed run): replace it whole
        old = final.with_name(final.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old)
    else:
        os.rename(tmp, final)
    sync_folder(final.parent)


def prune(root: Path, keep: int, run_id: str | None = None) -> None:
    """Delete all but the newest `keep` complete checkpoints: of run `run_id` alone when
    given (another run's checkpoints, or ones that name no run, are never touched)."""
    if keep <= 0:
        return
    mine = [directory for _, directory in complete_checkpoints(root)
            if run_id is None or _run_of(directory) == run_id]
    for directory in mine[:-keep]:
        shutil.rmtree(directory)


def _run_of(directory: Path) -> str | None:
    try:
        return (json.loads((directory / MANIFEST).read_text()).get("run") or {}).get("id")
    except (OSError, ValueError, AttributeError):
        return None


def _write_tensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    save_file(tensors, str(path))
    plain_mode(path)
    with open(path, "rb") as handle:
        flush_to_disk(handle)


def _write_durably(path: Path, text: str) -> None:
    with open(path, "w") as handle:
        handle.write(text)
        flush_to_disk(handle)


def _gather(mine: dict[str, Any]) -> list[dict[str, Any]]:
    if not dist.is_initialized():
        return [mine]
    out: list[Any] = [None] * dist.get_world_size()
    with WATCH.waiting("all_gather_object (checkpoint save)"):
        dist.all_gather_object(out, mine)
    return out


def _maybe_die(step: int, rank: int) -> None:
    spec = os.environ.get(FAIL_ENV)
    if spec and spec == f"{step}:{rank}":
        os.kill(os.getpid(), signal.SIGKILL)  # a node lost between shard files and manifest
