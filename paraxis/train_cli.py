"""`paraxis train`'s command line: flags from RunConfig, the run file, where ranks come from.

Every field of `paraxis.config.RunConfig` is a flag (`--lr`, `--checkpoint-dir`, `--dp`, ...),
grouped by its TOML section. A flag's default is "not given" (argparse.SUPPRESS), so the
config is built in three layers and a flag always wins, whatever its value:

    defaults  <-  the --config run file  <-  every flag given on the command line

Then `start` decides where the ranks come from: this process alone, N processes it launches
itself (`--nproc N`, `runtime/launch.py`), or one rank of a job torchrun started.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
from collections.abc import Callable

from paraxis.config import (
    FLAGS,
    RunConfig,
    field_type,
    flag_key,
    flag_names,
    meta,
    sections,
)
from paraxis.errors import ParaxisError
from paraxis.run_file import read_run_file


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per RunConfig field, grouped by section, plus --config, --layout and
    --grad-accum."""
    parser.add_argument("--config", default=None,
                        help="TOML run file (examples/); flags given override it")
    for section, cls in sections().items():
        group = parser.add_argument_group(f"[{section}]")
        if section == "layout":
            group.add_argument("--layout", default=argparse.SUPPRESS,
                               help="e.g. dp=2,tp=2,pp=2,zero=1 (the flags below override it), or "
                                    "auto: the planner picks it on this machine's profile")
            group.add_argument("--grad-accum", type=int, default=argparse.SUPPRESS,
                               help="gradient accumulation microsteps (= --microbatches when "
                                    "pp=1)")
        for f in dataclasses.fields(cls):
            _add_flag(group, section, cls, f)
    # --dtype (autocast over fp32 state) became the precision policy: say so in one line
    parser.add_argument("--dtype", dest="removed_dtype", default=argparse.SUPPRESS,
                        help=argparse.SUPPRESS)


def _add_flag(group: argparse._ArgumentGroup, section: str, cls: type,
              f: dataclasses.Field) -> None:
    names = flag_names(section, f)
    kind = field_type(cls, f.name)
    help_text = meta(section, f, "help") or ""
    if f.default is not None and f.default is not False and f.default is not dataclasses.MISSING:
        help_text = f"{help_text} (default: {f.default})".lstrip()
    # argparse %-formats help strings ("the last 5% of ..." would break --help)
    options = {"dest": flag_key(section, f), "default": argparse.SUPPRESS,
               "help": help_text.replace("%", "%%")}
    if kind is bool:  # --quiet / --no-quiet: a run file's `true` can be turned off too
        group.add_argument(*names, action=argparse.BooleanOptionalAction, **options)
        return
    group.add_argument(*names, type=kind, choices=meta(section, f, "choices"), **options)


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """Defaults, then the --config run file, then every flag given on the command line."""
    if hasattr(args, "removed_dtype"):
        raise ParaxisError(f"--dtype is now --precision (fp32, bf16, bf16-fp32grad, fp16; "
                           f"docs/precision.md): use --precision {args.removed_dtype}")
    config = getattr(args, "config", None)
    base = read_run_file(config) if config else RunConfig()
    given = {key: value for key, value in vars(args).items()
             if key in FLAGS or key in ("layout", "grad_accum")}
    return base.with_flags(**given)


def start(cfg: RunConfig, train: Callable[[RunConfig], object], debug: bool = False) -> int:
    """Run `train(cfg)` here, on `--nproc` ranks launched from here, or as one rank of a
    torchrun job. Bad input fails here in one line, not in N tracebacks."""
    launched = "WORLD_SIZE" in os.environ  # torchrun (or a launcher) started this rank
    from paraxis.runtime.resume import already_complete

    if done := already_complete(cfg):  # a requeued job that had finished: exit 0
        if os.environ.get("RANK", "0") == "0":
            print(f"paraxis: {done}", file=sys.stderr, flush=True)
        return 0
    if cfg.auto.enabled:  # --layout auto: the planner's pick replaces it (auto_layout.py)
        from paraxis.auto_layout import measured_line, resolve

        cfg = resolve(cfg, launched)
        code = start(cfg, train, debug)
        line = None if launched else measured_line(cfg)
        if line:
            print(f"paraxis: {line}", file=sys.stderr, flush=True)
        return code
    nproc = cfg.launch.nproc
    if nproc > 1 and not launched:
        from paraxis.data_blend import load_run_data
        from paraxis.model_config import load_model_config
        from paraxis.runtime.launch import launch, warn_if_oversubscribed

        if cfg.layout.world_size == 1:  # --nproc N alone means N-way data parallelism
            cfg = dataclasses.replace(cfg, layout=cfg.layout.replace(dp=nproc))
        cfg.check()
        train_cfg = cfg.train
        model_cfg = load_model_config(cfg.model.name)
        cfg.layout.validate(nproc, model_cfg, train_cfg.global_batch, train_cfg.seq_len)
        data = load_run_data(cfg.data)
        data.check(model_cfg.vocab_size, train_cfg.seq_len, held_out=cfg.eval.every > 0)
        if train_cfg.pack_documents:  # before any rank starts
            from paraxis.packing import packing_id

            packing_id(data.end_of_document, data.name)
        warn_if_oversubscribed(nproc, train_cfg.device)
        from paraxis.runtime.claim import claim_folder  # the launcher holds --checkpoint-dir

        with claim_folder(cfg, data) or contextlib.nullcontext():
            launch(train, (cfg,), nproc, host=cfg.launch.rdzv_host,
                   max_restarts=cfg.launch.max_restarts, debug=debug,
                   timeout_s=train_cfg.timeout_s, device=train_cfg.device)
        return 0
    if not launched and cfg.layout.world_size > 1:
        lay, n = cfg.layout, cfg.layout.world_size
        axes = ("dp", "cp", "tp", "pp") if lay.cp > 1 else ("dp", "tp", "pp")
        raise ParaxisError(f"{'*'.join(axes)} = {'*'.join(str(getattr(lay, a)) for a in axes)}"
                           f" = {n} ranks but this is one process; add --nproc {n} (or start "
                           f"it with torchrun --nproc-per-node {n})")
    train(cfg)
    return 0
