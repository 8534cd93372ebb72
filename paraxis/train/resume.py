"""Which state a run starts from, and what it saves when: the policy of `paraxis train`.

A run starts from, in this order of precedence:
1. the newest checkpoint in --checkpoint-dir when this is a restarted attempt (--max-restarts
   or torchrun's): the progress made since the job started;
2. --init-from: another run's weights (a paraxis checkpoint or a Hugging Face folder), cut
   for this layout; the optimizer and the learning-rate schedule start fresh;
3. --resume: a checkpoint, the newest in a folder of them, or "auto" (the newest in
   --checkpoint-dir if there is one);
4. else step 0, the seed's weights.

It saves a checkpoint every --checkpoint-every steps, at --exit-after and at the end, and
its resolved config once, at the start (`write_config`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paraxis.dist.groups import restart_attempt
from paraxis.files.checkpoint_manifest import check_model, read_manifest
from paraxis.files.checkpoint_ownership import (
    RunIdentity,
    differences,
    read_identity,
    run_facts,
)
from paraxis.files.host import write_whole
from paraxis.files.model_file import load_model_config
from paraxis.files.run_records import beside
from paraxis.model.checkpoint import complete_checkpoints, load_checkpoint, resolve, save_checkpoint
from paraxis.model.checkpoint.pieces import RegionSource, fill_entries
from paraxis.model.hf import HFReader
from paraxis.spec.errors import ParaxisError, RunFailed
from paraxis.spec.precision import get_policy
from paraxis.train.config import FLAGS
from paraxis.train.lr_schedule import learning_rate
from paraxis.train.run_file import to_toml, with_absolute_paths

if TYPE_CHECKING:
    from paraxis.engine.contract import Engine
    from paraxis.spec.model_config import ModelConfig
    from paraxis.train.config import RunConfig


def resume_source(cfg: RunConfig) -> Path | None:
    """The checkpoint this run continues (None: it starts fresh or from --init-from)."""
    ckpt = cfg.checkpoint
    newest = newest_of_the_folder(Path(ckpt.dir)) if ckpt.dir else None
    if restart_attempt() > 0 and newest:
        return newest[1]
    if ckpt.init_from or not ckpt.resume:
        return None
    if ckpt.resume == "auto":
        return newest[1] if newest else None  # nothing saved yet: a fresh start
    return resolve(ckpt.resume)


def newest_of_the_folder(folder: Path) -> tuple[int, Path] | None:
    """The newest complete checkpoint in --checkpoint-dir, what `--resume auto` and a restart
    continue (None: none yet). One written by another run than the folder's owner (run.json),
    as a step copied in from elsewhere, is refused: it would continue that run, whose seed,
    batch and data are not this folder's."""
    saved = complete_checkpoints(folder)
    if not saved:
        return None
    step, path = saved[-1]
    owner = (read_identity(folder) or {}).get("id")
    writer = (read_manifest(path).get("run") or {}).get("id")
    if owner and writer and writer != owner:
        raise ParaxisError(f"the newest checkpoint in {folder}, {path.name}, belongs to run "
                           f"{writer}, not to run {owner} that owns the folder (its run.json); "
                           f"move {path.name} out of {folder} to continue run {owner}, or "
                           f"continue run {writer} with --resume {path} and another "
                           "--checkpoint-dir")
    return step, path


def already_complete(cfg: RunConfig) -> str | None:
    """With --resume auto, the line saying the newest checkpoint in --checkpoint-dir already
    reached --steps (None otherwise): a scheduler that requeues a job whose stop signal came
    as it finished finds the run done, not an error."""
    ckpt = cfg.checkpoint
    if ckpt.resume != "auto" or not ckpt.dir:
        return None
    newest = newest_of_the_folder(Path(ckpt.dir))  # its manifest read: the step its name says
    if not newest or newest[0] < cfg.train.steps:
        return None
    step, path = newest
    # the same run, or it is not this run that is complete: what a resume would check
    manifest = read_manifest(path)
    check_model(manifest, load_model_config(cfg.model.name).to_dict(), path)
    train, saved = cfg.train, manifest.get("data") or {}
    # the data is not read here: its record is compared with itself
    differ = differences(saved, run_facts(train.global_batch, train.seq_len, train.seed,
                                          saved.get("source"),  # type: ignore[arg-type]
                                          get_policy(train.precision).name))
    if differ and not cfg.checkpoint.allow_changes:
        raise ParaxisError(f"{path} is complete, but for another run: {', '.join(differ)}; "
                           "give the checkpoint's values, or another --checkpoint-dir")
    return (f"{path} is at step {step} of --steps {cfg.train.steps}: the run is complete, "
            "nothing to train (raise --steps to train further)")


def start_step(cfg: RunConfig, engine: Engine, model_cfg: ModelConfig,
               rank: int) -> tuple[int, int]:
    """Load what the run starts from into `engine`; return the step to continue from and the
    samples trained on before it (the checkpoint's count: its run may have changed
    --global-batch on an earlier resume)."""
    path = resume_source(cfg)
    if path is None:
        if cfg.checkpoint.init_from:
            init_from(cfg.checkpoint.init_from, engine, model_cfg, rank)
        return 0, 0
    manifest = load_checkpoint(engine, path, model_cfg.to_dict(), rank)
    step = int(manifest["step"])
    seen = (manifest.get("data") or {}).get("samples_seen")
    samples = seen if isinstance(seen, int) else step * cfg.train.global_batch
    if step >= cfg.train.steps and restart_attempt() > 0:
        # a rank lost after the final checkpoint: the restart finds the run done
        if rank == 0 and not cfg.logging.quiet:
            print(f"paraxis: {path} is at step {step} of --steps {cfg.train.steps}: the run "
                  "is complete, nothing to train", file=sys.stderr, flush=True)
        return step, samples
    if step >= cfg.train.steps:
        raise ParaxisError(f"checkpoint {path} is at step {step}, not before --steps "
                           f"{cfg.train.steps}; raise --steps to train further")
    if rank == 0 and not cfg.logging.quiet:
        print(f"resumed from {path} (step {step}, saved by layout {manifest['layout']})",
              file=sys.stderr, flush=True)
        change = schedule_change(cfg, manifest, step)
        if change:
            print(change, file=sys.stderr, flush=True)
    return step, samples


# The settings the learning rate of a step depends on (`lr_schedule.learning_rate`), by
# their flags' flat keys (`FLAGS`: --warmup sets optimizer.warmup_steps)
SCHEDULE_KEYS = ("steps", "lr", "min_lr_ratio", "warmup")


def schedule_facts(cfg: RunConfig) -> dict[str, float]:
    """The schedule's settings by field name (as a checkpoint's manifest records them)."""
    return {FLAGS[key][1]: getattr(getattr(cfg, FLAGS[key][0]), FLAGS[key][1])
            for key in SCHEDULE_KEYS}


def schedule_change(cfg: RunConfig, manifest: dict[str, Any], step: int) -> str | None:
    """A note where a resumed run's learning-rate schedule is not its checkpoint's (a
    raised --steps stretches the cosine, a new --lr rescales it): what changed, and the
    rate the resumed step takes beside the one the checkpoint's schedule gave it."""
    saved = (manifest.get("data") or {}).get("schedule")
    now = schedule_facts(cfg)
    if not isinstance(saved, dict) or set(saved) != set(now) or saved == now:
        return None
    fields = {key: FLAGS[key][1] for key in SCHEDULE_KEYS}
    before = cfg.with_flags(**{key: saved[name] for key, name in fields.items()})
    changed = ", ".join(f"--{key.replace('_', '-')} {saved[name]:g} -> {now[name]:g}"
                        for key, name in fields.items() if saved[name] != now[name])
    return (f"paraxis: note: the learning-rate schedule is not the checkpoint's ({changed}): "
            f"step {step} runs at lr {learning_rate(step, cfg):.3g} where the checkpoint's "
            f"schedule gave {learning_rate(step, before):.3g}")


def init_from(path: str, engine: Engine, model_cfg: ModelConfig, rank: int) -> None:
    """Start from another run's weights (a paraxis checkpoint or a Hugging Face directory),
    cut for this layout; the optimizer and the schedule start fresh."""
    if (Path(path) / "config.json").is_file():
        reader = HFReader(path)  # reads headers only; each rank then reads just its pieces
        check_model({"model": reader.cfg.to_dict()}, model_cfg.to_dict(), Path(path))
        fill_entries(engine, RegionSource(reader.region, reader.shapes), ("param",), path)
    else:
        load_checkpoint(engine, resolve(path), model_cfg.to_dict(), rank, weights_only=True)


def save_due(cfg: RunConfig, done: int) -> bool:
    """Whether to save after `done` steps: every --checkpoint-every, at --exit-after and at
    the end (only with --checkpoint-dir)."""
    every = cfg.checkpoint.every
    return bool(cfg.checkpoint.dir) and (done == cfg.train.steps
                                         or done == cfg.checkpoint.exit_after
                                         or (every > 0 and done % every == 0))


def save(cfg: RunConfig, engine: Engine, model_cfg: ModelConfig, step: int,
         claim: RunIdentity | None = None, samples_seen: int | None = None) -> None:
    """A checkpoint of `step` steps done, with the resolved config, the data position
    (`samples_seen`: the samples trained on so far, default `step` global batches) and the
    run it belongs to (`paraxis/train/claim.py`: pruning touches this run's checkpoints
    only)."""
    train = cfg.train
    if samples_seen is None:
        samples_seen = step * train.global_batch
    data = {"seed": train.seed, "next_step": step, "samples_seen": samples_seen,
            "global_batch": train.global_batch, "seq_len": train.seq_len,
            "precision": get_policy(train.precision).name, "schedule": schedule_facts(cfg)}
    run = None
    if claim is not None:
        data["source"] = claim.facts["source"]
        run = claim.manifest_entry()
    save_checkpoint(engine, cfg.checkpoint.dir, step, model_cfg.to_dict(),
                    config_toml=to_toml(with_absolute_paths(cfg)), keep=cfg.checkpoint.keep,
                    extra={"data": data}, run=run)


def trim_metrics(path: Path, start_step: int) -> None:
    """Drop the metrics lines of steps >= start_step (logged after the checkpoint a resumed
    run continues from, before the run stopped), so the file holds each step once."""
    if not path.is_file():
        return
    kept = []
    for line in path.read_text().splitlines(keepends=True):
        try:
            step = json.loads(line).get("step")
        except (ValueError, AttributeError):
            continue  # a line cut short by the crash
        if isinstance(step, int) and step < start_step:
            kept.append(line)
    try:
        write_whole(path, "".join(kept))
    except OSError as error:  # the file itself is left as it was
        raise RunFailed(f"cannot rewrite the metrics file {path} for the resumed run "
                        f"({error.strerror}); free space or choose another "
                        "--metrics-file") from None


def write_config(cfg: RunConfig) -> None:
    """The resolved config beside the metrics file (`run_records.beside`: config.toml beside
    a metrics.jsonl; it reads back with --config) with the model's fields (model.json), and
    one line saying where; checkpoints carry their own copy."""
    where = None
    if cfg.logging.metrics_file:
        path = beside(cfg.logging.metrics_file, "config.toml")
        # and the model it trains, field by field: a model file edited after the run would
        # otherwise make diagnose and report price another model than the one that ran
        model = beside(cfg.logging.metrics_file, "model.json")
        try:
            write_whole(path, to_toml(with_absolute_paths(cfg)))
            write_whole(model, json.dumps(load_model_config(cfg.model.name).to_dict(),
                                          indent=1) + "\n")
        except OSError as error:
            raise RunFailed(f"cannot write {path} ({error.strerror}); free space or choose "
                            "another --metrics-file") from None
        where = str(path)
    elif cfg.checkpoint.dir:
        where = f"config.toml in every checkpoint under {cfg.checkpoint.dir}"
    if where and not cfg.logging.quiet:
        print(f"resolved config: {where}", file=sys.stderr, flush=True)
