"""The training loop: one readable loop for every layout.

    paraxis train --model tiny --steps 50                 # one process
    torchrun --nproc-per-node 4 -m paraxis.train ...      # the same loop on 4 ranks

The loop asks the runtime (an engine built from the Layout) for forward/backward, gradient
clipping and the optimizer step; everything else here (data, learning rate, metrics) is the
same on one device and on many. The config and its flags live in `paraxis.train.config` and
`paraxis.train.flags`; where a run's state comes from, in `paraxis.train.resume`.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from paraxis.data.blend import Blend, load_run_data
from paraxis.data.loader import Loader, Share, read_share
from paraxis.dist.preemption import Preempted, StopRequest
from paraxis.files.checkpoint_manifest import step_dir_name
from paraxis.files.host_steal import cpu_ticks, stolen_share
from paraxis.files.model_file import load_model_config
from paraxis.files.run_records import beside
from paraxis.files.trace import write_chrome_trace
from paraxis.plan.compute import mfu
from paraxis.plan.experts import experts_over_tp, feed_forward
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import Layout
from paraxis.spec.precision import get_policy
from paraxis.spec.runtime_options import RuntimeOptions
from paraxis.spec.units import MIB
from paraxis.train.config import RunConfig
from paraxis.train.lr_schedule import learning_rate
from paraxis.train.nan_policy import (
    NumericalFault,
    nonfinite,
    overflow_message,
    skip_message,
    stop_message,
)
from paraxis.train.run_checks import check_states_fit

if TYPE_CHECKING:
    import numpy as np
    import torch

    from paraxis.data.corpus import TokenData
    from paraxis.dist.groups import ParallelGroups
    from paraxis.engine.contract import Engine
    from paraxis.spec.model_config import ModelConfig
    from paraxis.train.claim import Claim

# torch, and every module that imports it, is imported inside the functions: `paraxis
# train`'s command imports this module at CLI start-up, which must not wait for torch.

__all__ = ["RUN_IMPORTS", "run_training"]

# What `run_training` imports as it runs, through these modules' own imports. A process that
# forks ranks imports them first, so that no rank does it again (about half a second of CPU
# each, every launch): the rank server preloads them (`rank_server.start_rank_server`).
RUN_IMPORTS = ("paraxis.parallelize", "paraxis.train.claim", "paraxis.train.faults",
               "paraxis.train.metrics", "paraxis.train.progress", "paraxis.train.resume",
               "paraxis.dist.heartbeat", "paraxis.dist.watchdog",
               "paraxis.parallel.context.packing", "paraxis.parallel.experts.layer")


def run_training(cfg: RunConfig) -> list[dict]:
    """Train; return the per-step metrics (the same records the metrics file gets)."""
    import torch  # lazy: torch; CLI start-up imports this
    import torch.distributed as dist  # lazy: torch; CLI start-up imports this

    from paraxis.dist.groups import (  # lazy: torch; CLI start-up imports this
        build_groups,
        init_distributed,
        pick_device,
        ranks_per_device,
        shutdown_distributed,
    )
    from paraxis.dist.heartbeat import (  # lazy: torch; CLI start-up imports this
        start_heartbeat,
    )
    from paraxis.parallel.context.packing import (  # lazy: torch; CLI start-up imports this
        packing_id,
    )
    from paraxis.parallelize import (  # lazy: torch; and a test patches build_engine
        build_engine,
    )
    from paraxis.train.claim import claim_folder  # lazy: torch; CLI start-up imports this
    from paraxis.train.metrics import (  # lazy: torch; CLI start-up imports this
        device_memory_bytes,
    )
    from paraxis.train.resume import (  # lazy: torch; CLI start-up imports this
        start_step,
        write_config,
    )

    cfg.check()
    train = cfg.train
    model_cfg = load_model_config(cfg.model.name)
    model_cfg.check_seq_len(train.seq_len)
    device = pick_device(train.device, train.share_gpu)
    if device.type == "cuda" and cfg.layout.cp > 1 and \
            get_policy(train.precision).compute_dtype == "fp32":
        # context_parallel.kernel runs FlashAttention on GPU, which has no fp32 kernels
        raise ParaxisError("context parallelism on GPU computes attention with FlashAttention, "
                           "which takes bf16 or fp16, not fp32; use --precision bf16")
    joined = dist.is_initialized()  # a caller's process group (tests) stays theirs to close
    rank, world = init_distributed(device, train.timeout_s, train.share_gpu)
    if cfg.launch.nproc != world:  # torchrun's ranks: the config.toml they write replays as
        # `paraxis train --config` on as many ranks
        cfg = dataclasses.replace(cfg, launch=dataclasses.replace(cfg.launch, nproc=world))
    clean = False  # whether every rank can still meet at the shutdown barrier
    claim = None  # this run's hold on --checkpoint-dir (train/claim.py)
    try:
        layout = cfg.layout.validate(world, model_cfg, train.global_batch, train.seq_len)
        memory = device_memory_bytes(device)  # None on CPU
        if memory is not None:  # ranks sharing a GPU (--share-gpu) each get a share of it
            memory /= ranks_per_device(device, train.share_gpu)
        check_states_fit(model_cfg, layout, train.precision, memory, cfg.model.name)
        data = load_run_data(cfg.data)  # memory-mapped: nothing is read yet but checks
        data.check(model_cfg.vocab_size, train.seq_len, held_out=cfg.eval.every > 0)
        end_of_document = packing_id(data.end_of_document, data.name) \
            if train.pack_documents else None  # a blend's common id is asked only then
        claim = claim_folder(cfg, data, rank, world)
        groups = build_groups(layout)
        torch.manual_seed(train.seed)
        compiled = _compiles(cfg, model_cfg, layout, device.type, end_of_document)
        options = RuntimeOptions(
            precision=train.precision, adamw=cfg.optimizer.adamw(),
            bucket_bytes=int(train.bucket_mb * MIB), compile=compiled,
            end_of_document=end_of_document, fused_loss=train.fused_loss,
            fp8_weight_gather=train.fp8_weight_gather)
        engine = build_engine(model_cfg, layout, groups, device, seed=train.seed,
                              options=options, seq_len=train.seq_len,
                              announce=rank == 0 and not cfg.logging.quiet)
        _startup_notes(cfg, model_cfg, layout, engine, rank, world, compiled)
        heartbeat = start_heartbeat(rank, world, train.timeout_s)
        try:
            first, seen = start_step(cfg, engine, model_cfg, rank)
            if rank == 0:  # once the checkpoint it starts from has loaded: a run that
                write_config(cfg)  # cannot start leaves the last run's config.toml
            records = _loop(cfg, engine, data, groups, device, rank, model_cfg, first, claim,
                            seen)
        finally:
            if heartbeat is not None:
                heartbeat.stop()
        clean = True
        return records
    except (NumericalFault, Preempted):
        clean = True  # every rank stops at the same step (nan_policy.py, preemption.py)
        raise
    finally:
        # After any other failure some rank may be gone or stuck: a barrier would only wait
        # out the timeout, so the process just exits.
        if claim is not None:
            claim.release()
        if not joined:
            shutdown_distributed(clean)


def _compiles(cfg: RunConfig, model_cfg: ModelConfig, layout: Layout, device_type: str,
              end_of_document: int | None) -> bool:
    """Whether the run compiles its model: --compile, or by default on CUDA where the schedule
    allows; ranks sharing a GPU only where the compiled model communicates nothing inside."""
    from paraxis.parallelize import compiles_whole  # lazy: torch; CLI start-up imports this

    train = cfg.train
    compiled = train.compiles(device_type, layout.schedule)
    if compiled and train.share_gpu and not compiles_whole(model_cfg, layout, end_of_document):
        # torch.compile turns the collectives inside compiled blocks into its own traced
        # ones on C++ process groups; ranks sharing a GPU have a Python one
        if train.compile:
            raise ParaxisError("--compile with --share-gpu compiles only layouts whose "
                               "model communicates nothing inside (dp, ZeRO 0-2); drop "
                               "--compile, or --share-gpu")
        return False
    return compiled


def _startup_notes(cfg: RunConfig, model_cfg: ModelConfig, layout: Layout, engine: Engine,
                   rank: int, world: int, compiled: bool) -> None:
    """What the run says before its first step: each rank's model states, and on rank 0 the
    notes a run's settings call for (compiling by default, an expert capacity over dp x cp,
    experts whole on every tp rank)."""
    from paraxis.train.metrics import print_model_states  # lazy: torch; CLI start-up imports this

    train = cfg.train
    if not cfg.logging.quiet:
        print_model_states(engine.memory_report(), rank, world,
                           get_policy(train.precision).describe())
        if train.compile is None and compiled and rank == 0:
            print("paraxis: note: torch.compile is on (the default on CUDA): the first "
                  "step compiles the model and takes longer; --no-compile turns it off",
                  file=sys.stderr, flush=True)
    if model_cfg.capacity_factor and layout.dp * layout.cp > 1 and rank == 0:
        print(f"paraxis: note: capacity_factor {model_cfg.capacity_factor:g} caps each "
              f"expert per rank, over its own tokens (as Megatron-LM does): with dp x cp = "
              f"{layout.dp * layout.cp} other tokens are dropped than on one device "
              "(metrics: dropped_tokens)", file=sys.stderr, flush=True)
    if (model_cfg.is_moe and layout.tp > 1 and feed_forward(model_cfg, layout) == "whole"
            and rank == 0):
        print(f"paraxis: note: {experts_over_tp(model_cfg, layout)}", file=sys.stderr,
              flush=True)


def _loop(cfg: RunConfig, engine: Engine, data: TokenData | Blend, groups: ParallelGroups,
          device: torch.device, rank: int, model_cfg: ModelConfig, first_step: int = 0,
          claim: Claim | None = None, samples_at_start: int = 0) -> list[dict]:
    import torch  # lazy: torch; CLI start-up imports this

    from paraxis.dist.groups import (  # lazy: torch; CLI start-up imports this
        ranks_per_device,
    )
    from paraxis.dist.watchdog import WATCH  # lazy: torch; CLI start-up imports this
    from paraxis.parallel.experts.layer import (  # lazy: torch; CLI start-up imports this
        update_expert_biases,
    )
    from paraxis.train import faults  # lazy: torch; CLI start-up imports this
    from paraxis.train.metrics import (  # lazy: torch; CLI start-up imports this
        MetricsSink,
        device_peak_flops,
        moe_step_metrics,
        over_ranks,
        peak_memory_bytes,
    )
    from paraxis.train.progress import Progress  # lazy: rich, and torch via the heartbeat
    from paraxis.train.resume import (  # lazy: torch; CLI start-up imports this
        save,
        save_due,
        trim_metrics,
    )

    fault = faults.from_env()  # None unless a reliability test breaks the run on purpose
    train, log = cfg.train, cfg.logging
    layout = groups.layout
    tokens_per_step = train.global_batch * train.seq_len
    peak_flops = device_peak_flops(device, log.peak_tflops, log.hardware, train.precision)
    if peak_flops is not None:  # ranks sharing a GPU (--share-gpu) each get a share of it
        peak_flops /= ranks_per_device(device, train.share_gpu)
    records: list[dict] = []
    # A resumed run appends to the metrics of the run it continues (less the steps logged
    # after the checkpoint it resumes: they are about to be taken again).
    if rank == 0 and first_step > 0 and log.metrics_file:
        trim_metrics(Path(log.metrics_file), first_step)
    sink = MetricsSink(log.metrics_file, log.tensorboard, append=first_step > 0,
                       start_step=first_step) if rank == 0 else None
    show = rank == 0 and not log.quiet
    data, share = Blend.of(data), Share.of(groups.layout, groups.rank)
    exit_after = cfg.checkpoint.exit_after  # a resume past it runs on to the last step
    last = exit_after if exit_after and first_step < exit_after < train.steps else train.steps

    def read(step: int) -> tuple[np.ndarray, np.ndarray]:  # runs in the loader's thread
        return read_share(data, step, train.global_batch, train.seq_len, train.seed, share)

    with Progress(train.steps, enabled=show, title=f"{model_cfg.name} {layout}") as progress, \
            StopRequest() as stop, \
            Loader(read, range(first_step, last), cfg.data.prefetch) as loader:
        for step in range(first_step, train.steps):
            started, ticks = time.perf_counter(), cpu_ticks()
            WATCH.begin_step(step)
            if fault is not None:
                fault.before_step(step, rank, engine.model)
            batch, data_wait_s = loader.get(step)
            x, y = _to_device(batch, device)
            lr = learning_rate(step, cfg)
            # The whole step is queued before the host reads a number from it; a step whose
            # loss or gradient norm is not finite has left the weights alone on the device.
            loss_t, grad_norm_t = engine.train_step(x, y, lr, cfg.optimizer.grad_clip)
            # On NCCL a collective's wait only queues it: a stalled one holds the host here,
            # so the watchdog names this read as a wait on every rank's work, not compute
            with WATCH.device_sync():
                loss, grad_norm = float(loss_t), float(grad_norm_t)
            # The NaN policy (train/nan_policy.py): every rank reaches the same verdict, and
            # a non-finite step never reaches the weights.
            problem = nonfinite(loss, grad_norm, engine.skipped_overflow())
            if problem and train.on_nan == "stop":
                raise NumericalFault(stop_message(step, problem))
            overflowed = problem is None and engine.skipped_overflow()
            if problem is None and not overflowed:
                update_expert_biases(engine.model)  # an MoE's routing bias: applied steps only
            elif problem is not None and rank == 0:
                print(skip_message(step, problem), file=sys.stderr, flush=True)
            if overflowed and rank == 0:
                print(overflow_message(step, engine.loss_scaler.state_dict()["scale"]),
                      file=sys.stderr, flush=True)
            engine.zero_grad()
            # From here on the weights hold good steps only: the place to save a checkpoint.
            if device.type == "cuda":  # the optimizer's kernels are this step's time
                torch.cuda.synchronize(device)
            step_time = time.perf_counter() - started
            tokens_per_s = tokens_per_step / step_time
            record = {"step": step, "loss": loss, "lr": lr, "grad_norm": grad_norm,
                      "tokens_per_s": tokens_per_s, "step_time_s": step_time,
                      "mfu": None if peak_flops is None else mfu(
                          model_cfg, train.seq_len, tokens_per_s, layout.world_size, peak_flops),
                      "peak_mem_bytes": peak_memory_bytes(device), "data_wait_s": data_wait_s,
                      # the CPU time a VM's host took meanwhile (paraxis/files/host_steal.py)
                      "cpu_steal": stolen_share(ticks, cpu_ticks()),
                      "device": device.type}  # what peak_mem_bytes measured: RSS on "cpu"
            record.update(moe_step_metrics(engine.model, groups, model_cfg))
            if cfg.auto.predicted_step_s is not None:  # --layout auto: the planner's forecast
                record["predicted_step_s"] = cfg.auto.predicted_step_s
            done = step + 1
            logging = step % log.log_every == 0 or done == train.steps
            if logging:
                peaks = over_ranks(record["peak_mem_bytes"])
                record["peak_mem_bytes_by_rank"] = peaks
                record["peak_mem_bytes_max_rank"] = max(peaks)
            if cfg.eval.every and (done % cfg.eval.every == 0 or done == train.steps):
                val_loss = _evaluate(cfg, engine, data, share, device, stop)
                if val_loss is not None:  # None: a stop signal cut the evaluation short
                    record["val_loss"] = val_loss
            record["data_bytes_read"] = data.bytes_read()  # this rank's, held-out reads too
            if problem or overflowed:
                record["skipped"] = problem or "fp16 gradients overflowed (loss scale lowered)"
            if engine.loss_scaler is not None:  # fp16: the scale the next step uses
                record["loss_scale"] = engine.loss_scaler.state_dict()["scale"]
            records.append(record)
            if sink:
                sink.write(record)
            progress.update(step, record, log=logging)
            signum = stop.agreed(device)  # every rank stops at the same step, or none
            if save_due(cfg, done) or (signum and cfg.checkpoint.dir):
                save(cfg, engine, model_cfg, done, claim,
                     samples_at_start + (done - first_step) * train.global_batch)
            if signum:
                raise Preempted(signum, done, cfg.checkpoint.dir and str(
                    Path(cfg.checkpoint.dir) / step_dir_name(done)))
            if done == cfg.checkpoint.exit_after:
                break
    if sink:
        sink.close()
    if log.metrics_file:
        _save_trace(engine, beside(log.metrics_file, "trace.json"), rank)
    return records


def _to_device(batch: tuple[np.ndarray, ...], device: torch.device) -> tuple[torch.Tensor, ...]:
    import torch  # lazy: torch; CLI start-up imports this

    return tuple(torch.from_numpy(part).to(device) for part in batch)


# Held-out batches between two checks of the stop flag during an evaluation: a stop signal
# waits at most this many (one agreed flag, as at a step boundary, on every rank alike).
EVAL_STOP_EVERY = 64


def _evaluate(cfg: RunConfig, engine: Engine, data: Blend, share: Share,
              device: torch.device, stop: StopRequest) -> float | None:
    """Mean loss over the same `eval_batches` held-out batches every time (comparable
    across steps, runs and layouts): --val-data's, else each source's tail. None when a stop
    signal came during it: the run stops at this step without a held-out loss."""
    train, total = cfg.train, 0.0
    for index in range(cfg.eval.batches):
        if index and index % EVAL_STOP_EVERY == 0 and stop.agreed(device):
            return None
        batch = read_share(data, index, train.global_batch, train.seq_len, train.seed, share,
                           split="val")
        total += engine.evaluate(*_to_device(batch, device))
    return total / cfg.eval.batches


def _save_trace(engine: Engine, path: Path, rank: int) -> None:
    """The last step's per-rank pipeline actions as one Chrome/Perfetto trace (rank 0
    writes it), for the report's measured timeline. Only pipeline engines record actions."""
    import torch.distributed as dist  # lazy: torch; CLI start-up imports this

    from paraxis.dist.watchdog import WATCH  # lazy: torch; CLI start-up imports this

    events = engine.trace_events()
    if engine.layout.pp == 1:
        return
    if dist.is_initialized():
        gathered: list | None = [None] * dist.get_world_size() if rank == 0 else None
        with WATCH.waiting("gather_object"):
            dist.gather_object(events, gathered, dst=0)
        events = [e for part in (gathered or []) for e in part]
    if rank == 0 and events:
        write_chrome_trace(events, path)
