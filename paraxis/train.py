"""The training loop: one readable loop for every layout.

    paraxis train --model tiny --steps 50                 # one process
    torchrun --nproc-per-node 4 -m paraxis.train ...      # the same loop on 4 ranks

The loop asks the runtime (an engine built from the Layout) for forward/backward, gradient
clipping and the optimizer step; everything else here (data, learning rate, metrics) is the
same on one device and on many.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from paraxis.errors import ParaxisError
from paraxis.layout import Layout
from paraxis.runtime.nan_policy import POLICIES

FP32_MAX = 3.4028234663852886e38


@dataclass
class TrainConfig:
    model: str = "tiny"
    data: str = "embedded"
    data_dtype: str = "uint16"
    tokenizer: str | None = None  # a Hugging Face tokenizer.json for text data (else bytes)
    steps: int = 100
    global_batch: int = 16
    seq_len: int = 128
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 10
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    device: str = "auto"
    dtype: str = "fp32"
    layout: Layout = field(default_factory=Layout)
    metrics_file: str | None = None
    log_every: int = 10
    quiet: bool = False
    nproc: int = 1  # ranks `paraxis train` launches itself (data_parallel/launch.py)
    bucket_mb: float = 25.0  # data-parallel gradient bucket size
    checkpoint_dir: str | None = None  # where step-N/ checkpoints go
    checkpoint_every: int = 0  # steps between saves (0: only at the end)
    keep: int = 3  # complete checkpoints kept (0: all)
    resume: str | None = None  # a checkpoint, a directory of them, or "auto"
    max_restarts: int = 0  # restart every rank this often when one dies (with --nproc)
    init_from: str | None = None  # weights only (paraxis checkpoint or HF dir), step 0
    exit_after: int | None = None  # stop (and save) after this step, schedule unchanged
    eval_every: int = 0  # steps between held-out loss evaluations (0: never)
    eval_batches: int = 4  # held-out batches per evaluation
    tensorboard: str | None = None  # also write TensorBoard event files here
    peak_tflops: float | None = None  # one device's peak, for MFU (else preset / hardware)
    hardware: str | None = None  # a hardware file (`paraxis calibrate`) giving that peak
    timeout_s: float = 600.0  # longest wait for any collective or message before giving up
    on_nan: str = "stop"  # a NaN/inf loss or gradient: "stop" the run or "skip" the step

    def check(self) -> None:
        if self.steps < 1:
            raise ParaxisError(f"--steps {self.steps} must be at least 1")
        if self.seq_len < 1:
            raise ParaxisError(f"--seq-len {self.seq_len} must be at least 1")
        if not self.lr > 0 or not math.isfinite(self.lr):
            raise ParaxisError(f"--lr {self.lr} must be a positive number")
        if self.lr > FP32_MAX / 10:  # AdamW's first step is lr / (1 - beta1) (Kingma & Ba, alg. 1)
            raise ParaxisError(f"--lr {self.lr:g} overflows fp32 in AdamW's first update; "
                               "typical values are 1e-4 to 1e-2")
        if self.grad_clip < 0:
            raise ParaxisError(f"--grad-clip {self.grad_clip} must be >= 0 (0 turns it off)")
        if self.warmup_steps < 0:
            raise ParaxisError(f"--warmup {self.warmup_steps} must be >= 0")
        if self.checkpoint_every < 0 or self.keep < 0:
            raise ParaxisError("--checkpoint-every and --keep must be >= 0")
        if self.eval_every < 0 or self.eval_batches < 1:
            raise ParaxisError("--eval-every must be >= 0 and --eval-batches >= 1")
        if self.exit_after is not None and self.exit_after < 1:
            raise ParaxisError(f"--exit-after {self.exit_after} must be at least 1")
        if self.max_restarts < 0:
            raise ParaxisError(f"--max-restarts {self.max_restarts} must be >= 0")
        if self.max_restarts and not self.checkpoint_dir:
            raise ParaxisError("--max-restarts needs --checkpoint-dir: a restart resumes from "
                               "the newest checkpoint there")
        if self.resume and self.init_from:
            raise ParaxisError("give --resume (continue a run) or --init-from (start from its "
                               "weights), not both")
        if self.resume == "auto" and not self.checkpoint_dir:
            raise ParaxisError("--resume auto needs --checkpoint-dir (where to look)")
        if self.dtype not in ("fp32", "bf16", "fp16"):
            raise ParaxisError(f"--dtype {self.dtype} is unknown; use fp32, bf16 or fp16")
        for name, flag, low in (("global_batch", "--global-batch", 1), ("log_every",
                                "--log-every", 1), ("nproc", "--nproc", 1)):
            if getattr(self, name) < low:
                raise ParaxisError(f"{flag} {getattr(self, name)} must be at least {low}")
        if not self.weight_decay >= 0:
            raise ParaxisError(f"--weight-decay {self.weight_decay} must be >= 0 (0 turns it off)")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ParaxisError(f"min_lr_ratio {self.min_lr_ratio} must be between 0 and 1 (the "
                               "final learning rate as a fraction of --lr)")
        if not self.bucket_mb > 0:
            raise ParaxisError(f"--bucket-mb {self.bucket_mb} must be positive (DDP uses 25)")
        if not 0 < self.timeout_s < math.inf:
            raise ParaxisError(f"--timeout-s {self.timeout_s} must be a positive number of "
                               "seconds")
        if self.on_nan not in POLICIES:
            raise ParaxisError(f"--on-nan {self.on_nan} is unknown; use "
                               f"{' or '.join(POLICIES)}")
        if self.metrics_file:
            check_writable(Path(self.metrics_file), "--metrics-file")


def check_writable(path: Path, flag: str) -> None:
    """Fail before training (and before creating anything) if `path` cannot be written."""
    if path.is_dir():
        raise ParaxisError(f"{flag} {path} is a folder; give a file name inside it")
    folder = path.parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise ParaxisError(f"{flag} {path} cannot be written ({folder} is not a writable "
                           "folder); choose another path")


def learning_rate(step: int, cfg: TrainConfig) -> float:
    """Linear warmup, then cosine decay to min_lr_ratio * lr (GPT-3 paper, appendix B)."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + 0.5 * (cfg.lr - floor) * (1 + math.cos(math.pi * progress))


def run_training(cfg: TrainConfig) -> list[dict]:
    """Train; return the per-step metrics (the same records the metrics file gets)."""
    import torch

    from paraxis.data import TokenData
    from paraxis.model_config import load_model_config
    from paraxis.runtime.distributed import (
        build_groups,
        init_distributed,
        pick_device,
        shutdown_distributed,
    )
    from paraxis.runtime.heartbeat import start_heartbeat
    from paraxis.runtime.nan_policy import NumericalFault
    from paraxis.runtime.parallelize import build_engine

    cfg.check()
    model_cfg = load_model_config(cfg.model)
    if cfg.seq_len > model_cfg.max_seq_len:
        raise ParaxisError(f"--seq-len {cfg.seq_len} is over the model's context of "
                           f"{model_cfg.max_seq_len}; use --seq-len {model_cfg.max_seq_len} "
                           "or less")
    import torch.distributed as dist

    device = pick_device(cfg.device)
    joined = dist.is_initialized()  # a caller's process group (tests) stays theirs to close
    rank, world = init_distributed(device, cfg.timeout_s)
    clean = False  # whether every rank can still meet at the shutdown barrier
    try:
        layout = cfg.layout.validate(world, model_cfg, cfg.global_batch, cfg.seq_len)
        data = TokenData.load(cfg.data, cfg.data_dtype, cfg.tokenizer)
        data.check(model_cfg.vocab_size, cfg.seq_len)
        groups = build_groups(layout)
        torch.manual_seed(cfg.seed)
        engine = build_engine(model_cfg, layout, groups, device, seed=cfg.seed,
                              dtype=cfg.dtype, weight_decay=cfg.weight_decay,
                              bucket_mb=cfg.bucket_mb, seq_len=cfg.seq_len,
                              announce=groups.rank == 0 and not cfg.quiet)
        if not cfg.quiet:
            states = ", ".join(f"{k} {v:,} B" for k, v in engine.memory_report().items())
            print(f"rank {rank} model states: {states}", file=sys.stderr, flush=True)
        if cfg.metrics_file and rank == 0:
            Path(cfg.metrics_file).parent.mkdir(parents=True, exist_ok=True)
        heartbeat = start_heartbeat(rank, world, cfg.timeout_s)
        try:
            start_step = _resume(cfg, engine, model_cfg, rank)
            records = _loop(cfg, engine, data, groups, device, rank, model_cfg, start_step)
        finally:
            if heartbeat is not None:
                heartbeat.stop()
        clean = True
        return records
    except NumericalFault:
        clean = True  # every rank stops at the same step (nan_policy.py)
        raise
    finally:
        # After any other failure some rank may be gone or stuck: a barrier would only wait
        # out the timeout, so the process just exits.
        if not joined:
            shutdown_distributed(clean)


def _resume(cfg, engine, model_cfg, rank: int) -> int:  # noqa: ANN001
    """Load the checkpoint `--resume` names, if any; return the step to continue from."""
    from paraxis.checkpoint import complete_checkpoints, load_checkpoint, resolve
    from paraxis.runtime.distributed import restart_attempt

    restarted = restart_attempt() > 0
    saved = complete_checkpoints(Path(cfg.checkpoint_dir)) if cfg.checkpoint_dir else []
    if restarted and saved:
        path = saved[-1][1]  # the progress made since the job started
    elif cfg.init_from:
        _init_from(cfg.init_from, engine, model_cfg, rank)
        return 0
    elif not cfg.resume:
        return 0
    elif cfg.resume == "auto":
        if not saved:
            return 0  # nothing saved yet: a fresh start
        path = saved[-1][1]
    else:
        path = resolve(cfg.resume)
    manifest = load_checkpoint(engine, path, model_cfg.to_dict(), rank)
    step = int(manifest["step"])
    if step >= cfg.steps:
        raise ParaxisError(f"checkpoint {path} is at step {step}, not before --steps "
                           f"{cfg.steps}; raise --steps to train further")
    if rank == 0 and not cfg.quiet:
        print(f"resumed from {path} (step {step}, saved by layout {manifest['layout']})",
              file=sys.stderr, flush=True)
    return step


def _init_from(path: str, engine, model_cfg, rank: int) -> None:  # noqa: ANN001
    """Start from another run's weights (a paraxis checkpoint or a Hugging Face directory),
    cut for this layout; the optimizer and the schedule start fresh."""
    from paraxis.checkpoint import load_checkpoint, resolve
    from paraxis.checkpoint.load import fill_entries
    from paraxis.checkpoint.manifest import check_model

    if (Path(path) / "config.json").is_file():
        from paraxis.hf import read_hf

        hf_cfg, state = read_hf(path)
        check_model({"model": hf_cfg.to_dict()}, model_cfg.to_dict(), Path(path))
        fill_entries(engine, lambda kind, name: state[name], ("param",), path)
    else:
        load_checkpoint(engine, resolve(path), model_cfg.to_dict(), rank, weights_only=True)


def _save(cfg, engine, model_cfg, step: int) -> None:  # noqa: ANN001
    from paraxis.checkpoint import save_checkpoint
    from paraxis.config import to_toml

    data = {"seed": cfg.seed, "next_step": step, "samples_seen": step * cfg.global_batch,
            "global_batch": cfg.global_batch, "seq_len": cfg.seq_len}
    save_checkpoint(engine, cfg.checkpoint_dir, step, model_cfg.to_dict(),
                    config_toml=to_toml(cfg), keep=cfg.keep, extra={"data": data})


def _loop(cfg, engine, data, groups, device, rank, model_cfg,  # noqa: ANN001
          start_step: int = 0) -> list[dict]:
    from paraxis.metrics import MetricsSink, device_peak_flops, max_over_ranks, peak_memory_bytes
    from paraxis.plan.compute import mfu
    from paraxis.progress import Progress
    from paraxis.runtime import faults
    from paraxis.runtime.nan_policy import NumericalFault, nonfinite, skip_message, stop_message
    from paraxis.runtime.watchdog import WATCH

    fault = faults.from_env()  # None unless a reliability test breaks the run on purpose
    layout = groups.layout
    tokens_per_step = cfg.global_batch * cfg.seq_len
    peak_flops = device_peak_flops(device, cfg.peak_tflops, cfg.hardware)
    records: list[dict] = []
    # A resumed run appends to the metrics of the run it continues.
    sink = MetricsSink(cfg.metrics_file, cfg.tensorboard, append=start_step > 0) \
        if rank == 0 else None
    show = rank == 0 and not cfg.quiet
    if show:
        from paraxis.config import to_toml

        progress_console_print(f"resolved config:\n{to_toml(cfg)}")
    with Progress(cfg.steps, enabled=show, title=f"{model_cfg.name} {layout}") as progress:
        for step in range(start_step, cfg.steps):
            started = time.perf_counter()
            WATCH.begin_step(step)
            if fault is not None:
                fault.before_step(step, rank, engine.model)
            x, y = _dp_share(data.batch(step, cfg.global_batch, cfg.seq_len, cfg.seed), cfg,
                             groups, device)
            lr = learning_rate(step, cfg)
            loss = engine.forward_backward(x, y)
            grad_norm = engine.clip_grad_norm(cfg.grad_clip)
            # The NaN policy (runtime/nan_policy.py): every rank reaches the same verdict, and
            # a non-finite step never reaches the weights.
            problem = nonfinite(loss, grad_norm, engine.skipped_overflow())
            if problem and cfg.on_nan == "stop":
                raise NumericalFault(stop_message(step, problem))
            if problem is None:
                engine.optimizer_step(lr)
            elif rank == 0:
                print(skip_message(step, problem), file=sys.stderr, flush=True)
            engine.zero_grad()
            # From here on the weights hold good steps only: the place to save a checkpoint.
            step_time = time.perf_counter() - started
            tokens_per_s = tokens_per_step / step_time
            record = {"step": step, "loss": loss, "lr": lr, "grad_norm": grad_norm,
                      "tokens_per_s": tokens_per_s, "step_time_s": step_time,
                      "mfu": None if peak_flops is None else mfu(
                          model_cfg, cfg.seq_len, tokens_per_s, layout.world_size, peak_flops),
                      "peak_mem_bytes": peak_memory_bytes(device)}
            done = step + 1
            logging = step % cfg.log_every == 0 or done == cfg.steps
            if logging:
                record["peak_mem_bytes_max_rank"] = max_over_ranks(record["peak_mem_bytes"])
            if cfg.eval_every and (done % cfg.eval_every == 0 or done == cfg.steps):
                record["val_loss"] = _evaluate(cfg, engine, data, groups, device)
            if problem:
                record["skipped"] = problem
            records.append(record)
            if sink:
                sink.write(record)
            progress.update(step, record, log=logging)
            stopping = done == cfg.exit_after
            if cfg.checkpoint_dir and (done == cfg.steps or stopping or (
                    cfg.checkpoint_every and done % cfg.checkpoint_every == 0)):
                _save(cfg, engine, model_cfg, done)
            if stopping:
                break
    if sink:
        sink.close()
    if cfg.metrics_file:
        _save_trace(engine, Path(cfg.metrics_file).parent / "trace.json", rank)
    return records


def _dp_share(batch, cfg, groups, device):  # noqa: ANN001, ANN202
    """This dp rank's rows of a global batch (every rank draws the same global batch)."""
    import torch

    per_dp = cfg.global_batch // groups.layout.dp
    rows = slice(groups.dp_rank * per_dp, (groups.dp_rank + 1) * per_dp)
    return tuple(torch.from_numpy(part[rows]).to(device) for part in batch)


def _evaluate(cfg, engine, data, groups, device) -> float:  # noqa: ANN001
    """Mean loss over the same `eval_batches` held-out batches every time (comparable
    across steps, runs and layouts)."""
    total = 0.0
    for index in range(cfg.eval_batches):
        batch = data.batch(index, cfg.global_batch, cfg.seq_len, cfg.seed, split="val")
        total += engine.evaluate(*_dp_share(batch, cfg, groups, device))
    return total / cfg.eval_batches


def _save_trace(engine, path: Path, rank: int) -> None:  # noqa: ANN001
    """The last step's per-rank pipeline actions as one Chrome/Perfetto trace (rank 0
    writes it), for the report's measured timeline. Only pipeline engines record actions."""
    import torch.distributed as dist

    from paraxis.runtime.watchdog import WATCH

    events = engine.trace_events()
    if engine.layout.pp == 1:
        return
    if dist.is_initialized():
        gathered: list = [None] * dist.get_world_size() if rank == 0 else None
        with WATCH.waiting("gather_object"):
            dist.gather_object(events, gathered, dst=0)
        events = [e for part in (gathered or []) for e in part]
    if rank == 0:
        from paraxis.viz.trace import write_chrome_trace

        write_chrome_trace(events, path)


def progress_console_print(text: str) -> None:
    from rich.console import Console

    Console(stderr=True, highlight=False).print(text, markup=False)


# ----------------------------------------------------------------------- command line


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    d = TrainConfig()
    add = parser.add_argument
    add("--config", default=None, help="TOML run file (examples/); flags given override it")
    add("--model", default=d.model, help="preset name or .json/.toml model file")
    add("--data", default=d.data, help="'embedded', a .bin token file, a text file or folder")
    add("--data-dtype", default=d.data_dtype, help="token dtype of a .bin file")
    add("--tokenizer", default=None,
        help="Hugging Face tokenizer.json for text data (default: byte-level)")
    add("--steps", type=int, default=d.steps)
    add("--global-batch", type=int, default=d.global_batch, help="sequences per step")
    add("--seq-len", type=int, default=d.seq_len)
    add("--lr", type=float, default=d.lr, help="peak learning rate")
    add("--warmup", type=int, default=d.warmup_steps, dest="warmup_steps")
    add("--weight-decay", type=float, default=d.weight_decay)
    add("--grad-clip", type=float, default=d.grad_clip, help="max global grad norm (0: off)")
    add("--grad-accum", type=int, default=None,
        help="gradient accumulation microsteps (= --microbatches when pp=1)")
    add("--seed", type=int, default=d.seed)
    add("--device", default=d.device, help="auto, cpu or cuda")
    add("--dtype", default=d.dtype, help="fp32, bf16 or fp16 (compute precision)")
    add("--metrics-file", default=None, help="write one JSON line per step")
    add("--log-every", type=int, default=d.log_every)
    add("--quiet", action="store_true", help="no progress display")
    add("--nproc", type=int, default=d.nproc,
        help="launch this many ranks here; under torchrun leave it out")
    add("--rdzv-host", default="127.0.0.1",
        help="address the --nproc launcher's store listens on (default: loopback only)")
    add("--bucket-mb", type=float, default=d.bucket_mb, help="DP gradient bucket size (MiB)")
    add("--checkpoint-dir", default=None, help="save sharded checkpoints here (step-N/)")
    add("--checkpoint-every", type=int, default=d.checkpoint_every,
        help="steps between checkpoints (0: only at the end)")
    add("--keep", type=int, default=d.keep, help="complete checkpoints kept (0: all)")
    add("--eval-every", type=int, default=d.eval_every,
        help="steps between held-out loss evaluations (0: never)")
    add("--eval-batches", type=int, default=d.eval_batches, help="held-out batches per eval")
    add("--tensorboard", default=None, help="also write TensorBoard event files to this dir")
    add("--peak-tflops", type=float, default=None,
        help="one device's peak TFLOP/s for MFU (default: the GPU preset, or --hardware)")
    add("--hardware", default=None, help="hardware file (paraxis calibrate) giving the peak")
    add("--max-restarts", type=int, default=0,
        help="when a rank dies, restart all ranks from the newest checkpoint, this many times "
             "(with --nproc; under torchrun give torchrun's own --max-restarts)")
    add("--init-from", default=None,
        help="start from these weights (a paraxis checkpoint or a Hugging Face directory); "
             "optimizer and schedule start fresh")
    add("--exit-after", type=int, default=None,
        help="stop after this step with a checkpoint (a job's time slot); the learning-rate "
             "schedule still spans --steps")
    add("--resume", default=None,
        help="checkpoint dir (or a dir of them: the latest) to continue from; 'auto': the "
             "latest in --checkpoint-dir if there is one")
    add("--timeout-s", type=float, default=d.timeout_s,
        help="seconds any collective or message may wait before the run stops, naming it")
    add("--on-nan", default=d.on_nan, choices=POLICIES,
        help="a NaN/inf loss or gradient stops the run (default) or skips that step")
    add_layout_arguments(parser)


def add_layout_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--layout", default=None, help="e.g. dp=2,tp=2,pp=2,zero=1 (flags below override)")
    add("--dp", type=int, default=None)
    add("--tp", type=int, default=None)
    add("--pp", type=int, default=None)
    add("--zero", type=int, default=None, choices=(0, 1, 2, 3))
    add("--microbatches", type=int, default=None)
    add("--schedule", default=None, help="gpipe, 1f1b or interleaved")
    # --virtual-stages: torchrun rejects "--virtual" as an abbreviation of its own flag
    add("--virtual", "--virtual-stages", type=int, default=None, dest="virtual_stages",
        help="model chunks per pipeline stage (interleaved schedule)")
    add("--recompute", default=None, help="none, selective or full")
    add("--sequence-parallel", action="store_true", default=None)


def layout_from_args(args: argparse.Namespace, base: Layout | None = None) -> Layout:
    """--layout string (else `base`), then the single-axis flags on top."""
    base = Layout.parse(args.layout) if getattr(args, "layout", None) else (base or Layout())
    changes = {name: getattr(args, name) for name in
               ("dp", "tp", "pp", "zero", "microbatches", "schedule", "virtual_stages",
                "recompute", "sequence_parallel") if getattr(args, name, None) is not None}
    if getattr(args, "grad_accum", None) is not None:
        if args.grad_accum < 1:
            raise ParaxisError(f"--grad-accum {args.grad_accum} must be at least 1")
        changes["microbatches"] = args.grad_accum
    return base.replace(**changes)


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """Defaults, then the --config TOML file, then every flag given on the command line."""
    from paraxis.config import read_run_file

    from_file = read_run_file(args.config) if getattr(args, "config", None) else {}
    defaults = argparse.ArgumentParser()
    add_train_arguments(defaults)
    fields = {f.name for f in dataclasses.fields(TrainConfig)} - {"layout"}
    values = {name: value for name, value in from_file.items() if name != "layout"}
    for name in fields:
        if hasattr(args, name) and (name not in values
                                    or getattr(args, name) != defaults.get_default(name)):
            values[name] = getattr(args, name)
    return TrainConfig(layout=layout_from_args(args, from_file.get("layout")), **values)


add_arguments = add_train_arguments  # the `paraxis train` subcommand


def main(argv: list[str] | None = None) -> int:
    """`python -m paraxis.train` (what torchrun runs on every rank)."""
    from paraxis.cli import OneLineParser, run_guarded

    parser = OneLineParser(prog="paraxis.train", description=__doc__.splitlines()[0])
    add_train_arguments(parser)
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    args = parser.parse_args(argv)
    return run_guarded(lambda: run(args), debug=args.debug)


def run(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    launched = "WORLD_SIZE" in os.environ  # torchrun (or a launcher) started this rank
    if cfg.nproc > 1 and not launched:
        from paraxis.data import TokenData
        from paraxis.data_parallel.launch import launch, warn_if_oversubscribed
        from paraxis.model_config import load_model_config

        if cfg.layout.world_size == 1:  # --nproc N alone means N-way data parallelism
            cfg.layout = cfg.layout.replace(dp=cfg.nproc)
        # Bad input fails here, in one line, not in N tracebacks.
        cfg.check()
        model_cfg = load_model_config(cfg.model)
        cfg.layout.validate(cfg.nproc, model_cfg, cfg.global_batch, cfg.seq_len)
        TokenData.load(cfg.data, cfg.data_dtype, cfg.tokenizer).check(model_cfg.vocab_size,
                                                                      cfg.seq_len)
        warn_if_oversubscribed(cfg.nproc, cfg.device)
        launch(cfg, cfg.nproc, host=args.rdzv_host,
               debug=getattr(args, "debug", False), max_restarts=cfg.max_restarts)
        return 0
    if not launched and cfg.layout.world_size > 1:
        lay, n = cfg.layout, cfg.layout.world_size
        raise ParaxisError(f"dp*tp*pp = {lay.dp}*{lay.tp}*{lay.pp} = {n} ranks but this is one "
                           f"process; add --nproc {n} (or start it with torchrun "
                           f"--nproc-per-node {n})")
    run_training(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
