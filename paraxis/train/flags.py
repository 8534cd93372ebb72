"""`paraxis train`'s flags: one per RunConfig field, read over the run file.

Every field of `paraxis.train.config.RunConfig` is a flag (`--lr`, `--checkpoint-dir`, `--dp`, ...),
grouped by its TOML section. A flag's default is "not given" (argparse.SUPPRESS), so the
config is built in three layers and a flag always wins, whatever its value:

    defaults  <-  the --config run file  <-  every flag given on the command line
"""

from __future__ import annotations

import argparse
import dataclasses

from paraxis.spec.errors import ParaxisError
from paraxis.spec.precision import PRESETS as PRECISION_PRESETS
from paraxis.train.config import (
    FLAGS,
    RunConfig,
    field_type,
    flag_key,
    flag_names,
    meta,
    sections,
)
from paraxis.train.run_file import read_run_file_named


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
    # --dtype, as other trainers name the compute dtype: answered with --precision's presets
    parser.add_argument("--dtype", dest="dtype_flag", default=argparse.SUPPRESS,
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
    if hasattr(args, "dtype_flag"):
        same = ("bf16 (bf16 weights over fp32 masters), or autocast-bf16 (bf16 compute over "
                "fp32 state)" if args.dtype_flag == "bf16" else args.dtype_flag)
        raise ParaxisError(f"paraxis sets the dtypes with --precision, not --dtype "
                           f"({', '.join(PRECISION_PRESETS)}; docs/precision.md): use "
                           f"--precision {same}")
    given = {key: value for key, value in vars(args).items()
             if key in FLAGS or key in ("layout", "grad_accum")}
    config = getattr(args, "config", None)
    if not config:
        cfg = RunConfig().with_flags(**given)  # checked where the run starts
    else:
        base, names = read_run_file_named(config)
        cfg = base.with_flags(**given)
        cfg.check(names.overridden(given))  # now, while it knows which values the file set
    _check_degrees_given(cfg, given)
    return cfg


def _check_degrees_given(cfg: RunConfig, given: dict[str, object]) -> None:
    """`--nproc N` alone runs N-way data parallelism; with degrees given on the command line
    whose product is 1 (--dp 1, --layout dp=1,tp=1) the ranks would become dp=N unsaid."""
    nproc = cfg.launch.nproc
    if nproc > 1 and cfg.layout.world_size == 1 and not cfg.auto.enabled and \
            any(key in given for key in ("dp", "tp", "pp", "cp", "layout")):
        raise ParaxisError(f"--nproc {nproc} starts {nproc} ranks, and the degrees given "
                           f"({cfg.layout}) use 1; give degrees whose product is {nproc} "
                           f"(e.g. --dp {nproc}), or leave them out for dp={nproc}")
