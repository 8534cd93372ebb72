"""Build the engine that runs a layout: the one place where a Layout picks its runtime."""

from __future__ import annotations

import torch

from paraxis.errors import ParaxisError
from paraxis.layout import Layout
from paraxis.model import build_model
from paraxis.model_config import ModelConfig
from paraxis.runtime.distributed import ParallelGroups
from paraxis.runtime.engine import LocalEngine

DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def build_engine(model_cfg: ModelConfig, layout: Layout, groups: ParallelGroups,
                 device: torch.device, *, seed: int = 0, dtype: str = "fp32",
                 weight_decay: float = 0.1, bucket_mb: float = 25.0, seq_len: int | None = None,
                 announce: bool = False) -> LocalEngine:
    """The engine for `layout`, its model built from `seed`; `dtype` is the compute
    precision (fp32, bf16, fp16), `announce` lets a pipeline print its stage split."""
    autocast = DTYPES[dtype]
    if layout.pp == 1 and (layout.dp > 1 or layout.zero > 0):
        from paraxis.data_parallel import DataParallelEngine  # dp=1, zero>0 degenerates
        from paraxis.tensor_parallel import apply_tensor_parallel

        model = build_model(model_cfg, seed=seed, device=device)
        model.set_recompute(layout.recompute)
        # TP first: the data-parallel engine then handles whatever shards this rank holds.
        apply_tensor_parallel(model, groups, layout.sequence_parallel)
        return DataParallelEngine(model, layout, groups, weight_decay=weight_decay,
                                  autocast_dtype=autocast, bucket_bytes=int(bucket_mb * 2**20))
    if layout.world_size == 1:
        model = build_model(model_cfg, seed=seed, device=device)
        model.set_recompute(layout.recompute)
        return LocalEngine(model, layout, weight_decay=weight_decay,
                           autocast_dtype=autocast)
    if layout.pp > 1:  # any dp x tp inside each stage: the pipeline engine composes them
        from paraxis.pipeline_parallel.engine import PipelineEngine

        return PipelineEngine(model_cfg, layout, groups, device, seed=seed,
                              weight_decay=weight_decay, autocast_dtype=autocast,
                              seq_len=seq_len, announce=announce)
    if layout.tp > 1 and layout.dp == 1 and layout.pp == 1:
        from paraxis.tensor_parallel import TensorParallelEngine, apply_tensor_parallel

        model = build_model(model_cfg, seed=seed, device=device)
        model.set_recompute(layout.recompute)
        apply_tensor_parallel(model, groups, layout.sequence_parallel)
        return TensorParallelEngine(model, layout, groups, weight_decay=weight_decay,
                                    autocast_dtype=autocast)
    raise ParaxisError(f"layout {layout} is not supported by this runtime yet")
