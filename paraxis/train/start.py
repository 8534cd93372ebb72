"""Where a run's ranks come from: this process alone, N processes it launches itself
(`--nproc N`, `paraxis/dist/launch.py`), or one rank of a job torchrun started. Bad input
fails here in one line, not in N tracebacks."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from collections.abc import Callable
from pathlib import Path

from paraxis.data.blend import Blend, load_run_data
from paraxis.dist.launch import (
    check_cuda_ranks,
    check_host_memory,
    check_rank_environment,
    launch,
    warn_if_oversubscribed,
)
from paraxis.dist.rank_server import start_rank_server, stop_rank_server
from paraxis.files.model_file import load_model_config
from paraxis.spec.errors import ParaxisError
from paraxis.spec.precision import fp8_shape_problem, get_policy
from paraxis.train.auto_layout import measured_line, resolve
from paraxis.train.config import RunConfig
from paraxis.train.loop import RUN_IMPORTS


def start(cfg: RunConfig, train: Callable[[RunConfig], object], debug: bool = False) -> int:
    """Run `train(cfg)` here, on `--nproc` ranks launched from here, or as one rank of a
    torchrun job. Bad input fails here in one line, not in N tracebacks."""
    if not launches(cfg) or "WORLD_SIZE" in os.environ:
        return _start(cfg, train, debug)
    start_rank_server(train, RUN_IMPORTS)  # it imports torch for the ranks meanwhile
    try:
        return _start(cfg, train, debug)
    finally:
        stop_rank_server()  # stopped by the launch, or left unused by bad input


def launches(cfg: RunConfig) -> bool:
    """Whether the run starts its ranks from here: several, or one that the launcher
    restarts (`--max-restarts`) when it dies."""
    return cfg.launch.nproc > 1 or cfg.launch.max_restarts > 0


def with_launch_layout(cfg: RunConfig) -> RunConfig:
    """`cfg` with `--nproc N` alone (no degree given) as N-way data parallelism."""
    nproc = cfg.launch.nproc
    if nproc > 1 and cfg.layout.world_size == 1:
        return dataclasses.replace(cfg, layout=cfg.layout.replace(dp=nproc))
    return cfg


def _start(cfg: RunConfig, train: Callable[[RunConfig], object], debug: bool) -> int:
    check_rank_environment(cfg.launch.nproc)
    launched = "WORLD_SIZE" in os.environ  # torchrun (or a launcher) started this rank
    checked = None  # the data `check_inputs` returned, where it ran before torch
    if not launched and not cfg.auto.enabled:
        # the checks the run makes before training, made before importing torch (seconds):
        # a mistyped flag, an unknown model, missing data or an unwritable folder fails at
        # once (a run that may be complete already is told so first: `already_complete`)
        nproc = cfg.launch.nproc
        cfg = with_launch_layout(cfg)
        cfg.check()
        if not (cfg.checkpoint.resume == "auto" and cfg.checkpoint.dir):
            if nproc == 1:
                check_one_process(cfg)
            else:
                check_host_memory(nproc)  # first: a mistyped count must not wait for the data
            checked = check_inputs(cfg, nproc)
    from paraxis.train.resume import already_complete  # lazy: torch; CLI start-up imports this

    if done := already_complete(cfg):  # a requeued job that had finished: exit 0
        if os.environ.get("RANK", "0") == "0":
            print(f"paraxis: {done}", file=sys.stderr, flush=True)
        return 0
    if cfg.auto.enabled:  # --layout auto: the planner's pick replaces it (auto_layout.py)
        cfg = resolve(cfg, launched)
        code = start(cfg, train, debug)
        line = None if launched else measured_line(cfg)
        if line:
            print(f"paraxis: {line}", file=sys.stderr, flush=True)
        return code
    nproc = cfg.launch.nproc
    if launches(cfg) and not launched:  # cfg was completed and checked above, before torch
        if checked is None:  # --resume auto with a folder: its data checked now, not before
            check_host_memory(nproc)
            checked = check_inputs(cfg, nproc)  # the ranks would each say it, after starting
        train_cfg, data = cfg.train, checked
        if train_cfg.pack_documents:  # before any rank starts
            from paraxis.parallel.context.packing import (  # lazy: torch; CLI start-up imports this
                packing_id,
            )

            packing_id(data.end_of_document, data.name)
        check_cuda_ranks(nproc, train_cfg.device, train_cfg.share_gpu)
        warn_if_oversubscribed(nproc, train_cfg.device)
        from paraxis.train.claim import (  # lazy: torch; CLI start-up imports this
            claim_folder,  # the launcher holds --checkpoint-dir
        )

        with claim_folder(cfg, data) or contextlib.nullcontext():
            launch(train, (cfg,), nproc, host=cfg.launch.rdzv_host,
                   max_restarts=cfg.launch.max_restarts, debug=debug,
                   timeout_s=train_cfg.timeout_s, device=train_cfg.device,
                   checkpoint_dir=cfg.checkpoint.dir)
        return 0
    if not launched and checked is None:
        check_one_process(cfg)
    train(cfg)
    return 0


def check_inputs(cfg: RunConfig, world: int) -> Blend:
    """The run's model, its layout on `world` ranks, FP8's shapes and its data, checked
    without torch (one-line errors); returns the data."""
    train_cfg = cfg.train
    model_cfg = load_model_config(cfg.model.name)
    model_cfg.check_seq_len(train_cfg.seq_len)
    cfg.layout.validate(world, model_cfg, train_cfg.global_batch, train_cfg.seq_len)
    if get_policy(train_cfg.precision).fp8_recipe is not None and (
            problem := fp8_shape_problem(model_cfg, cfg.layout.tp, cfg.layout.etp,
                                         train_cfg.precision)):
        raise ParaxisError(problem)
    source = cfg.checkpoint.init_from
    if source and not Path(source).exists():  # before the model is built or ranks start
        raise ParaxisError(f"--init-from {source} does not exist; give a paraxis checkpoint "
                           "(a step-N directory or the directory that holds them) or a "
                           "Hugging Face model directory")
    data = load_run_data(cfg.data)
    data.check(model_cfg.vocab_size, train_cfg.seq_len, held_out=cfg.eval.every > 0)
    return data


def check_one_process(cfg: RunConfig) -> None:
    """A layout of several ranks asked of one process (no --nproc, no torchrun): one line."""
    lay, n = cfg.layout, cfg.layout.world_size
    if n == 1:
        return
    axes = ("dp", "cp", "tp", "pp") if lay.cp > 1 else ("dp", "tp", "pp")
    raise ParaxisError(f"{'*'.join(axes)} = {'*'.join(str(getattr(lay, a)) for a in axes)}"
                       f" = {n} ranks but this is one process; add --nproc {n} (or start "
                       f"it with torchrun --nproc-per-node {n})")
