"""Published runs held out from every fitting of the planner: the fitted / held-out split.

FITTED: the planner's A100 efficiency factors (paraxis/plan/hardware.py) were tuned on the
Megatron-LM rows of validation/validate_planner.py (Narayanan et al. 2021 Tables 1-2, Korthikanti
et al. 2022 Table 5 and Sec. 6.3), so those rows are the fitted set and their errors say how
well the model fits, not how well it predicts.

HELD OUT: the rows below. This file was committed before any fitting commit that could see
them, and no factor may be tuned on them. Every row of every table used is listed; a row the
planner cannot price (a precision, compiler or parallelism it does not model) stays in the
list with the reason, so nothing is picked for fitting well. Figures are copied from the
sources as printed (tokens per second per GPU, or an iteration time where the source logs
one); conversion to step time uses the source's own convention (step = global batch x
sequence length / (tokens per second per GPU x GPUs)).

Sources: torchtitan (A100 and H100, FSDP2), MosaicML llm-foundry (A100 40/80 GB and H100,
FSDP; sequences to 64K), BigScience BLOOM-176B (A100, Megatron-DeepSpeed 3D) and the
FlashAttention repository's GPT-3 training table (A100, DDP / ZeRO-1). The second batch
(llm-foundry, BLOOM, FlashAttention) was added in one commit before any change to a fitted
parameter. NVIDIA's DGX Cloud benchmarking recipes (H100, NeMo / Megatron-Core: TP overlap,
distributed optimizer, interleaved pipelines, CP and an MoE; validation/heldout_dgxc.py) were
added in one commit before any change to the planner that could see them.
"""

from __future__ import annotations

from paraxis.plan.compute import model_flops_per_token
from paraxis.spec.model_config import PRESETS, ModelConfig
from validation.heldout_dgxc import dgxc_rows
from validation.heldout_llm_foundry import llm_foundry_rows
from validation.heldout_record import HeldOutRun

TORCHTITAN_A100 = ("torchtitan docs/performance.md at commit 0413364 (pytorch/torchtitan): "
                   "Llama 2 and Llama 3 with FSDP2 on 64 A100-80GB")
TORCHTITAN_H100 = ("torchtitan docs/performance.md at commit eaea6f6 (pytorch/torchtitan): "
                   "Llama 3.1 on H100 (96 GB HBM2e, 2.4 TB/s, 500 W power limit; 400 Gb/s "
                   "RDMA per GPU)")
COMPILE = ("torch.compile fuses the elementwise kernels of torchtitan's blocks: the planner "
           "models eager, Megatron-fused or paraxis's compiled blocks")
# Tables 5 and 6 name the schedule but not how many microbatches a step's pipeline ran.
PP_MICROBATCHES = "pipeline microbatches per step not stated: not priced as run"

# Runtime settings the cost model prices per source (plan/hardware.py), as each source ran
# them. Gradient buckets and the ZeRO parameter gather: PyTorch FSDP (torchtitan, llm-foundry,
# NeMo AutoModel, Llama 3's) reduces one wrapped block a call and gathers a block's
# parameters in its forward (`fsdp`, validate_heldout.cluster_for); DDP (FlashAttention's
# table) reduces in torch's default 25 MiB buckets; BLOOM's DeepSpeed below. TP overlap: only
# BLOOM and Llama 3 run TP among the priced bf16 rows; neither source states an overlap beyond
# the backward's, Megatron-LM's default of their time ("backward"); torchtitan's AsyncTP rows
# (Float8, validation/heldout_fp8.py) are its runtime's forward overlap ("all"). MoE
# dispatch: the priced EP rows have tp = 1 (AutoModel's DeepEP: `expert_dispatch`).


# torchtitan checkpoints blocks with PyTorch's non-reentrant checkpoint (parallelize_llama.py:
# CheckpointImpl.NO_REENTRANT at 0413364, checkpoint_wrapper's default at eaea6f6), whose
# rerun stops once the backward's tensors are rebuilt (`GPU.recompute_rerun`).
NON_REENTRANT = (("recompute_rerun", "needed"),)


# torchtitan's attention is PyTorch SDPA (torchtitan/models/llama/model.py:
# `F.scaled_dot_product_attention(xq, xk, xv, is_causal=True)`), whose CUDA flash backend is
# FlashAttention-2 since torch 2.2: "fa2".
def _a100(name: str, model: str, batch: int, seq: int, recompute: str, wps: float | None,
          where: str, **extra: object) -> HeldOutRun:
    return HeldOutRun(name, model, "a100", 64, 64, 1, 1, batch, seq, recompute, wps,
                      TORCHTITAN_A100, where, attention_impl="fa2", network=NON_REENTRANT,
                      **extra)  # type: ignore[arg-type]


# Float8 rows (torchao's float8 training at eab345c, torchtitan 9dec370, both named by the
# file's "Versions used" table): tensorwise dynamic scales, the only recipe torchtitan
# offered then (docs/float8.md at 9dec370), FSDP all-gathering FP8 weights as that file's
# launch command does (--float8.enable_fsdp_float8_all_gather). Every Float8 row also ran
# torch.compile, which the bf16 rows leave unpriced (COMPILE): the Float8 rows are priced
# with fused elementwise kernels standing in for it (validation/heldout_fp8.py prices their
# bf16 compile twins alike, to separate FP8's share of the error). torchtitan's TP shards
# the norms' sequence (SequenceParallel): sequence parallelism with tp > 1; its FP8
# all-gather of TP inputs is not modelled (priced at bf16's 2 bytes).
def _h100(name: str, model: str, gpus: int, dp: int, tp: int, pp: int, batch: int, seq: int,
          recompute: str, tps: float, where: str, unpriced: str = "",
          schedule: str = "1f1b", cp: int = 1, fp8: bool = False,
          async_tp: bool = False) -> HeldOutRun:
    return HeldOutRun(name, model, "h100-96gb", gpus, dp, tp, pp, batch, seq, recompute, tps,
                      TORCHTITAN_H100, where, unpriced, schedule=schedule, cp=cp,
                      attention_impl="fa2", sequence_parallel=fp8 and tp > 1,
                      network=NON_REENTRANT + ((("tp_comm_overlap", "all"),) if async_tp
                                               else ()),
                      **({"precision": "fp8", "fp8_weight_gather": True, "kernels": "fused"}
                         if fp8 else {}))  # type: ignore[arg-type]


# torchtitan's checkpointing (torchtitan/parallelisms/parallelize_llama.py at 0413364):
# "selective layer" (selective_ac_option = 2) wraps every second block in full
# checkpointing, priced as "layer-2"; "selective op" saves the outputs of every other
# matmul and of the attention kernel and recomputes the rest, priced as "op"
# (validation/validate_heldout.py prices both from paraxis's none and full); "full" is full.
TORCHTITAN = [
    _a100("Llama 3 8B, sel. layer", "llama3-8b", 1, 8192, "layer-2", 2904,
          "Llama 3 table, row 8B / selective layer (MFU 56.8%)"),
    _a100("Llama 3 8B, sel. op", "llama3-8b", 1, 8192, "op", 2973,
          "Llama 3 table, row 8B / selective op (MFU 58.2%)"),
    _a100("Llama 3 70B, full", "llama3-70b", 1, 8192, "full", 331,
          "Llama 3 table, row 70B / full (MFU 51.7%)"),
    _a100("Llama 2 13B, no AC", "llama2-13b", 2, 4096, "none", 2162,
          "Llama 2 table, row 13B / no (MFU 61.1%)"),
    _a100("Llama 2 13B, sel. layer", "llama2-13b", 2, 4096, "layer-2", 1914,
          "Llama 2 table, row 13B / selective layer (MFU 54.1%)"),
    _a100("Llama 2 13B, sel. op", "llama2-13b", 2, 4096, "op", 1904,
          "Llama 2 table, row 13B / selective op (MFU 53.8%)"),
    _a100("Llama 2 70B, sel. op", "llama2-70b", 1, 4096, "op", 355,
          "Llama 2 table, row 70B / 1 / selective op (MFU 50.8%)"),
    _a100("Llama 2 70B, full", "llama2-70b", 2, 4096, "full", 353,
          "Llama 2 table, row 70B / 2 / full (MFU 50.5%)"),
    _a100("Llama 2 70B, batch 2, sel. op", "llama2-70b", 2, 4096, "op", None,
          "Llama 2 table, footnote 1: local batch 2 with selective checkpointing is OOM",
          out_of_memory=True),
    # H100, Table 1 (8 GPUs) and Table 3 (128 GPUs): Llama 3.1 8B, FSDP, local batch 2,
    # "selective" checkpointing (captions): the op policy, train_configs/llama3_8b.toml default.
    _h100("Llama 3.1 8B FSDP x8", "llama3-8b", 8, 8, 1, 1, 2, 8192, "op", 5762,
          "Table 1, row FSDP"),
    _h100("Llama 3.1 8B FSDP x8 compile", "llama3-8b", 8, 8, 1, 1, 2, 8192, "op", 6667,
          "Table 1, row FSDP + torch.compile", COMPILE),
    _h100("Llama 3.1 8B FSDP x8 compile fp8", "llama3-8b", 8, 8, 1, 1, 2, 8192, "op",
          8532, "Table 1, row FSDP + torch.compile + Float8", fp8=True),
    _h100("Llama 3.1 8B FSDP x128", "llama3-8b", 128, 128, 1, 1, 2, 8192, "op", 5605,
          "Table 3, row FSDP"),
    _h100("Llama 3.1 8B FSDP x128 compile", "llama3-8b", 128, 128, 1, 1, 2, 8192, "op",
          6514, "Table 3, row FSDP + torch.compile", COMPILE),
    _h100("Llama 3.1 8B FSDP x128 compile fp8", "llama3-8b", 128, 128, 1, 1, 2, 8192,
          "op", 8380, "Table 3, row FSDP + torch.compile + Float8", fp8=True),
    # Table 2: FSDP + CP + compile + Float8, 8B, local batch 1, full checkpointing.
    _h100("Llama 3.1 8B CP1 32K", "llama3-8b", 8, 8, 1, 1, 1, 32768, "full", 3890,
          "Table 2, row FSDP 8, CP 1", fp8=True),
    _h100("Llama 3.1 8B CP2 64K", "llama3-8b", 8, 4, 1, 1, 1, 65536, "full", 2540,
          "Table 2, row FSDP 4, CP 2", fp8=True, cp=2),
    _h100("Llama 3.1 8B CP4 128K", "llama3-8b", 8, 2, 1, 1, 1, 131072, "full", 1071,
          "Table 2, row FSDP 2, CP 4", fp8=True, cp=4),
    _h100("Llama 3.1 8B CP8 256K", "llama3-8b", 8, 1, 1, 1, 1, 262144, "full", 548,
          "Table 2, row FSDP 1, CP 8", fp8=True, cp=8),
    # Table 4: 70B, FSDP 32 x TP 8, local batch 16, full checkpointing, compile + Float8
    # (its caption: both rows).
    _h100("Llama 3.1 70B 2D", "llama3-70b", 256, 32, 8, 1, 16, 8192, "full", 829,
          "Table 4, row 2D", fp8=True),
    # AsyncTP pipelines the TP collectives with the GEMMs, forward too: tp_comm_overlap "all"
    _h100("Llama 3.1 70B 2D AsyncTP", "llama3-70b", 256, 32, 8, 1, 16, 8192, "full", 876,
          "Table 4, row 2D + AsyncTP", fp8=True, async_tp=True),
    # Table 5: 405B, FSDP 8 x TP 8 x PP 8, local batch 32, global 256, full checkpointing,
    # "+ torch.compile + Float8 + AsyncTP" (its caption).
    _h100("Llama 3.1 405B 3D 1F1B", "llama3-405b", 512, 8, 8, 8, 32, 8192, "full", 100,
          "Table 5, row 1F1B", PP_MICROBATCHES, fp8=True, async_tp=True),
    _h100("Llama 3.1 405B 3D interleaved", "llama3-405b", 512, 8, 8, 8, 32, 8192, "full", 128,
          "Table 5, row Interleaved 1F1B", PP_MICROBATCHES, fp8=True, async_tp=True,
          schedule="interleaved"),
    # Table 6: 405B, TP 8 x PP 8, local batch 8, full checkpointing, 1F1B; "+ torch.compile +
    # Float8 + AsyncTP" (its caption).
    _h100("Llama 3.1 405B 4D CP1 32K", "llama3-405b", 512, 8, 8, 8, 8, 32768, "full", 76,
          "Table 6, row FSDP 8, CP 1", PP_MICROBATCHES, fp8=True, async_tp=True),
    _h100("Llama 3.1 405B 4D CP2 64K", "llama3-405b", 512, 4, 8, 8, 8, 65536, "full", 47,
          "Table 6, row FSDP 4, CP 2", PP_MICROBATCHES, fp8=True, async_tp=True, cp=2),
    _h100("Llama 3.1 405B 4D CP4 128K", "llama3-405b", 512, 2, 8, 8, 8, 131072, "full", 31,
          "Table 6, row FSDP 2, CP 4", PP_MICROBATCHES, fp8=True, async_tp=True, cp=4),
    _h100("Llama 3.1 405B 4D CP8 256K", "llama3-405b", 512, 1, 8, 8, 8, 262144, "full", 16,
          "Table 6, row FSDP 1, CP 8", PP_MICROBATCHES, fp8=True, async_tp=True, cp=8),
]


# ----------------------------------------------------------------------------------------- BLOOM
# BigScience's BLOOM-176B (Megatron-DeepSpeed, 384 A100-80GB on Jean Zay): TP 4 x PP 12 x DP 8,
# micro-batch 2, global batch 2048 x 2048 tokens, Megatron's fused kernels and fused softmax
# (scores kept), DeepSpeed activation checkpointing of every layer, ZeRO stage 1 (BF16
# optimizer), DeepSpeed's non-interleaved 1F1B pipeline; 4 Omni-Path links (100 Gb/s each) per
# node. The logged line of the first epoch's end gives 104.70 s per iteration. Its DeepSpeed
# config states only ZeRO stage 1: DeepSpeed's default gradient bucket of the time
# (reduce_bucket_size 5e8 elements, 16-bit: 1e9 bytes) and its parameter all-gather after the
# step (`param_gather_overlap` False). Megatron-DeepSpeed of 2022 had no TP communication
# overlap beyond the backward's (`tp_comm_overlap` "backward").
BLOOM = ("bigscience-workshop/bigscience train/tr11-176B-ml/README.md at commit 00327f8: "
         "BLOOM 176B training")
BLOOM_MODEL = ModelConfig("bloom-176b", "gpt2", 250880, 70, 14336, 112, 112, 4 * 14336, 2048)
BLOOM_RUN = HeldOutRun(
    "BLOOM 176B", BLOOM_MODEL, "a100", 384, 8, 4, 12, 2048 // 8, 2048, "full",
    2048 * 2048 / 104.70 / 384, BLOOM,
    "sections Replica setup, Important checkpoints (iteration 85376: 104.70 s, 149.77 TFLOPs)",
    micro_batch=2, zero=1, kernels="fused", attention_kernel="math",
    network=(("nics_per_node", 4), ("inter_node_bandwidth_Bps", 12.5e9),
             ("gradient_bucket_bytes", 5e8 * 2)))

# ------------------------------------------------------------------------------ FlashAttention
# Dao-AILab/flash-attention training/README.md, the table "Training speed" (8 x A100 80GB SXM4,
# NVLink, one node): GPT-3 shapes at seq 2048, bf16, FlashAttention, fused MLP / bias / dropout-
# add-LayerNorm kernels, no activation checkpointing; per-GPU batch and strategy from the
# experiment and model configs (training/configs/experiment/pile/*.yaml, model/gpt2model/*.yaml:
# GPT-2 small / medium for 125M / 355M, transformers' GPT2Config otherwise; DDP for
# 125M/355M, DDP + ZeRO-1 optimizer for 760M and up; A100-80GB picks the largest batch option).
# Throughput is tokens/s of the 8 GPUs together.
# The kernel is FlashAttention v1 ("fa1"): the README's "up to 189 TFLOPs/sec per A100" and its
# 1.3B row (169k tokens/s over 8 GPUs x 8.9 GFLOP a token, Narayanan's count: 188 TFLOP/s) are
# the FlashAttention column of the FlashAttention-2 paper's Table 1 (1.3B at 2k: 189 with
# FlashAttention, 196 with FlashAttention-2), so the table predates FlashAttention-2.
FLASH = ("Dao-AILab/flash-attention training/README.md and training/configs/experiment/pile at "
         "commit 0b037c2: GPT-3 models on 8 A100-80GB")


def _gpt3(name: str, d_model: int, heads: int, layers: int, micro: int, global_batch: int,
          zero: int, tokens_8_gpus: float) -> HeldOutRun:
    cfg = ModelConfig(name, "gpt2", 50264, layers, d_model, heads, heads, 4 * d_model, 2048)
    return HeldOutRun(name, cfg, "a100", 8, 8, 1, 1, global_batch // 8, 2048, "none",
                      tokens_8_gpus / 8, FLASH, f"Training speed table, row {name}",
                      micro_batch=micro, zero=zero, kernels="fused", attention_impl="fa1")


FLASH_RUNS = [
    _gpt3("GPT3-125M", 768, 12, 12, 32, 256, 0, 1310e3),
    _gpt3("GPT3-355M", 1024, 16, 24, 16, 256, 0, 503e3),
    _gpt3("GPT3-760M", 1536, 16, 24, 16, 256, 1, 245e3),
    _gpt3("GPT3-1.3B", 2048, 16, 24, 8, 512, 1, 169e3),
    _gpt3("GPT3-2.7B", 2560, 20, 32, 4, 512, 1, 85e3),
]

# ------------------------------------------------------------------------------------ Llama 3
# Dubey et al. 2024, The Llama 3 Herd of Models (arXiv:2407.21783), Sec. 3.3.2 and Table 4:
# Llama 3 405B pre-training on H100-80GB (700 W, HBM3), 8 per server on NVLink, 400 Gb/s RoCE
# per GPU (Sec. 3.3.1). Every row of Table 4. What the paper states: TP 8, PP 16, the CP and DP
# degrees, sequence length, batch per DP group, 16M tokens per batch, TFLOPs per GPU and BF16
# MFU; FSDP that shards optimizer states and gradients but keeps the weights gathered from
# forward to backward (ZeRO-2); fp32 gradient accumulation and fp32 reduce-scatter
# (bf16-fp32grad); all-gather CP (K and V gathered, then attention for the local queries) on
# the zig-zag split (rank i holds chunks i and 2CP-1-i); an interleaved schedule whose depth
# V it does not give, with one layer fewer on the first and the last stage (126 = 7 + 14 x 8
# + 7: the split paraxis's partition makes, embedding first and head last); no activation
# checkpointing at 8K. Not stated, priced as: one sequence per microbatch, sequence
# parallelism with TP, fused elementwise kernels, a flash attention kernel, no checkpointing
# at 128K either (CP 16 leaves each rank the 8K rows' 8,192 tokens), and V picked by the
# planner (the fastest that fits of 1, 2, 4, 8). Table 4 prints DP 4 for the 131,072 row in
# the arXiv v1 HTML; 8 x 16 x 16 x DP = 16,384 GPUs and DP x 16 x 131,072 = 16M tokens both
# need DP 8, as the later versions print it.
# The table gives TFLOPs per GPU, not tokens: the MFU it cites is PaLM's (Chowdhery et al.),
# the full attention square (causal=False), which 380 / 989 = 38% confirms against the H100's
# dense bf16 peak; the tokens per second per GPU below are those TFLOPs over that count.
LLAMA3 = ("Dubey et al. 2024, The Llama 3 Herd of Models (arXiv:2407.21783): Llama 3 405B "
          "pre-training on H100-80GB")


def _llama3(name: str, gpus: int, cp: int, dp: int, seq: int, batch_per_dp: int,
            tflops: float, mfu: str) -> HeldOutRun:
    per_token = model_flops_per_token(PRESETS["llama3-405b"], seq, causal=False)
    return HeldOutRun(
        name, "llama3-405b", "h100", gpus, dp, 8, 16, batch_per_dp, seq, "none",
        tflops * 1e12 / per_token, LLAMA3,
        f"Table 4, row {gpus:,} GPUs / CP {cp} / DP {dp} / seq {seq:,} ({tflops:.0f} "
        f"TFLOPs/GPU, BF16 MFU {mfu})", micro_batch=1, zero=2, kernels="fused", cp=cp,
        cp_attention="all_gather", sequence_parallel=True, virtual_stages=0,
        precision="bf16-fp32grad", fsdp=True,
        network=(("pipeline_zero2_reduce", "microbatch"),))


LLAMA3_RUNS = [
    _llama3("Llama 3 405B 8K x8192", 8192, 1, 64, 8192, 32, 430, "43%"),
    _llama3("Llama 3 405B 8K x16384", 16384, 1, 128, 8192, 16, 400, "41%"),
    _llama3("Llama 3 405B 128K CP16", 16384, 16, 8, 131072, 16, 380, "38%"),
]

# ------------------------------------------------------------------------------ NeMo, long seq.
# NVIDIA/NeMo docs/source/performance/performance_long_sequence.md at commit 8cfedd7, table
# "LLAMA2-7B (FP8) - H100" (NeMo 24.03.01, DGX-H100): the "With CP" columns, every row. FP8
# throughout (Transformer Engine, delayed scaling: "delayed"); NVIDIA's other published
# CP > 1 rows (the same file's B200 table, Megatron-Bridge docs/performance-summary*.md on
# H100) are FP8 too. TFLOPS per GPU are converted to tokens with the full attention square
# (Megatron-LM's count before March 2025; the file does not say which count it used). The
# table states neither the micro-batch, nor checkpointing, nor optimizer sharding, so none
# is priced as it ran.
NEMO_LONG = ("NVIDIA/NeMo docs/source/performance/performance_long_sequence.md at commit "
             "8cfedd7: Llama 2 7B with context parallelism on DGX-H100 (FP8)")
UNSTATED = "micro-batch, checkpointing and optimizer sharding not stated: not priced as run"


def _nemo(seq_k: int, gpus: int, batch: int, tp: int, pp: int, dp: int, cp: int,
          tflops: float) -> HeldOutRun:
    seq = seq_k * 1024
    per_token = model_flops_per_token(PRESETS["llama2-7b"], seq, causal=False)
    return HeldOutRun(
        f"Llama 2 7B {seq_k}K CP{cp}", "llama2-7b", "h100", gpus, dp, tp, pp, batch // dp,
        seq, "not stated", tflops * 1e12 / per_token, NEMO_LONG,
        f"LLAMA2-7B (FP8) - H100, row {seq_k}K / {gpus} GPUs / TP {tp} PP {pp} DP {dp} CP {cp}"
        f" ({tflops:g} TFLOPS/GPU)", UNSTATED, cp=cp, sequence_parallel=tp > 1,
        micro_batch=-1, zero=-1, precision="fp8", fp8_recipe="delayed")


NEMO_RUNS = [
    _nemo(4, 4, 1024, 1, 1, 4, 1, 768), _nemo(8, 8, 512, 1, 2, 4, 1, 730),
    _nemo(16, 16, 256, 2, 1, 8, 1, 660), _nemo(32, 32, 128, 2, 1, 8, 2, 610),
    _nemo(64, 64, 64, 4, 1, 8, 2, 574), _nemo(128, 128, 32, 4, 1, 8, 4, 555),
    _nemo(256, 256, 16, 4, 1, 8, 8, 549), _nemo(512, 512, 8, 8, 1, 4, 16, 549),
    _nemo(1024, 1024, 4, 8, 1, 4, 32, 536),
]

# --------------------------------------------------------------------------- NeMo AutoModel
# The pre-training table of NVIDIA-NeMo/Automodel docs/performance-summary.md (DGX-H100, BF16,
# PyTorch FSDP2 with TE kernels): every row, the mixtures of experts priced with the ep the
# table gives. The DeepSeek V3 rows' configs (examples/llm_benchmark/deepseek/
# deepseek_v3_te_deepep.yaml and _1024.yaml): the HF DeepSeek-V3 shape, a forced-balanced
# gate (`fake_balanced_gate: true`, so an imbalance of 1), interleaved 1F1B with pipeline
# microbatches of 1 sequence, activation checkpointing, FSDP2
# with `enable_fsdp_optimizations`: under pipelines every backward but the step's last skips
# the gradient sync and keeps the parameters gathered (nemo_automodel/components/moe/
# fsdp_mixin.py), one reduce-scatter per step with optimizer states sharded: ZeRO-1; that
# reduce-scatter is one call per block, as fully_shard wraps each block
# (parallel/experts/parallelizer.py,
# apply_fsdp): fsdp=True.
# The 1024-GPU config as first committed (examples/benchmark/configs/
# deepseek_v3_te_deepep_1024.yaml at 2c236e08, 2025-10-08, two days after the table's
# 89e3a9f) checkpoints activations, as the 256-GPU one does; the refactor 194103bf
# (2026-02-12) dropped the key with the MoE config section it sat in, and 5e0ccc1 later cut
# its local batch from 8 to 4 "to reduce DeepSeek 1024 benchmark pressure". So the
# 1024-GPU row is priced as it was published, with checkpointing.
# The table's columns: GBS, MBS, LBS, GA, TP, PP, CP, EP, VP, FSDP.
AUTOMODEL = ("NVIDIA-NeMo/Automodel docs/performance-summary.md at commit e458120 "
             "(examples/llm_benchmark configs at the same commit; the DeepSeek V3 1024-GPU "
             "config as first committed, 2c236e08): pre-training on DGX-H100, BF16")
HYBRID = "a hybrid Mamba-Transformer: state-space layers are not modelled"
HEAD_WIDTH = "heads x head size differ from d_model (ModelConfig ties them): not modelled"


def _automodel(name: str, model: str | ModelConfig, gpus: int, dp: int, pp: int, ep: int,
               local_batch: int, seq: int, recompute: str, tps: float, unpriced: str = "",
               virtual: int = 1, cp: int = 1) -> HeldOutRun:
    zero = 1 if pp > 1 else 3  # FSDP2 (see above)
    # "TE + DeepEP" (the table's kernel column): DeepEP's normal kernels send a token once per
    # destination node over RDMA and forward it over NVLink (Cluster.expert_dispatch)
    network = (("expert_dispatch", "per_node"),) if ep > 1 else ()
    return HeldOutRun(name, model, "h100", gpus, dp, 1, pp, local_batch, seq, recompute, tps,
                      AUTOMODEL, f"Pre-Training Performance table, row {name}", unpriced,
                      schedule="interleaved" if virtual > 1 else "1f1b", micro_batch=1,
                      zero=zero, kernels="fused", cp=cp, ep=ep, virtual_stages=virtual,
                      expert_imbalance=1.0, fsdp=True, network=network)


AUTOMODEL_RUNS = [
    _automodel("Nemotron V3 Super 120B (26.02) x64 EP64", "mixtral-8x7b", 64, 64, 1, 64, 8,
               4096, "none", 4497, HYBRID),
    _automodel("Nemotron V3 Nano 30B (26.02) x8 EP8", "mixtral-8x7b", 8, 8, 1, 8, 64, 4096,
               "none", 16789, HYBRID),
    _automodel("DeepSeek V3 671B x1024 EP64", "deepseek-v3-style", 1024, 256, 4, 64, 32, 4096,
               "full", 865, virtual=8),
    _automodel("DeepSeek V3 671B x256 EP64", "deepseek-v3-style", 256, 64, 4, 64, 8, 4096,
               "full", 1002, virtual=8),
    _automodel("Kimi K2 x256 EP32", "deepseek-v3-style", 256, 32, 8, 32, 16, 4096, "full", 924,
               "multi-head latent attention with 64 heads: plain attention at d_model 7168 "
               "would double its parameters (DeepSeek V3's 128 heads come within 10%)",
               virtual=4),
    _automodel("Qwen3 MoE 30B x8 EP8", "mixtral-8x7b", 8, 8, 1, 8, 64, 4096, "none", 12040,
               HEAD_WIDTH),
    _automodel("GPT-OSS 20B x8", "mixtral-8x7b", 8, 8, 1, 1, 32, 4096, "none", 13058,
               HEAD_WIDTH + "; attention sinks and sliding windows (FlexAttention)"),
    _automodel("GPT-OSS 120B x64", "mixtral-8x7b", 64, 64, 1, 1, 8, 4096, "none", 7626,
               HEAD_WIDTH + "; attention sinks and sliding windows (FlexAttention)"),
    # dense, context-parallel: the config's mock vocabulary of 100 tokens
    _automodel("Llama3 70B x64 CP2", PRESETS["llama3-70b"].replace(vocab_size=100), 64, 32, 1,
               1, 4, 8192, "full", 866.77, cp=2),
]

# ----------------------------------------------------------------------------- DeepSeek-V3
# DeepSeek-AI 2024, DeepSeek-V3 Technical Report (arXiv:2412.19437): "each trillion tokens
# requires only 180K H800 GPU hours" on 2048 H800s (Sec. 1), i.e. 1e12 / (180e3 x 3600)
# tokens per second per GPU; PP16, EP64 over 8 nodes, ZeRO-1 data parallelism (Sec. 3.2);
# 4K tokens, batch 15360 after its ramp-up (Sec. 4.2). FP8 GEMMs with fine-grained scales
# (Sec. 3.3: 1 x 128 tiles of activations, 128 x 128 blocks of weights, promoted to fp32 on
# CUDA cores every 128 elements of k) on H800s: neither the recipe nor the GPU is modelled.
DEEPSEEK_V3 = "DeepSeek-AI 2024, DeepSeek-V3 Technical Report (arXiv:2412.19437)"
DEEPSEEK_V3_RUN = HeldOutRun(
    "DeepSeek-V3 pre-training x2048 EP64", "deepseek-v3-style", "h800", 2048, 128, 1, 16,
    15360 // 128, 4096, "none", 1e12 / (180e3 * 3600), DEEPSEEK_V3,
    "Sec. 1 (180K H800 GPU hours per trillion tokens), Sec. 3.2 (PP16, EP64, ZeRO-1), Sec. 4.2",
    "fine-grained FP8 scaling (Sec. 3.3) on H800s: a recipe and a GPU the planner does not "
    "model", zero=1, ep=64, precision="fp8")

HELD_OUT = (TORCHTITAN + llm_foundry_rows() + [BLOOM_RUN] + FLASH_RUNS + LLAMA3_RUNS
            + NEMO_RUNS + AUTOMODEL_RUNS + [DEEPSEEK_V3_RUN] + dgxc_rows())
