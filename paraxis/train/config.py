"""A run's configuration: typed sections, each field one fact (default, type, help, flag).

    [model]      name = "tiny-llama"
    [data]       path = "embedded"  dtype = "uint16"  tokenizer = "tok/tokenizer.json"
                 text_field = "text"  val_path = "heldout.jsonl"  prefetch = 2
    [train]      steps = 200  global_batch = 16  seq_len = 128  seed = 0  device = "auto"
                 precision = "fp32"  compile = false  bucket_mb = 25.0  timeout_s = 600
                 on_nan = "stop"  pack_documents = false
    [optimizer]  lr = 3e-3  min_lr_ratio = 0.1  warmup_steps = 20  weight_decay = 0.1
                 grad_clip = 1.0
    [layout]     dp = 2  tp = 1  pp = 1  zero = 1  microbatches = 2  schedule = "1f1b"
    [eval]       every = 50  batches = 4
    [logging]    metrics_file = "runs/x/metrics.jsonl"  log_every = 10  quiet = false
    [checkpoint] dir = "runs/x/checkpoints"  every = 50  keep = 3  resume = "auto"
    [launch]     nproc = 4  max_restarts = 0  rdzv_host = "127.0.0.1"
    [auto]       enabled = false  memory_gb = 2.0   (paraxis/train/auto_config.py)

A section is a frozen dataclass and a TOML table of the same name; [layout] is
`paraxis.spec.layout.Layout` itself. Everything else is derived from the fields: the TOML keys
(`paraxis.train.run_file`), the command-line flags (`paraxis.commands.train`), their help and the
flat keyword names `RunConfig.from_flags` takes (`--checkpoint-dir` -> `checkpoint_dir`). A
field's flag is `--<name>` unless its metadata names another (`warmup_steps` is `--warmup`).
Adding an option is adding one field here.

Reading a run file is strict: an unknown section or key, or a value of the wrong type, is
a one-line error naming the known ones, so a typo never silently trains with a default.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paraxis.data.blend import DataSection
from paraxis.files.checkpoint_manifest import MANIFEST
from paraxis.files.host import check_writable, check_writable_folder
from paraxis.spec.errors import ParaxisError
from paraxis.spec.kernels import check_fused_loss
from paraxis.spec.layout import Layout
from paraxis.spec.optimizer import DEFAULT_ADAMW, AdamW
from paraxis.spec.options import option
from paraxis.spec.precision import fp8_gather_problem, get_policy
from paraxis.spec.schedules import SPLIT_BACKWARD, check_compile
from paraxis.spec.units import DEFAULT_BUCKET_MB, MIB
from paraxis.train.auto_config import AutoSection, check_no_layout_flags, take_layout
from paraxis.train.nan_policy import POLICIES

FP32_MAX = 3.4028234663852886e38
# A collective's wait: below a second the rendezvous itself cannot start; above 10 million
# (115 days) the number no longer fits the C++ timeouts it becomes.
MIN_TIMEOUT_S, MAX_TIMEOUT_S = 1.0, 1e7
MAX_BUCKET_MB = 1 << 20  # a terabyte: past any model's gradients


NO_VALUE: Any = object()  # a message names a field alone, without its value


class FlagNames:
    """How a rule names the value it refuses: by the flag that sets it, keyed by the flag's
    flat key (`lr`, `checkpoint_every`): `of("lr", -1)` is `--lr -1`. A run file names its
    own values by their TOML keys instead (`run_file.RunFileNames`)."""

    def of(self, key: str, value: Any = NO_VALUE) -> str:
        name = "--" + key.replace("_", "-")
        return name if value is NO_VALUE else f"{name} {value}"


FLAG_NAMES = FlagNames()
# What 0 means for the counts that may be 0
ZERO_MEANS = {"checkpoint_every": "save only at the end", "keep": "keep all",
              "eval_every": "never evaluate"}


@dataclass(frozen=True)
class ModelSection:
    name: str = option("tiny", "preset (tiny, tiny-llama, gpt2-124m, ...), a .json/.toml model "
                       "file, or a Hugging Face / paraxis checkpoint directory", "--model")


@dataclass(frozen=True)
class TrainSection:
    steps: int = option(100, "optimizer steps; the learning-rate schedule spans them")
    global_batch: int = option(16, "sequences per step, over all data-parallel ranks")
    seq_len: int = option(128, "tokens per sequence")
    seed: int = option(0, "seed of the initial weights and of the batch order")
    device: str = option("auto", "auto, cpu or cuda")
    share_gpu: bool = option(False, "CUDA ranks take the GPUs in turn, more ranks than GPUs, "
                             "their collectives staged through gloo on the host: slow, to "
                             "run every axis's CUDA code on a one-GPU machine "
                             "(docs/gpu/README.md)")
    precision: str = option("fp32", "precision policy: fp32, bf16 (bf16 parameters and "
                            "gradients, fp32 masters), bf16-fp32grad, fp16 (loss scaling), "
                            "fp8 or fp8-rowwise (bf16's, the blocks' GEMMs in FP8), "
                            "autocast-bf16 (fp32 state, bf16 compute); docs/precision.md")
    compile: bool | None = option(None, "torch.compile the model (whole where nothing in it "
                                  "communicates, else each block, hooks and collectives "
                                  "eager); default: on CUDA yes, on CPU no "
                                  "(docs/gpu/README.md)")
    fused_loss: bool = option(False, "the LM head and the loss as one kernel, a chunk of "
                              "tokens at a time, that never holds the whole logits (tp=1, "
                              "zero 0-2; docs/precision.md)")
    fp8_weight_gather: bool = option(False, "ZeRO-3 all-gathers the blocks' FP8 weights in "
                                     "FP8, half the bytes (--precision fp8, --zero 3; "
                                     "docs/precision.md)")
    pack_documents: bool = option(False, "attention, positions and loss kept within each "
                                  "document (needs an end-of-document id; docs/data.md)")
    bucket_mb: float = option(DEFAULT_BUCKET_MB, "data-parallel gradient bucket size in MiB")
    timeout_s: float = option(600.0, "seconds any collective or message may wait before the "
                              "run stops, naming it")
    on_nan: str = option("stop", "a NaN/inf loss or gradient stops the run or skips that step",
                         choices=POLICIES)

    def compiles(self, device_type: str, schedule: str) -> bool:
        """`--compile` as given, else yes on CUDA (measured faster there: docs/gpu/README.md)
        unless the schedule splits the backward, which a compiled block cannot; no on CPU,
        where compiling costs more than it saves on the models a CPU trains."""
        if self.compile is not None:
            return self.compile
        return device_type == "cuda" and schedule not in SPLIT_BACKWARD


@dataclass(frozen=True)
class OptimizerSection:
    lr: float = option(3e-3, "peak learning rate")
    min_lr_ratio: float = option(0.1, "final learning rate as a fraction of --lr")
    warmup_steps: int = option(10, "steps of linear warmup", "--warmup")
    weight_decay: float = option(DEFAULT_ADAMW.weight_decay,
                                 "AdamW weight decay of the matrices; 0 turns it off")
    adam_beta1: float = option(DEFAULT_ADAMW.betas[0], "AdamW's first-moment decay",
                               "--adam-beta1")
    adam_beta2: float = option(DEFAULT_ADAMW.betas[1], "AdamW's second-moment decay",
                               "--adam-beta2")
    adam_eps: float = option(DEFAULT_ADAMW.eps, "AdamW's epsilon", "--adam-eps")
    grad_clip: float = option(1.0, "max global gradient norm; 0 turns clipping off")

    @property
    def betas(self) -> tuple[float, float]:
        return self.adam_beta1, self.adam_beta2

    def adamw(self) -> AdamW:
        return AdamW(self.weight_decay, self.betas, self.adam_eps)


@dataclass(frozen=True)
class EvalSection:
    every: int = option(0, "steps between held-out loss evaluations; 0: never", "--eval-every")
    batches: int = option(4, "held-out batches per evaluation", "--eval-batches")


@dataclass(frozen=True)
class LoggingSection:
    metrics_file: str | None = option(None, "write one JSON line per step (and config.toml, "
                                      "trace.json beside it)")
    log_every: int = option(10, "steps between progress lines")
    tensorboard: str | None = option(None, "also write TensorBoard event files to this folder")
    peak_tflops: float | None = option(None, "one device's peak TFLOP/s for MFU (default: the "
                                       "GPU preset, or --hardware)")
    hardware: str | None = option(None, "hardware file (paraxis calibrate) giving the peak")
    quiet: bool = option(False, "no progress display")


@dataclass(frozen=True)
class CheckpointSection:
    dir: str | None = option(None, "save sharded checkpoints here (step-N/)", "--checkpoint-dir")
    every: int = option(0, "steps between checkpoints; 0: only at the end", "--checkpoint-every")
    keep: int = option(3, "complete checkpoints kept; 0: all", "--keep")
    resume: str | None = option(None, "checkpoint (or a folder of them: the newest) to continue "
                                "from; 'auto': the newest in --checkpoint-dir, if any", "--resume")
    exit_after: int | None = option(None, "stop after this step with a checkpoint (a job's time "
                                    "slot); the schedule still spans --steps", "--exit-after")
    init_from: str | None = option(None, "start from these weights (a paraxis checkpoint or a "
                                   "Hugging Face folder); optimizer and schedule start fresh",
                                   "--init-from")
    allow_changes: bool = option(False, "resume even with another global batch, sequence "
                                 "length, seed or data than the checkpoint's",
                                 "--allow-resume-changes")


@dataclass(frozen=True)
class LaunchSection:
    nproc: int = option(1, "launch this many ranks here (alone: --dp N); under torchrun leave "
                        "it out")
    max_restarts: int = option(0, "when a rank dies, restart all ranks from the newest "
                               "checkpoint, this many times (one process too: it runs as a "
                               "launched rank; under torchrun use its own flag)")
    rdzv_host: str = option("127.0.0.1", "address the --nproc launcher's store listens on; "
                            "the default is loopback only")


@dataclass(frozen=True)
class RunConfig:
    """Everything one training run needs; a TOML table per section."""

    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    train: TrainSection = field(default_factory=TrainSection)
    optimizer: OptimizerSection = field(default_factory=OptimizerSection)
    layout: Layout = field(default_factory=Layout)
    eval: EvalSection = field(default_factory=EvalSection)
    logging: LoggingSection = field(default_factory=LoggingSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    launch: LaunchSection = field(default_factory=LaunchSection)
    auto: AutoSection = field(default_factory=AutoSection)

    @classmethod
    def from_flags(cls, **flags: Any) -> RunConfig:
        """The defaults with `flags` on top, named as the command line names them:
        `RunConfig.from_flags(model="tiny", steps=3, warmup=0, layout="dp=2")`."""
        return cls().with_flags(**flags)

    def with_flags(self, **flags: Any) -> RunConfig:
        """This config with `flags` on top. `layout` (a Layout or "dp=2,tp=2" text) replaces
        the layout before the single-axis flags (`dp`, `zero`, ...) change it; `grad_accum`
        is another name for `microbatches`."""
        unknown = sorted(set(flags) - set(FLAGS) - {"layout", "grad_accum"})
        if unknown:
            raise TypeError(f"unknown flag(s) {', '.join(unknown)}; known: {', '.join(FLAGS)}")
        layout = take_layout(flags, self.layout)  # "auto": the planner picks it
        if isinstance(layout, str):
            layout = Layout.parse(layout)
        accum = flags.pop("grad_accum", None)
        if accum is not None:
            if accum < 1:
                raise ParaxisError(f"--grad-accum {accum} must be at least 1")
            given = flags.get("microbatches")
            if given is not None and given != accum:
                raise ParaxisError(f"--grad-accum {accum} and --microbatches {given} name the "
                                   "same count (microbatches per step); give one of them")
            flags["microbatches"] = accum
        changes: dict[str, dict[str, Any]] = {}
        for key, value in flags.items():
            section, name = FLAGS[key]
            changes.setdefault(section, {})[name] = value
        if changes.get("auto", {}).get("enabled", self.auto.enabled):
            check_no_layout_flags([key for key in flags if FLAGS[key][0] == "layout"])
        replaced = {name: dataclasses.replace(getattr(self, name), **values)
                    for name, values in changes.items() if name != "layout"}
        return dataclasses.replace(self, **replaced,
                                   layout=layout.replace(**changes.get("layout", {})))

    def check(self, names: FlagNames | None = None) -> None:
        """Every rule a value must keep, as a one-line error naming where the value came
        from: its flag (`--lr -1`), or a run file's key (`names`, `run_file.RunFileNames`)."""
        train, opt, ckpt = self.train, self.optimizer, self.checkpoint
        of = (names or FLAG_NAMES).of
        if train.steps > 10**12:  # a trillion steps: past any run, and past int64 sums
            raise ParaxisError(f"{of('steps', train.steps)} is over 10**12; give a real step "
                               "count")
        if train.steps < 1:
            raise ParaxisError(f"{of('steps', train.steps)} must be at least 1")
        if train.seq_len < 1:
            raise ParaxisError(f"{of('seq_len', train.seq_len)} must be at least 1")
        if not opt.lr > 0 or not math.isfinite(opt.lr):
            raise ParaxisError(f"{of('lr', opt.lr)} must be a positive number")
        if opt.lr > FP32_MAX / 10:  # AdamW's first step is lr / (1 - beta1) (Kingma & Ba, alg. 1)
            raise ParaxisError(f"{of('lr', opt.lr)} overflows fp32 in AdamW's first update; "
                               "typical values are 1e-4 to 1e-2")
        if opt.grad_clip < 0:
            raise ParaxisError(f"{of('grad_clip', opt.grad_clip)} must be >= 0 (0 turns it off)")
        if opt.warmup_steps < 0:
            raise ParaxisError(f"{of('warmup', opt.warmup_steps)} must be >= 0")
        for key, count in (("checkpoint_every", ckpt.every), ("keep", ckpt.keep),
                           ("eval_every", self.eval.every)):
            if count < 0:
                raise ParaxisError(f"{of(key, count)} must be >= 0 (0: {ZERO_MEANS[key]})")
        if self.eval.batches < 1:
            raise ParaxisError(f"{of('eval_batches', self.eval.batches)} must be at least 1")
        unset = CheckpointSection()  # a value other than the default was asked for
        for key, given in (("checkpoint_every", ckpt.every != unset.every),
                           ("keep", ckpt.keep != unset.keep)):
            if given and not ckpt.dir:  # as --exit-after: nothing would be saved
                raise ParaxisError(f"{of(key)} needs --checkpoint-dir (where the checkpoints "
                                   "go); add it, or leave the flag out")
        check_evaluation(self, of)
        if ckpt.exit_after is not None and ckpt.exit_after < 1:
            raise ParaxisError(f"{of('exit_after', ckpt.exit_after)} must be at least 1")
        if ckpt.exit_after is not None and ckpt.exit_after > train.steps:  # never reached
            raise ParaxisError(f"{of('exit_after', ckpt.exit_after)} is past --steps "
                               f"{train.steps}, where the run ends first; give a step before "
                               "it, or leave the flag out")
        if self.launch.max_restarts < 0:
            raise ParaxisError(f"{of('max_restarts', self.launch.max_restarts)} must be >= 0")
        if self.launch.max_restarts and not ckpt.dir:
            raise ParaxisError(f"{of('max_restarts')} needs --checkpoint-dir: a restart "
                               "resumes from the newest checkpoint there")
        if ckpt.resume and ckpt.init_from:
            raise ParaxisError("give --resume (continue a run) or --init-from (start from its "
                               "weights), not both")
        if ckpt.resume == "auto" and not ckpt.dir:
            raise ParaxisError(f"{of('resume', ckpt.resume)} needs --checkpoint-dir (where to "
                               "look)")
        get_policy(train.precision, of("precision", train.precision))
        for key, value in (("global_batch", train.global_batch),
                           ("log_every", self.logging.log_every),
                           ("nproc", self.launch.nproc)):
            if value < 1:
                raise ParaxisError(f"{of(key, value)} must be at least 1")
        if not 0 <= opt.weight_decay < math.inf:
            raise ParaxisError(f"{of('weight_decay', opt.weight_decay)} must be a number >= 0 "
                               "(0 turns it off; typical: 0.1)")
        for key, beta in (("adam_beta1", opt.adam_beta1), ("adam_beta2", opt.adam_beta2)):
            if not 0 <= beta < 1:
                raise ParaxisError(f"{of(key, beta)} must be in [0, 1) (typical: 0.9, 0.95)")
        if not 0 < opt.adam_eps < 1:
            raise ParaxisError(f"{of('adam_eps', opt.adam_eps)} must be a small positive number "
                               "(typical: 1e-8)")
        if not 0 <= opt.min_lr_ratio <= 1:
            raise ParaxisError(f"{of('min_lr_ratio', opt.min_lr_ratio)} must be between 0 and "
                               "1 (the final learning rate as a fraction of --lr)")
        check_compile(self.layout.schedule, train.compile)
        if train.fused_loss:
            check_fused_loss(self.layout.tp, self.layout.zero)
        if train.fp8_weight_gather and (problem := fp8_gather_problem(
                train.precision, self.layout.zero)):
            raise ParaxisError(problem)
        if not (0 < train.bucket_mb <= MAX_BUCKET_MB and train.bucket_mb * MIB >= 1):
            raise ParaxisError(f"{of('bucket_mb', train.bucket_mb)} must be a positive number "
                               f"of MiB, a byte ({1 / MIB:.2g}) up to {MAX_BUCKET_MB:,} (DDP "
                               "uses 25)")
        if not MIN_TIMEOUT_S <= train.timeout_s <= MAX_TIMEOUT_S:
            raise ParaxisError(f"{of('timeout_s', train.timeout_s)} must be a positive number "
                               f"of seconds, {MIN_TIMEOUT_S:g} to {MAX_TIMEOUT_S:,.0f} (default "
                               "600)")
        if train.on_nan not in POLICIES:
            raise ParaxisError(f"{of('on_nan', train.on_nan)} is unknown; use "
                               f"{' or '.join(POLICIES)}")
        if self.logging.metrics_file:
            check_writable(Path(self.logging.metrics_file), of("metrics_file"))
        check_late_failures(self, of)


# ------------------------------------------------------------------ derived: the facts


def sections() -> dict[str, type]:
    """Section name -> its dataclass, in file order."""
    hints = typing.get_type_hints(RunConfig)
    return {f.name: hints[f.name] for f in dataclasses.fields(RunConfig)}


def field_type(section: type, name: str) -> type:
    """A field's type without "| None": `float | None` -> float."""
    hint = typing.get_type_hints(section)[name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


# Flag facts Layout's own fields do not carry (layout.py knows nothing of the command line).
LAYOUT_FLAGS: dict[str, dict[str, Any]] = {
    # torchrun rejects "--virtual" as an abbreviation of its own flag: spell it out too
    "virtual_stages": {"flag": ("--virtual", "--virtual-stages")},
}


def meta(section: str, f: dataclasses.Field, key: str) -> Any:
    """A field's metadata entry ("help", "flag", "choices"), or None."""
    if f.metadata.get(key) is not None:
        return f.metadata[key]
    return LAYOUT_FLAGS.get(f.name, {}).get(key) if section == "layout" else None


def flag_names(section: str, f: dataclasses.Field) -> tuple[str, ...]:
    """The field's command-line spellings, its canonical (long) one last."""
    named = meta(section, f, "flag")
    if named:
        return (named,) if isinstance(named, str) else tuple(named)
    return ("--" + f.name.replace("_", "-"),)


def flag_key(section: str, f: dataclasses.Field) -> str:
    """The flat keyword of a field's flag: `--checkpoint-dir` -> `checkpoint_dir`."""
    return flag_names(section, f)[-1].lstrip("-").replace("-", "_")


def _flag_table() -> dict[str, tuple[str, str]]:
    """Flat flag key (`checkpoint_dir`) -> (section, field name), for every field."""
    table: dict[str, tuple[str, str]] = {}
    for section, cls in sections().items():
        for f in dataclasses.fields(cls):
            key = flag_key(section, f)
            if key in table:
                raise AssertionError(f"two config fields share the flag --{key}")
            table[key] = (section, f.name)
    return table


FLAGS = _flag_table()


def check_late_failures(cfg: RunConfig, of: Callable[..., str] = FLAG_NAMES.of
                        ) -> None:
    """Values that would fail late, after training had started (a traceback at the first
    save), or be silently ignored, refused before anything is created: one-line errors for the
    seed, gradient clip, peak TFLOP/s, --memory-gb and
    --predicted-step-s (auto or not), --exit-after, a negative
    --prefetch, an interleaved schedule without a pipeline, packing with context parallelism,
    and every folder the run will write."""
    train, opt, ckpt, log = cfg.train, cfg.optimizer, cfg.checkpoint, cfg.logging
    if not 0 <= train.seed < 2**63:  # torch.manual_seed takes a signed 64-bit integer
        raise ParaxisError(f"{of('seed', train.seed)} must be between 0 and 2**63 - 1 (numpy's "
                           "and torch's generators take non-negative 64-bit seeds)")
    if not opt.grad_clip >= 0 or opt.grad_clip == math.inf:
        raise ParaxisError(f"{of('grad_clip', opt.grad_clip)} must be a finite number >= 0 "
                           "(0 turns it off)")
    if log.peak_tflops is not None and not 0 < log.peak_tflops < math.inf:
        raise ParaxisError(f"{of('peak_tflops', log.peak_tflops)} must be a positive number "
                           "(one device's peak, e.g. 989 for an H100's bf16)")
    for key, value, unit in (("memory_gb", cfg.auto.memory_gb, "GB per rank"),
                             ("predicted_step_s", cfg.auto.predicted_step_s, "seconds")):
        if value is not None and not 0 < value < math.inf:  # with or without --layout auto
            raise ParaxisError(f"{of(key, value)} must be a positive number of {unit}; leave "
                               "the flag out for the default")
    if ckpt.exit_after is not None and not ckpt.dir:
        raise ParaxisError(f"{of('exit_after')} needs --checkpoint-dir: it stops with a "
                           "checkpoint to continue from")
    if cfg.data.prefetch < 0:
        raise ParaxisError(f"{of('prefetch', cfg.data.prefetch)} must be >= 0 (0: no read-ahead)")
    layout = cfg.layout
    if layout.pp == 1 and (layout.schedule == "interleaved" or layout.virtual_stages > 1):
        raise ParaxisError(f"schedule={layout.schedule} needs pp > 1 (it runs "
                           f"{layout.virtual_stages if layout.virtual_stages > 1 else 'several'}"
                           " model chunks on each pipeline stage); raise pp or use "
                           "schedule=1f1b")
    unset = Layout()  # a value other than the default was asked for
    if layout.cp == 1 and layout.cp_attention != unset.cp_attention:
        raise ParaxisError(f"{of('cp_attention', layout.cp_attention)} says how K/V reach the "
                           "queries across cp ranks, and cp = 1; add --cp N, or leave it out")
    if layout.zero3_reshard != unset.zero3_reshard and not (layout.zero == 3 and layout.pp > 1):
        raise ParaxisError(f"{of('zero3_reshard', layout.zero3_reshard)} applies to ZeRO-3 under a "
                           "pipeline (--zero 3 with --pp 2 or more); leave it out")
    if not cfg.launch.rdzv_host.strip():
        raise ParaxisError(f"{of('rdzv_host')} is empty; give the address the launcher's store "
                           "listens on, e.g. 127.0.0.1")
    for key, given in (("checkpoint_dir", ckpt.dir), ("tensorboard", log.tensorboard),
                       ("metrics_file", log.metrics_file), ("resume", ckpt.resume),
                       ("init_from", ckpt.init_from)):
        if given is not None and not given.strip():  # "" would write into the working folder
            raise ParaxisError(f"{of(key)} is empty; give a path, or leave the flag out")
    for key, folder in (("checkpoint_dir", ckpt.dir), ("tensorboard", log.tensorboard)):
        if folder:
            check_writable_folder(Path(folder), of(key))  # first: a name too long to look in
            if log.metrics_file and Path(log.metrics_file).absolute() == Path(folder).absolute():
                raise ParaxisError(f"{of('metrics_file', log.metrics_file)} is also the "
                                   f"{of(key)} folder; give the metrics file another path")
    if ckpt.dir:
        check_checkpoint_dir(Path(ckpt.dir), of("checkpoint_dir", ckpt.dir))


def check_checkpoint_dir(folder: Path, flag: str) -> None:
    """A run writes its step-N folders (and run.json) into --checkpoint-dir: not into a
    checkpoint itself, whose loader would then find steps inside a step, nor into a Hugging
    Face model's folder, which `generate --checkpoint` would then read as the run's."""
    if (folder / MANIFEST).is_file():
        raise ParaxisError(f"{flag} is a checkpoint (its {MANIFEST}); a run writes its step "
                           f"folders beside it: give its parent, {folder.parent}, or another "
                           "folder")
    if (folder / "config.json").is_file():
        raise ParaxisError(f"{flag} holds a Hugging Face model (its config.json); give "
                           "another folder (--init-from starts a run from that model)")


def check_evaluation(cfg: RunConfig, of: Callable[..., str] = FLAG_NAMES.of) -> None:
    """Held-out data is read only by evaluations: without --eval-every it would be silently
    ignored. (--eval-batches is left alone: a config that turns evaluations off for a while
    keeps its count.)"""
    if cfg.data.val_path and not cfg.eval.every:
        raise ParaxisError(f"{of('val_data', cfg.data.val_path)} is read only by evaluations, "
                           "and --eval-every is 0 (never); add --eval-every N, or leave it out")
