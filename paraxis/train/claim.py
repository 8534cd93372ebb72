"""Who may write in a checkpoint folder: the policy over `files/checkpoint_ownership.py`.

    with claim_folder(cfg, data) as claim:     # the process that holds the lock
        ...                                     # train; claim.run_id goes into each manifest

A folder belongs to one run. A fresh run is refused (one line) in a folder that holds another
run's checkpoints, or whose lock a live run holds; a resuming run (`--resume`, or an
automatic restart) continues the run of the checkpoint it loads, takes over a lock whose
owner is dead or silent past --timeout-s (saying so in one line), and must share the
checkpoint's global batch, sequence length, seed and data unless --allow-resume-changes.

The process that claims holds the lock: a single process, the `--nproc` launcher (for every
rank and every restart: its ranks find the claim in their environment, `LOCK_ENV`), or
rank 0 of a torchrun job (which tells the other ranks the outcome with one broadcast, so a
refusal is one line and exit code 2 on every rank instead of a hang).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from paraxis.data.blend import Blend
from paraxis.dist.groups import restart_attempt
from paraxis.dist.watchdog import WATCH
from paraxis.files.checkpoint_manifest import check_model, complete_checkpoints, read_manifest
from paraxis.files.checkpoint_ownership import (
    LOCK_ENV,
    LOCK_FILE,
    FolderLock,
    RunIdentity,
    describe_holder,
    differences,
    new_run_id,
    owner_state,
    read_identity,
    read_json,
    run_facts,
)
from paraxis.files.host import outermost_missing
from paraxis.files.model_file import load_model_config
from paraxis.spec.errors import ParaxisError
from paraxis.spec.precision import get_policy
from paraxis.train.resume import resume_source

if TYPE_CHECKING:
    from paraxis.data.corpus import TokenData
    from paraxis.train.config import RunConfig


@dataclass
class Claim(RunIdentity):
    """This run's hold on its checkpoint folder: its identity, and the lock itself where this
    process holds it."""

    lock: FolderLock | None = None
    created: Path | None = None  # the folder, where this claim made it

    def __enter__(self) -> Claim:
        if self.lock is not None:  # ranks started from here write as this holder
            os.environ[LOCK_ENV] = json.dumps({"run_id": self.run_id, "token": self.token,
                                               "facts": self.facts})
        return self

    def __exit__(self, *exc: object) -> None:
        if self.lock is not None:
            os.environ.pop(LOCK_ENV, None)
        self.release()

    def release(self) -> None:
        """Give the folder back (only the holder of the lock has anything to give)."""
        if self.lock is not None:
            self.lock.release()
            created = self.created
            if created is not None and not any(p.is_file() for p in created.rglob("*")):
                shutil.rmtree(created, ignore_errors=True)  # a run that wrote nothing


def facts_of(cfg: RunConfig, data: TokenData | Blend) -> dict[str, Any]:
    train = cfg.train
    return run_facts(train.global_batch, train.seq_len, train.seed, Blend.of(data).facts(),
                     get_policy(train.precision).name)


def claim_folder(cfg: RunConfig, data: TokenData | Blend, rank: int = 0, world: int = 1
                 ) -> Claim | None:
    """Create the run's output folders and claim --checkpoint-dir for this run (None without
    one), before the first step; collective when world > 1."""
    held = os.environ.get(LOCK_ENV)
    if held:
        return Claim(**json.loads(held))
    if world == 1:
        return _prepare(cfg, data)
    outcome: list[Any] = [{}]
    claim = None
    if rank == 0:
        try:
            claim = _prepare(cfg, data)
            if claim is not None:
                outcome = [{"run_id": claim.run_id, "token": claim.token, "facts": claim.facts}]
        except ParaxisError as error:
            outcome = [{"error": str(error)}]
    with WATCH.waiting("broadcast (checkpoint folder claim)"):
        dist.broadcast_object_list(outcome, src=0)
    if "error" in outcome[0]:
        error = ParaxisError(outcome[0]["error"])
        error.same_on_every_rank = True  # rank 0 says it; every rank exits with code 2
        raise error
    if claim is not None or not outcome[0]:
        return claim
    return Claim(**outcome[0])


def _prepare(cfg: RunConfig, data: TokenData | Blend) -> Claim | None:
    """The checkpoint folder's claim (without one, a resume's checks alone), then the
    TensorBoard folder, created now, so that a path that cannot be one fails before
    training and a run refused creates nothing."""
    claim = None
    if cfg.checkpoint.dir:
        try:
            claim = _claim(cfg, facts_of(cfg, data))
        except OSError as error:
            raise ParaxisError(f"--checkpoint-dir {cfg.checkpoint.dir} cannot be used "
                               f"({error.strerror}: {error.filename}); choose another "
                               "folder") from None
    elif (source := resume_source(cfg)) is not None and restart_attempt() == 0:
        _check_same_run(cfg, source, read_manifest(source), facts_of(cfg, data))
    if cfg.logging.tensorboard:
        try:
            Path(cfg.logging.tensorboard).mkdir(parents=True, exist_ok=True)
        except OSError as error:
            if claim is not None:
                claim.release()
            raise ParaxisError(f"--tensorboard {cfg.logging.tensorboard} cannot be created "
                               f"({error.strerror}); choose another folder") from None
    return claim


def _claim(cfg: RunConfig, facts: dict[str, Any]) -> Claim:
    folder = Path(cfg.checkpoint.dir)
    source = resume_source(cfg)
    run_id = new_run_id()
    if source is not None:
        manifest = read_manifest(source)
        identity = read_identity(folder) if folder.is_dir() else None
        run_id = (manifest.get("run") or {}).get("id") or (identity or {}).get("id") or run_id
        if restart_attempt() == 0:
            # the checkpoint's model first: a refused resume leaves the folder untouched
            check_model(manifest, load_model_config(cfg.model.name).to_dict(), source)
            _check_same_run(cfg, source, manifest, facts)
            _check_no_later_line(folder, source, manifest.get("step"))
    _check_owner(folder, run_id, source, cfg.train.timeout_s)  # before touching anything
    _check_space(cfg, folder)
    created = outermost_missing(folder)
    folder.mkdir(parents=True, exist_ok=True)
    lock = _take_lock(cfg, folder, run_id, source is not None)
    try:
        _check_owner(folder, run_id, source, cfg.train.timeout_s)  # again, now it is ours
    except ParaxisError:
        lock.release()
        raise
    return Claim(run_id, lock.token, facts, lock, created)


def _check_owner(folder: Path, run_id: str, source: Path | None, timeout_s: float) -> None:
    """The folder must be this run's, or nobody's; a run that holds it now is named as such
    (its lock's holder alive: `--resume auto` would be refused as well)."""
    if not folder.is_dir():
        return
    identity = read_identity(folder)
    holder = read_json(folder / LOCK_FILE, "the lock") if (folder / LOCK_FILE).is_file() \
        else None
    if (identity is not None and identity["id"] != run_id and holder is not None
            and owner_state(holder, timeout_s) == "alive"):
        raise ParaxisError(f"checkpoint folder {folder} is in use by "
                           f"{describe_holder(holder)}; wait for it to end, or give "
                           "another --checkpoint-dir")
    saved = complete_checkpoints(folder)
    newest = f", newest step-{saved[-1][0]}" if saved else ""
    if identity is not None and identity["id"] != run_id:
        how = ("continue that run with --resume auto, or give another --checkpoint-dir"
               if source is None else f"this run continues run {run_id} ({source}): give "
               "another --checkpoint-dir")
        raise ParaxisError(f"checkpoint folder {folder} belongs to run {identity['id']}"
                           f"{newest}; {how}")
    if identity is None and saved and (source is None
                                       or source.resolve().parent != folder.resolve()):
        raise ParaxisError(f"checkpoint folder {folder} already holds checkpoints (step-"
                           f"{saved[0][0]}..{saved[-1][0]}); continue them with --resume auto, "
                           "or give an empty --checkpoint-dir")


def _check_no_later_line(folder: Path, source: Path, step: int | None) -> None:
    """A resume from a checkpoint with later ones of the folder beside it would train a
    second line of steps into one folder: pruning (by step) would delete the new line's
    checkpoints, a crash's `--resume auto` would take up the abandoned line's newest, and
    the metrics of the two would mix."""
    if step is None:
        return
    later = [path.name for saved, path in complete_checkpoints(folder) if saved > step]
    if later:
        raise ParaxisError(f"resuming {source} (step {step}) in {folder}, which holds later "
                           f"checkpoints ({', '.join(later)}); move them out of the folder "
                           "to train from the earlier step, resume the newest with --resume "
                           "auto, or give another --checkpoint-dir")


def _check_space(cfg: RunConfig, folder: Path) -> None:
    """One checkpoint must fit: parameters and AdamW's two moments, 4 bytes each (fp32
    masters under every precision policy), in the free space of the folder's disk."""
    need = 12 * load_model_config(cfg.model.name).num_params()
    existing = folder
    while not existing.exists():  # the folder may not exist yet: its disk does
        existing = existing.parent
    free = shutil.disk_usage(existing).free
    if free < need:
        raise ParaxisError(f"checkpoint folder {folder} has {free / 1e9:.3g} GB free but one "
                           f"checkpoint of this model takes about {need / 1e9:.3g} GB "
                           "(parameters and AdamW moments in fp32); free space or choose "
                           "another --checkpoint-dir")


def _take_lock(cfg: RunConfig, folder: Path, run_id: str, resuming: bool) -> FolderLock:
    timeout_s = cfg.train.timeout_s
    lock = FolderLock(folder, run_id, timeout_s)
    for _ in range(3):
        if lock.try_create():
            return lock
        holder = read_json(folder / LOCK_FILE, "the lock")
        if holder is None:
            continue  # released a moment ago
        state = owner_state(holder, timeout_s)
        same_job = restart_attempt() > 0 and holder.get("run") == run_id
        if state == "alive" and not same_job:
            raise ParaxisError(f"checkpoint folder {folder} is in use by "
                               f"{describe_holder(holder)}; wait for it to end, or give "
                               "another --checkpoint-dir")
        nothing_to_take = not complete_checkpoints(folder) and read_identity(folder) is None
        if not (resuming or nothing_to_take):
            raise ParaxisError(f"checkpoint folder {folder} is locked by {state} "
                               f"{describe_holder(holder)}; continue that run with --resume "
                               "auto (which takes the lock over), or give another "
                               "--checkpoint-dir")
        print(f"paraxis: taking over checkpoint folder {folder} from {state} "
              f"{describe_holder(holder)}", file=sys.stderr, flush=True)
        (folder / LOCK_FILE).unlink(missing_ok=True)
    raise ParaxisError(f"checkpoint folder {folder} was claimed by another run at the same "
                       "moment; give another --checkpoint-dir")


def _check_same_run(cfg: RunConfig, source: Path, manifest: dict[str, Any],
                    facts: dict[str, Any]) -> None:
    """A resume continues the same run: same global batch, sequence length, seed, data."""
    differ = differences(manifest.get("data") or {}, facts)
    if not differ:
        return
    listed = ", ".join(differ)
    if cfg.checkpoint.allow_changes:
        print(f"paraxis: warning: resuming {source} with {listed}: the run will not continue "
              "as it would have", file=sys.stderr, flush=True)
        return
    raise ParaxisError(f"resuming {source} with {listed}; use the checkpoint's values, add "
                       "--allow-resume-changes to go on anyway, or start a new run from its "
                       "weights with --init-from")
