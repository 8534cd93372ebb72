"""MosaicML llm-foundry's MPT benchmark tables as held-out runs (validation/heldout_runs.py)."""

from __future__ import annotations

from pathlib import Path

from paraxis.spec.model_config import ModelConfig
from validation.heldout_record import HeldOutRun

# ---------------------------------------------------------------------------------- llm-foundry
# MosaicML's MPT benchmarks: every row of the five tables of scripts/train/benchmarking/
# README.md, copied verbatim into validation/data/llm_foundry_benchmarks.md. FSDP over every GPU
# (FULL_SHARD = ZeRO-3, SHARD_GRAD_OP = ZeRO-2), no TP or PP; microbatch x accumulation per
# GPU; "Activation Checkpointing True" wraps each block (full recompute); triton/flash attention
# (`llm_foundry_kernel`);
# the throughput column (T/s/GPU) is a token rate, so no FLOP convention enters. The FP8
# table's `amp_fp8` is Composer's Transformer Engine autocast (delayed scaling: "delayed"),
# its linears swapped for Transformer Engine's; FSDP gathers bf16 weights.
LLM_FOUNDRY = ("mosaicml/llm-foundry scripts/train/benchmarking/README.md at commit 8c8dd48 "
               "(tables last changed in 4952183): MPT models trained with Composer FSDP")
LLM_FOUNDRY_TABLES = Path(__file__).parent / "data" / "llm_foundry_benchmarks.md"
# The MPT shapes, from scripts/train/yamls/pretrain/mpt-*.yaml (d_model, n_heads, n_layers;
# expansion_ratio 4, vocab 50368); the benchmark rows' NumParams grow by d_model per token of
# SeqLen: learned positions, as in paraxis's gpt2 style.
MPT_SHAPES = {"125m": (768, 12, 12), "350m": (1024, 16, 24), "760m": (1536, 12, 24),
              "1b": (2048, 16, 24), "3b": (2560, 20, 32), "7b": (4096, 32, 32),
              "13b": (5120, 40, 40), "30b": (7168, 56, 48), "70b": (8192, 64, 80)}
LLM_FOUNDRY_GPUS = {"a100_80gb": "a100", "a100_40gb": "a100-40gb", "h100_80gb": "h100"}
ZERO_OF_SHARDING = {"FULL_SHARD": 3, "SHARD_GRAD_OP": 2}
# The attention kernel of each table (plan/attention_rates.py): the 8-64 GPU tables (A100
# 80GB and 40GB, H100 80GB BF16 and FP8) were made by scripts/train/benchmarking/
# submit_benchmarks.py, whose `--attn_impl` (default "triton") overrides the yamls' setting:
# Dao's flash_attn_triton.py of flash-attn 1.0.x on triton 2.0.0.dev20221202 (a vendored copy
# from 2023-05-24), priced at FA1's rate ("triton"). The ">= 128 GPUs" table (sweep.py at
# commit 5e85bd62d, 2024-01-06) passes `--attn_impl flash` (FlashAttention-2, flash-attn
# 2.4.2) for 1b, 3b, 7b and 70b and `triton` for 13b and 30b.
LARGE_SCALE_TABLE = "H100 80GB BF16 (Large Scale, >= 128 GPUs)"
LARGE_SCALE_FLASH = ("1b", "3b", "7b", "70b")


def fp32_reduce(table: str, mode: str) -> bool:
    """Whether a row's FSDP reduced its gradients in fp32: Composer's `mixed_precision:
    DEFAULT` keeps bf16 parameters and reduces in fp32 from Composer 0.17
    (composer/trainer/mosaic_fsdp_utils.py, `get_mixed_precision`); up to 0.16 it left
    `reduce_dtype` unset, which torch's FSDP reads as the parameters' bf16. The ">= 128 GPUs"
    table ran llm-foundry 5e85bd62d (setup.py: mosaicml>=0.17.2,<0.18); the others were
    last made at b2a43a147 (mosaicml>=0.16.4,<0.17) or before."""
    return table == LARGE_SCALE_TABLE and mode == "DEFAULT"


def recompute_rerun(mode: str) -> str:
    """What a row's activation checkpointing reran (`GPU.recompute_rerun`). The yamls wrap
    each MPTBlock non-reentrantly (`activation_checkpointing_reentrant: false`). The rows
    with Composer's `mixed_precision: DEFAULT` were made at b2a43a147 (sweep.sh: image
    mosaicml/pytorch:2.1.0_cu121) or 5e85bd62d (setup.py: torch>=2.1,<2.1.1), on PyTorch
    2.1's checkpoint, which stops its rerun once the backward's tensors are rebuilt
    ("needed"); the PURE rows come from the May 2023 tables (setup.py: torch==1.13.1),
    whose checkpoint reran the block whole."""
    return "needed" if mode == "DEFAULT" else "whole"


def llm_foundry_kernel(table: str, size: str) -> str:
    return "fa2" if table == LARGE_SCALE_TABLE and size in LARGE_SCALE_FLASH else "triton"


def mpt(size: str, seq_len: int) -> ModelConfig:
    d_model, heads, layers = MPT_SHAPES[size]
    return ModelConfig(f"mpt-{size}", "gpt2", 50368, layers, d_model, heads, heads,
                       4 * d_model, seq_len)


def llm_foundry_rows(path: Path = LLM_FOUNDRY_TABLES) -> list[HeldOutRun]:
    """One held-out run per row of every table in the copied README section."""
    runs, table = [], ""
    for line in path.read_text().splitlines():
        if line.startswith("## "):
            table = line[3:].strip()
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|") or not cells[1].isdigit():
            continue  # header and separator rows
        size, seq, gpus, gpu = cells[0], int(cells[1]), int(cells[2]), cells[3]
        # The A100 40GB table has no "Model TFLOP" column: read from the right-hand end.
        micro, accum = int(cells[-13]), int(cells[-12])
        tokens, precision, mode, sharding, checkpointing = (
            float(cells[-8]), cells[-6], cells[-5], cells[-4], cells[-3])
        name = f"MPT {size} {seq} x{gpus} {gpu} mb{micro}"
        runs.append(HeldOutRun(
            name, mpt(size, seq), LLM_FOUNDRY_GPUS[gpu], gpus, gpus, 1, 1, micro * accum, seq,
            "full" if checkpointing == "True" else "none", tokens, LLM_FOUNDRY,
            f"{table}, row {size} / {seq} / {gpus} GPUs / micro {micro} x {accum}",
            micro_batch=micro, zero=ZERO_OF_SHARDING[sharding], fsdp=True,
            attention_impl=llm_foundry_kernel(table, size),
            network=(("recompute_rerun", recompute_rerun(mode)),),
            **({"precision": "fp8", "fp8_recipe": "delayed"} if "fp8" in precision
               else {"precision": "bf16-fp32grad"} if fp32_reduce(table, mode)
               else {})))  # type: ignore[arg-type]
    return runs
