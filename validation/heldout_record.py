"""One published run held out from the planner's fitting (validation/heldout_runs.py lists them)."""

from __future__ import annotations

from dataclasses import dataclass

from paraxis.spec.model_config import ModelConfig


@dataclass(frozen=True)
class HeldOutRun:
    name: str
    model: str | ModelConfig  # a paraxis preset (spec/model_config.py) or the source's shape
    gpu: str  # a key of validate_heldout.CLUSTERS: "a100", "a100-40gb", "h100", "h100-96gb"
    gpus: int
    dp: int  # data-parallel degree (FSDP/ZeRO over it, see zero)
    tp: int
    pp: int
    local_batch: int  # sequences per data-parallel rank per step
    seq_len: int
    recompute: str  # none, selective, full (paraxis's), or torchtitan's layer-2 and op
    tokens_per_gpu_s: float | None  # as published; None where the table reports OOM
    source: str
    where: str  # table and row
    unpriced: str = ""  # why the planner cannot price it ("" = priced)
    out_of_memory: bool = False  # the source reports this configuration ran out of memory
    schedule: str = "1f1b"
    micro_batch: int = 0  # sequences per microbatch (0: the whole local batch; -1: not stated)
    zero: int = 3  # ZeRO stage over dp: 3 = FSDP FULL_SHARD, 2 = SHARD_GRAD_OP, 0 = DDP; -1: ?
    kernels: str = "eager"  # elementwise ops: "eager" PyTorch or "fused" (Megatron, apex)
    # AdamW (GPU.optimizer_kernel); "auto": torch.optim.AdamW's multi-tensor ops beside eager
    # elementwise kernels, a fused Adam beside fused ones (validate_heldout.optimizer_kernel)
    optimizer_kernel: str = "auto"
    attention_kernel: str = "flash"  # "math" where the source keeps the s x s scores
    # The flash implementation the source ran (plan/attention_rates.py: "fa2", "fa1",
    # "triton"), its core priced at that kernel's measured rate by shape; "": the source does
    # not say, the core is priced at the GEMM rate (as every row was before the kernel fits).
    attention_impl: str = ""
    network: tuple[tuple[str, object], ...] = ()  # cluster overrides the source states
    cp: int = 1  # context-parallel degree (the sequence split over cp ranks)
    cp_attention: str = "ring"  # how K/V reach the queries: ring, all_gather or all_to_all
    sequence_parallel: bool = False
    virtual_stages: int = 1  # interleaving depth; 0: not published, the planner picks it
    precision: str = "bf16"  # a key of paraxis.spec.precision.PRECISIONS
    # FP8 rows: the scaling recipe the source ran (None: the precision's; plan/fp8.py) and
    # whether its ZeRO/FSDP gathers moved FP8 weights
    fp8_recipe: str | None = None
    fp8_weight_gather: bool = False
    # AdamW's state bytes per parameter where the source's optimizer stores other than the
    # precision's fp32 moments and master (0: the precision's)
    optimizer_bytes: float = 0
    fsdp: bool = False  # PyTorch FSDP: gradients reduced one wrapped block (layer) at a time
    ep: int = 1  # expert-parallel degree (mixtures of experts), carved out of dp x cp
    etp: int = 1  # expert tensor parallelism: 1 (experts whole) or tp (split like the MLP)
    expert_imbalance: float = 0.0  # busiest EP rank's load over the mean (0: planner default)
