"""What a plan is for: the model, the hardware, the batch and the precision.

`paraxis plan` and `paraxis report` read these with the same flags (`add_arguments`) into the
same `PlanInputs` and turn them into a model and a cluster the same way; only their defaults
differ (a report is usually of the tiny demo model, a plan of a large one).
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

from paraxis.files.model_file import load_model_config
from paraxis.plan.fp8 import PRICED_RECIPES
from paraxis.plan.hardware import (
    CLUSTERS,
    GPUS,
    Cluster,
    build_cluster,
    cluster_preset,
    load_hardware_file,
)
from paraxis.spec.errors import ParaxisError
from paraxis.spec.model_config import ModelConfig, model_from_params
from paraxis.spec.precision import PRECISIONS, Precision
from paraxis.spec.units import DEFAULT_RESERVED_BYTES, GB

DEFAULT_GPU = "a100-80gb"
# Bounds of the search's inputs, far beyond any published run (Llama 3 405B: 16,384 GPUs,
# 2,048 sequences a step); past them listing divisors alone would take minutes.
MAX_GPUS = 2**20
MAX_GLOBAL_BATCH = 2**24


@dataclass(frozen=True)
class PlanInputs:
    """The inputs of a plan, as the flags give them (None: not given)."""

    model: str | None = None  # preset name or .json/.toml model file
    params: float | None = None  # or a generic GPT shape of this many parameters
    gpus: int | None = None  # None: one node
    gpus_per_node: int | None = None  # None: the preset's or file's, else 8
    gpu: str | None = None  # None: the hardware file's GPU, else DEFAULT_GPU
    hardware: str | None = None  # TOML/JSON file, e.g. the profile `paraxis calibrate` wrote
    cluster_preset: str | None = None  # a cluster as built (hardware.CLUSTERS), network included
    nics_per_node: int | None = None
    collective_algorithm: str | None = None
    pipeline_zero2_reduce: str | None = None  # GPU.pipeline_zero2_reduce
    memory_gb: float | None = None
    nvlink_gbps: float | None = None
    network_gbps: float | None = None
    precision: str | None = "mixed"  # None: the command's choice (PlanInputs.precision_rule)
    fp8_recipe: str | None = None  # an FP8 precision's scaling recipe (None: the preset's)
    fp8_weight_gather: bool = False  # ZeRO gathers FP8 weights (plan/fp8.py)
    fused_loss: bool = False  # the LM head and loss fused (GPU.loss_kernel "fused-linear")
    seq_len: int | None = None  # None: the model's context length
    global_batch: int = 1024
    layout: str | None = None

    def model_config(self, default: str = "llama2-7b") -> ModelConfig:
        if self.params is not None:
            return model_from_params(self.params, seq_len=self.seq_len or 2048)
        return load_model_config(self.model or default)

    def cluster(self) -> Cluster:
        """The cluster: a cluster preset (or a preset GPU), a hardware file's fields over it,
        then the flags."""
        overrides = cluster_preset(self.cluster_preset) if self.cluster_preset else {}
        if self.hardware:
            overrides.update(load_hardware_file(self.hardware))
        flags = {"memory_bytes": self.memory_gb and self.memory_gb * GB,
                 "nvlink_bandwidth_Bps": self.nvlink_gbps and self.nvlink_gbps * GB,
                 "inter_node_bandwidth_Bps": self.network_gbps and self.network_gbps * GB,
                 "nics_per_node": self.nics_per_node,
                 "collective_algorithm": self.collective_algorithm,
                 "pipeline_zero2_reduce": self.pipeline_zero2_reduce,
                 "loss_kernel": "fused-linear" if self.fused_loss else None}
        if overrides.get("cores_per_node"):
            # flags a CPU profile's measurements leave nothing to: said, not ignored
            moot = [flag for flag, value in (
                ("--gpu", self.gpu), ("--nvlink-gbps", self.nvlink_gbps),
                ("--gpus-per-node", self.gpus_per_node  # below the ranks: a node apart
                 if (self.gpus_per_node or 0) < (self.gpus or 0) else None)) if value is not None]
            if moot:
                raise ParaxisError(f"{', '.join(moot)} with the CPU profile {self.hardware}: "
                                   "its ranks share one machine, its rates and calls measured "
                                   "there; leave them out, or give a GPU with --gpu and no "
                                   "--hardware")
        if overrides.get("cores_per_node") and self.gpus:
            # a CPU profile: every rank runs on this one machine, whatever rank count it was
            # calibrated on, and the ranks planned share its memory (the profile holds a
            # share for as many ranks as it timed: the machine's memory over that count)
            calibrated = int(overrides.get("gpus_per_node", 1))  # type: ignore[call-overload]
            overrides["gpus_per_node"] = self.gpus
            if "memory_bytes" in overrides:
                overrides["memory_bytes"] = \
                    float(overrides["memory_bytes"]) * calibrated / self.gpus  # type: ignore[arg-type]
        flags["gpus_per_node"] = self.gpus_per_node
        overrides.update({k: v for k, v in flags.items() if v is not None})
        overrides["gpu"] = self.gpu or overrides.get("gpu", DEFAULT_GPU)
        cluster = build_cluster(str(overrides["gpu"]), self.gpus, 8, overrides)
        gpu = cluster.gpu
        if gpu.reserved_bytes >= gpu.memory_bytes:  # nothing left: every layout "too big"
            raise ParaxisError(f"reserved_bytes = {gpu.reserved_bytes:g} holds back all of the "
                               f"GPU's memory_bytes = {gpu.memory_bytes:g}; give a reserve "
                               f"below the memory (the runtime's is {DEFAULT_RESERVED_BYTES:g})")
        return cluster

    def precision_rule(self) -> Precision:
        if self.precision is None:
            raise ParaxisError(f"no --precision given; use one of {', '.join(PRECISIONS)}")
        if self.precision not in PRECISIONS:
            raise ParaxisError(f"--precision {self.precision!r} is unknown; use "
                               f"{' or '.join(PRECISIONS)}")
        precision = PRECISIONS[self.precision]
        if (self.fp8_recipe or self.fp8_weight_gather) and precision.fp8_recipe is None:
            raise ParaxisError("--fp8-recipe and --fp8-weight-gather shape an FP8 precision; "
                               "add --precision fp8 (or fp8-rowwise) or leave them out")
        if self.fp8_recipe:
            precision = dataclasses.replace(precision, fp8_recipe=self.fp8_recipe)
        return dataclasses.replace(precision, fp8_weight_gather=self.fp8_weight_gather) \
            if self.fp8_weight_gather else precision

    def sequence_length(self, cfg: ModelConfig) -> int:
        seq_len = self.seq_len or cfg.max_seq_len
        cfg.check_seq_len(seq_len)
        if self.global_batch < 1:
            raise ParaxisError(f"--global-batch {self.global_batch} must be at least 1")
        return seq_len


def add_arguments(parser: argparse.ArgumentParser, *, model: str = "llama2-7b",
                  gpus: int | None = None, gpus_text: str = "one node",
                  global_batch: int | None = 1024,
                  precision: str | None = "mixed",
                  layout_help: str = "a layout, e.g. dp=2,tp=8,pp=4") -> None:
    """The model, hardware, batch, precision and layout flags, with this command's defaults
    (None: the command decides, e.g. a report of a run uses the run's fp32; `gpus_text`
    says what a --gpus of None means)."""
    add = parser.add_argument
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--model", default=None,
                       help=f"preset name or .json/.toml model file (default {model})")
    which.add_argument("--params", type=float, help="generic GPT shape of N parameters")
    add("--gpus", type=int, default=gpus,
        help=f"GPUs (or CPU ranks) in all (default: {gpus or gpus_text})")
    add("--gpus-per-node", type=int, default=None,
        help="GPUs per node (default: the --cluster preset's or --hardware file's, else 8)")
    add("--gpu", default=None, help=f"one of {', '.join(GPUS)} (default: the --hardware "
                                    f"file's, else {DEFAULT_GPU})")
    add("--hardware", help="TOML/JSON hardware file, e.g. the profile `paraxis calibrate` "
                           "wrote (schema in docs/planner.md)")
    add("--memory-gb", type=float,
        help="override GPU memory, in GB of 1e9 bytes (an 80 GiB GPU holds 85.9)")
    add("--cluster", dest="cluster_preset", choices=tuple(CLUSTERS),
        help="a cluster as built, network included (GPU, rails, NIC speed, latencies); "
             "--hardware and the flags below override it")
    add("--nvlink-gbps", type=float, help="override NVLink GB/s per GPU per way")
    add("--network-gbps", type=float, help="override one NIC's GB/s per way (DGX: one per "
                                           "GPU)")
    add("--nics-per-node", type=int, help="NICs (rails) per node (default: one per GPU)")
    add("--collective-algorithm", choices=("ring", "hierarchical"),
        help="cross-node collectives: one flat ring (NCCL's default) or hierarchical")
    add("--pipeline-zero2-reduce", choices=("step", "microbatch"),
        help="how ZeRO-2 reduces gradients under a pipeline: once a step, holding them "
             "whole (paraxis's runtime, the default), or every microbatch (FSDP's default, "
             "as Llama 3 ran)")
    add("--precision", choices=tuple(PRECISIONS), default=precision,
        help="paraxis train's policies (docs/precision.md): fp32 4+4+8 bytes/param (the "
             "CPU default), bf16 (= mixed) 2+2+12, bf16-fp32grad 2+4+12, fp16 2+2+12; "
             "fp8 (tensorwise scales) and fp8-rowwise: bf16's states, the block GEMMs in "
             "FP8 (plan/fp8.py); default: "
             + (precision or "fp32 for a run, else mixed"))
    add("--fp8-recipe", choices=PRICED_RECIPES,
        help="an FP8 precision's scales in place of its preset's: tensorwise, rowwise, or "
             "Transformer Engine's delayed scaling (priced only: paraxis train runs fp8 and "
             "fp8-rowwise)")
    add("--fp8-weight-gather", action="store_true",
        help="fp8: ZeRO gathers the blocks' linear weights in FP8, 1 byte each (paraxis "
             "train --fp8-weight-gather; torchao's enable_fsdp_float8_all_gather)")
    add("--fused-loss", action="store_true",
        help="the LM head and the loss as one chunked kernel that never holds the logits "
             "(paraxis train --fused-loss): priced, and a search keeps to the layouts that "
             "run it (tp=1, ZeRO 0-2); a given layout outside them is priced with the "
             "chunked loss")
    add("--global-batch", type=int, default=global_batch,
        help=f"sequences per step (default: {global_batch or 'the run config, else 16'})")
    add("--seq-len", type=int, help="tokens per sequence (default: the model's context)")
    add("--layout", help=layout_help)
    parser.set_defaults(default_model=model)


def check_numbers(args: argparse.Namespace) -> None:
    """Sizes that must be positive, for `plan` and `report` alike: a 0 must not fall back to
    a default unsaid, nor a zero or negative node size or bandwidth divide by zero or price
    nonsense."""
    layout = getattr(args, "layout", None)
    if layout is not None and not layout.strip():  # "" would search instead, unsaid
        raise ParaxisError("--layout is empty; give a layout such as dp=2,tp=2, or leave the "
                           "flag out")
    model = getattr(args, "model", None)
    if model is not None and not model.strip():  # "" would price the default model, unsaid
        raise ParaxisError("--model is empty; give a preset or a model file, or leave the "
                           "flag out")
    for flag, most in (("gpus", MAX_GPUS), ("global_batch", MAX_GLOBAL_BATCH)):
        value = getattr(args, flag, None)
        if value is not None and value > most:
            raise ParaxisError(f"--{flag.replace('_', '-')} {value:,} is more than the planner "
                               f"searches ({most:,}); give at most that")
    for flag in ("gpus_per_node", "nics_per_node"):
        value = getattr(args, flag, None)
        if value is not None and value < 1:
            default = "one NIC per GPU" if flag == "nics_per_node" else "the default"
            raise ParaxisError(f"--{flag.replace('_', '-')} {value} must be at least 1; leave it "
                               f"out for {default}")
    for flag in ("seq_len", "memory_gb", "nvlink_gbps", "network_gbps"):
        value = getattr(args, flag, None)
        if value is not None and not 0 < value < float("inf"):
            raise ParaxisError(f"--{flag.replace('_', '-')} {value} must be a positive number; "
                               "leave the flag out for the default")
    for flag, fastest, example in (("network_gbps", 200, "a 400 Gb/s NIC is 50"),
                                   ("nvlink_gbps", 1800, "an H100's 900 GB/s both ways is 450")):
        value = getattr(args, flag, None)
        if value is not None and value > fastest:  # read as Gb/s, or both ways
            raise ParaxisError(f"--{flag.replace('_', '-')} {value:g} is GB/s (bytes) each way, "
                               f"beyond any link's ({fastest} GB/s); {example}")


def from_args(args: argparse.Namespace) -> PlanInputs:
    return PlanInputs(model=args.model or (None if args.params is not None
                                           else args.default_model),
                      params=args.params, gpus=args.gpus, gpus_per_node=args.gpus_per_node,
                      gpu=args.gpu, hardware=args.hardware,
                      cluster_preset=getattr(args, "cluster_preset", None),
                      nics_per_node=getattr(args, "nics_per_node", None),
                      collective_algorithm=getattr(args, "collective_algorithm", None),
                      pipeline_zero2_reduce=getattr(args, "pipeline_zero2_reduce", None),
                      memory_gb=args.memory_gb,
                      nvlink_gbps=args.nvlink_gbps, network_gbps=args.network_gbps,
                      precision=args.precision,
                      fp8_recipe=getattr(args, "fp8_recipe", None),
                      fp8_weight_gather=getattr(args, "fp8_weight_gather", False),
                      fused_loss=getattr(args, "fused_loss", False),
                      seq_len=args.seq_len,
                      global_batch=args.global_batch, layout=args.layout)
