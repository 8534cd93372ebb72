"""`paraxis train --layout auto`: price this machine, let the planner pick, run its pick.

    cfg = resolve(RunConfig.from_flags(model="tiny", nproc=4, layout="auto"))
    cfg.layout                  # the planner's Layout (plan.auto.choose), validated
    cfg.auto.predicted_step_s   # its predicted step time; every metrics record carries it

The prices come from the hardware this run runs on, found as `paraxis report` finds them
(`report.hardware.choose_hardware`): a --hardware file given; else on a CUDA machine its
GPU's preset; else a profile of this CPU: the committed docs/hardware-profile.json when it
was measured on this CPU model, else a short calibration (`calibrate.quick`, seconds) kept
in a cache folder for the next run of the same model, sequence length and rank count; the
cores our ranks get are probed again just before the pick (2 s), as other load comes and
goes. The first line of the defence says which. When the run writes metrics, the profile is copied
beside them, so `paraxis report --run` prices the run on the same profile.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from paraxis.files.model_file import load_model_config
from paraxis.files.run_records import load_metrics, steady, steady_records
from paraxis.plan import search_flags
from paraxis.plan.auto import choose
from paraxis.plan.cost import DEFAULT_OVERLAP
from paraxis.plan.experts import DEFAULT_IMBALANCE
from paraxis.plan.hardware import build_cluster
from paraxis.plan.inputs import PlanInputs
from paraxis.plan.search import Constraints, search
from paraxis.spec.errors import ParaxisError
from paraxis.spec.model_config import ModelConfig
from paraxis.spec.precision import get_policy
from paraxis.train.calibrate.measure import available_cores, cpu_cores
from paraxis.train.calibrate.quick import PROBE_S, PROFILE_NAME
from paraxis.train.config import RunConfig
from paraxis.train.run_hardware import choose_hardware
from paraxis.train.verify import ROUNDS, STEPS, table, verify

if TYPE_CHECKING:
    from paraxis.plan.auto import AutoChoice
    from paraxis.plan.cost import Overlap

CACHE_ENV = "PARAXIS_CACHE"  # where calibrations are kept (default ~/.cache/paraxis)
# `plan --verify`'s ranks a CPU core: 8 on a 2-core machine, the calibration's largest count;
# beyond that every layout's bursts would run for hours (and calibrate first)
VERIFY_RANKS_PER_CORE = 4
# the plan flags that describe a cluster's network, which a verify's ranks do not have
MACHINE_FLAGS = ("gpus_per_node", "nvlink_gbps", "network_gbps", "nics_per_node",
                 "collective_algorithm", "pipeline_zero2_reduce")


def cache_folder(model: ModelConfig, seq_len: int, ranks: int) -> Path:
    """The folder a calibration for this model (its name and what it holds: two model files
    called alike are two models), sequence length and rank count is kept in."""
    root = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "paraxis")
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", model.name)
    return root / "profiles" / f"{name}-{model.shape_key()}-seq{seq_len}-{ranks}ranks"


def plan_for(cfg: RunConfig, ranks: int, limits: Constraints | None = None,
             overlap: Overlap | None = None,
             expert_imbalance: float | None = None) -> tuple[AutoChoice, str, str | None]:
    """The planner's pick for `cfg` on `ranks` ranks of this machine, one phrase saying where
    its prices come from, and the hardware file it read (None: a GPU preset). `limits`,
    `overlap` and `expert_imbalance`: `plan --verify`'s search flags (None: the defaults)."""
    model_cfg = load_model_config(cfg.model.name)
    seq_len = cfg.train.seq_len
    model_cfg.check_seq_len(seq_len)
    memory_gb = cfg.auto.memory_gb
    if memory_gb is not None and not memory_gb > 0:
        raise ParaxisError(f"--memory-gb {memory_gb} must be a positive number of GB per rank")
    # --fused-loss: priced, and searched only where the runtime runs it
    constraints = limits or Constraints(fused_loss=cfg.train.fused_loss)
    # The layout rules need no prices: a rank count or batch no layout can run fails now,
    # not after a calibration (search raises before it prices anything)
    search(model_cfg, build_cluster("a100-80gb", ranks, ranks), seq_len,
           cfg.train.global_batch, constraints)
    if get_policy(cfg.train.precision).fp8_recipe is not None and not cfg.logging.hardware:
        import torch  # lazy: only to see what this machine runs on, as choose_hardware

        if not torch.cuda.is_available():  # refused now, not after calibrating this CPU
            raise ParaxisError(f"--layout auto prices --precision {cfg.train.precision} only "
                               "on GPUs with FP8 tensor cores; on this CPU (FP8 emulated) "
                               "give the layout (--dp/--tp/--pp), or --precision bf16")
    inputs = PlanInputs(model=cfg.model.name, gpus=ranks, gpus_per_node=ranks,
                        hardware=cfg.logging.hardware, memory_gb=memory_gb,
                        precision=cfg.train.precision, seq_len=seq_len,
                        global_batch=cfg.train.global_batch, fused_loss=cfg.train.fused_loss)
    hardware = choose_hardware(inputs, cache_folder(model_cfg, seq_len, ranks), ranks,
                               cfg.model.name)
    given = hardware.inputs
    cluster = given.cluster()
    source = hardware.source + (f" ({cfg.logging.hardware})" if cfg.logging.hardware else "")
    if hardware.cpu and not cfg.logging.hardware:
        # A profile's cores are those its calibration got; on a shared machine the load
        # changes from minute to minute, so the cores our ranks get are probed again now.
        cores = available_cores(cluster.cores_per_node, PROBE_S, ranks)
        cluster = cluster.replace(available_cores=cores)
        source += f"; our ranks get {cores:.2f} of its {cluster.cores_per_node} cores now"
    choice = choose(model_cfg, cluster, seq_len, cfg.train.global_batch,
                    given.precision_rule(), constraints, overlap or DEFAULT_OVERLAP,
                    expert_imbalance or DEFAULT_IMBALANCE)
    if memory_gb is not None:
        source += f", {memory_gb:g} GB per rank as given"
    return choice, source, given.hardware


def resolve(cfg: RunConfig, launched: bool = False) -> RunConfig:
    """`cfg` with the planner's layout in place of auto (module docstring); the defence is
    printed (rank 0 only under torchrun). Under torchrun every rank resolves alike, so a
    hardware file must be given: ranks must not each calibrate, and differently."""
    if not cfg.auto.enabled:
        return cfg
    if launched:
        if not cfg.logging.hardware:
            raise ParaxisError("--layout auto under torchrun needs --hardware (a `paraxis "
                               "calibrate` profile) so every rank prices alike; or start it "
                               "with paraxis train --nproc N")
        ranks = int(os.environ["WORLD_SIZE"])
    else:
        ranks = cfg.launch.nproc
    cfg.check()
    choice, source, profile = plan_for(cfg, ranks)
    if os.environ.get("RANK", "0") == "0":
        for line in choice.defence(source):
            print(f"paraxis: {line}", file=sys.stderr, flush=True)
    metrics = cfg.logging.metrics_file
    copy = Path(metrics).parent / PROFILE_NAME if metrics else None
    if copy and profile and not cfg.logging.hardware and not launched and \
            Path(profile).resolve() != copy.resolve():
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(profile, copy)
    auto = dataclasses.replace(cfg.auto, enabled=False,
                               predicted_step_s=choice.best.step_time_s)
    resolved = dataclasses.replace(cfg, layout=choice.layout, auto=auto)
    resolved.check()  # the chosen layout meets the run's rules before any rank builds it
    return resolved


def measured_line(cfg: RunConfig) -> str | None:
    """After an auto run that wrote metrics: predicted next to measured step time (median
    after the first steps), in one line; None without a metrics file or a prediction."""
    predicted, metrics = cfg.auto.predicted_step_s, cfg.logging.metrics_file
    if predicted is None or not metrics or not Path(metrics).is_file():
        return None
    try:
        records = load_metrics(metrics)
    except ParaxisError:  # no step written: nothing to compare
        return None
    measured, steps = steady(records, "step_time_s"), len(steady_records(records))
    return (f"step time of {cfg.layout}: predicted {predicted:.3g} s, measured {measured:.3g} s "
            f"(median of {steps} steps, as the report measures; the prediction "
            f"{predicted / measured - 1:+.0%} off)")


def verify_plan(args: argparse.Namespace) -> int:
    """`paraxis plan --verify K`: the planner's top K for --model on --gpus ranks of this
    machine (priced as --layout auto prices them), each trained for a short burst by
    `paraxis train`, interleaved (`train.verify`); prints the measured ranking next to the
    predicted one, with Spearman's rank correlation."""
    k, ranks = args.verify, args.gpus  # plan_cli.check_verify checked the --verify flags
    rounds = ROUNDS if args.verify_rounds is None else args.verify_rounds
    steps = STEPS if args.verify_steps is None else args.verify_steps
    if ranks is None or ranks < 1:
        raise ParaxisError("--verify trains each layout on this machine: give --gpus N, the "
                           "ranks to run them on")
    cores = cpu_cores()
    most = VERIFY_RANKS_PER_CORE * cores
    if ranks > most:
        raise ParaxisError(f"--gpus {ranks} is more ranks than --verify trains on this "
                           f"machine's {cores} CPU core(s) ({VERIFY_RANKS_PER_CORE} a core: "
                           f"each of the top {k} runs {rounds} time(s) on all of them); give "
                           f"--gpus {most} or fewer")
    if args.gpu or args.cluster_preset or args.params is not None:
        raise ParaxisError("--verify prices this machine, where the layouts run: leave out "
                           "--gpu, --cluster and --params (give --model, and --hardware for "
                           "a calibrated profile)")
    for flag in MACHINE_FLAGS:  # this machine's own network: nothing to override
        if getattr(args, flag) not in (None, False):
            raise ParaxisError(f"--{flag.replace('_', '-')} describes a cluster; --verify "
                               "prices this machine's ranks as measured: leave it out")
    if args.json:
        raise ParaxisError("--verify prints its measured table, not the plan's JSON: leave "
                           "--json out")
    model = args.model or args.default_model
    model_cfg = load_model_config(model)
    precision = get_policy(args.precision).name  # a preset's alias ("mixed") by its name
    cfg = RunConfig.from_flags(model=model, nproc=ranks, global_batch=args.global_batch,
                               seq_len=args.seq_len or model_cfg.max_seq_len,
                               precision=precision, hardware=args.hardware,
                               memory_gb=args.memory_gb, layout="auto",
                               fused_loss=bool(getattr(args, "fused_loss", False)))
    fixed, stated, micro_batch = search_flags.stated_fields(args, model_cfg)
    if search_flags.complete_layout(fixed, stated, micro_batch, cfg.train.global_batch):
        raise ParaxisError(f"--layout {args.layout} is one whole layout: --verify ranks the "
                           "planner's top K; leave out microbatches (and micro_batch) to "
                           "search the rest, or train it with paraxis train --layout")
    limits = search_flags.search_constraints(args, fixed, stated, micro_batch, model_cfg)
    overlap = search_flags.overlap_rules(args.no_overlap, args.exposed or ())
    choice, source, _ = plan_for(cfg, ranks, limits, overlap, args.expert_imbalance)
    candidates = choice.result.top(k)
    print(f"the planner's top {len(candidates)} of {choice.cfg.name} on {ranks} ranks, global "
          f"batch {cfg.train.global_batch} x {cfg.train.seq_len} tokens, priced on {source}; "
          f"training each for {steps} steps, {rounds} round(s):",
          flush=True)
    train_args = ["--model", model, "--nproc", str(ranks), "--global-batch",
                  str(cfg.train.global_batch), "--seq-len", str(cfg.train.seq_len),
                  "--precision", precision, *(["--fused-loss"] if cfg.train.fused_loss else [])]
    with tempfile.TemporaryDirectory(prefix="paraxis-verify-") as folder:
        rows = verify(candidates, train_args, Path(folder), rounds, steps,
                      log=lambda line: print(line, flush=True))
    for line in table(rows):
        print(line)
    return 0
