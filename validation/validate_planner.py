"""Predicted vs published throughput of large published runs: writes docs/validation.md.

    python -m validation            # rewrite docs/validation.md
    python -m validation --check    # also exit 1 if any run is off by > 20%
    python -m validation.validate_planner [--check]    # the same

Each run is priced with its published (tp, pp, dp), recomputation, sequence parallelism and
batch (and microbatch size and interleaving where the paper gives them); the planner only
chooses what the paper leaves open by its own ranking. The only calibration is the A100
preset's efficiency factors (paraxis/plan/hardware.py), the same for every run.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

from paraxis.plan.compute import iteration_flops
from paraxis.plan.cost import Overlap
from paraxis.plan.hardware import build_cluster
from paraxis.plan.search import Constraints, search
from paraxis.spec.model_config import ModelConfig
from validation.heldout_findings import HELD_OUT_FINDINGS, abs_percentile, largest_error_lines
from validation.heldout_fp8 import fp8_runs, fp8_section
from validation.heldout_llm_foundry import LLM_FOUNDRY
from validation.heldout_runs import (
    AUTOMODEL,
    BLOOM,
    DEEPSEEK_V3,
    FLASH,
    HELD_OUT,
    LLAMA3,
    NEMO_LONG,
    TORCHTITAN_A100,
    TORCHTITAN_H100,
)
from validation.heldout_search import record_line, search_lines
from validation.heldout_twins import twin_lines
from validation.korthikanti_table4 import table_4_errors
from validation.validate_heldout import (
    bound_lines,
    error_stats,
    gemm_lines,
    kernel_lines,
    llama3_lines,
    moe_findings,
    render_held_out,
    switch_lines,
)

NARAYANAN = ("Narayanan et al. 2021, Efficient Large-Scale Language Model Training on GPU "
             "Clusters Using Megatron-LM (SC'21, arXiv:2104.04473)")
KORTHIKANTI = ("Korthikanti et al. 2022, Reducing Activation Recomputation in Large "
               "Transformer Models (arXiv:2205.05198)")
SHORT = {NARAYANAN: "Narayanan 2021", KORTHIKANTI: "Korthikanti 2022"}


@dataclass(frozen=True)
class Run:
    name: str
    heads: int
    hidden: int
    layers: int
    tp: int
    pp: int
    gpus: int
    global_batch: int
    published: float  # per-GPU TFLOP/s (tflops_hw) or seconds per iteration (iteration_s)
    metric: str  # "tflops_hw" or "iteration_s"
    recompute: str
    source: str
    where: str  # table and row (or section) of the source the figures come from
    sequence_parallel: bool = False
    micro_batch: int | None = None  # None: the paper leaves it open, the planner picks
    virtual_stages: int | None = None  # None: open; 1: plain 1F1B; >1: interleaved
    dp_overlap: bool = True  # False where the paper says the gradient all-reduce is exposed
    seq_len: int = 2048
    vocab: int = 51200


def _table1(name, heads, hidden, layers, tp, pp, gpus, batch, tflops) -> Run:
    # Sec. 5.1: interleaved schedule, full recomputation (eq. 3 counts its FLOPs), no ZeRO.
    return Run(name, heads, hidden, layers, tp, pp, gpus, batch, tflops, "tflops_hw", "full",
               NARAYANAN, f"Table 1, row {name.split()[-1]}")


def _table2(name, heads, hidden, layers, pp, gpus, batch, tflops) -> Run:
    # "PTD Parallelism" rows: model-parallel size t*p with t = 8 (Sec. 4.1), microbatch 1.
    return Run(name, heads, hidden, layers, 8, pp, gpus, batch, tflops, "tflops_hw", "full",
               NARAYANAN, f"Table 2, PTD row {name.split()[1]} on {gpus} GPUs", micro_batch=1)


def _korthikanti(name, heads, hidden, layers, pp, gpus, batch, micro, v, seconds, present,
                 where, dp_overlap=True) -> Run:
    # Table 3 shapes (tp = 8); Table 5: "present work" = sequence parallelism + selective
    # recomputation, "full recompute" = the tensor-parallel baseline with full recomputation.
    return Run(name, heads, hidden, layers, 8, pp, gpus, batch, seconds, "iteration_s",
               "selective" if present else "full", KORTHIKANTI, where,
               sequence_parallel=present, micro_batch=micro, virtual_stages=v,
               dp_overlap=dp_overlap)


RUNS = [
    # GPT models on DGX A100-80GB (Selene), seq 2048, vocab 51200, full recomputation.
    _table1("GPT 1.7B", 24, 2304, 24, 1, 1, 32, 512, 137),
    _table1("GPT 3.6B", 32, 3072, 30, 2, 1, 64, 512, 138),
    _table1("GPT 7.5B", 32, 4096, 36, 4, 1, 128, 512, 142),
    _table1("GPT 18.4B", 48, 6144, 40, 8, 1, 256, 1024, 135),
    _table1("GPT 39.1B", 64, 8192, 48, 8, 2, 512, 1536, 138),
    _table1("GPT 76.1B", 80, 10240, 60, 8, 4, 1024, 1792, 140),
    _table1("GPT 145.6B", 96, 12288, 80, 8, 8, 1536, 2304, 148),
    _table1("GPT 310.1B", 128, 16384, 96, 8, 16, 1920, 2160, 155),
    _table1("GPT 529.6B", 128, 20480, 105, 8, 35, 2520, 2520, 163),
    _table1("GPT 1008B", 160, 25600, 128, 8, 64, 3072, 3072, 163),
    # Strong scaling at a fixed batch: more data-parallel replicas, fewer microbatches each.
    _table2("GPT-3 174.6B x384", 96, 12288, 96, 12, 384, 1536, 153),
    _table2("GPT-3 174.6B x768", 96, 12288, 96, 12, 768, 1536, 149),
    _table2("GPT-3 174.6B x1536", 96, 12288, 96, 12, 1536, 1536, 141),
    _table2("GPT 529.6B x560", 128, 20480, 105, 35, 560, 2240, 171),
    _table2("GPT 529.6B x1120", 128, 20480, 105, 35, 1120, 2240, 167),
    _table2("GPT 529.6B x2240", 128, 20480, 105, 35, 2240, 2240, 159),
    # Data-parallel size 1; interleaving v = 3 for 175B and 530B (Sec. 6), none for 1T.
    _korthikanti("GPT 22B full recompute", 64, 6144, 48, 1, 8, 4, 4, 1, 1.42, False,
                 "Table 5, row 22B, full recompute"),
    _korthikanti("GPT 22B SP + selective", 64, 6144, 48, 1, 8, 4, 4, 1, 1.10, True,
                 "Table 5, row 22B, present work"),
    _korthikanti("GPT 175B full recompute", 96, 12288, 96, 8, 64, 64, 1, 3, 18.13, False,
                 "Table 5, row 175B, full recompute"),
    _korthikanti("GPT 175B SP + selective", 96, 12288, 96, 8, 64, 64, 1, 3, 13.75, True,
                 "Table 5, row 175B, present work"),
    _korthikanti("GPT 530B full recompute", 128, 20480, 105, 35, 280, 280, 1, 3, 49.05, False,
                 "Table 5, row 530B, full recompute"),
    _korthikanti("GPT 530B SP + selective", 128, 20480, 105, 35, 280, 280, 1, 3, 37.83, True,
                 "Table 5, row 530B, present work"),
    _korthikanti("GPT 1T full recompute", 160, 25600, 128, 64, 512, 512, 1, 1, 94.42, False,
                 "Table 5, row 1T, full recompute"),
    _korthikanti("GPT 1T SP + selective", 160, 25600, 128, 64, 512, 512, 1, 1, 71.49, True,
                 "Table 5, row 1T, present work"),
    # Sec. 6.3: the 530B run on 8 replicas, gradient all-reduce not overlapped.
    _korthikanti("GPT 530B SP + sel. dp=8", 128, 20480, 105, 35, 2240, 2240, 1, 3, 39.15, True,
                 "Sec. 6.3 (530B on 2240 GPUs, MFU 54.2%)", dp_overlap=False),
]


def predict(run: Run) -> tuple[float, str]:
    cfg = ModelConfig(run.name, "gpt2", run.vocab, run.layers, run.hidden, run.heads,
                      run.heads, 4 * run.hidden, run.seq_len)
    # Megatron-LM 2021-22 ran the math attention kernel (fused softmax, scores kept)
    cluster = build_cluster("a100-80gb", run.gpus, 8, {"attention_kernel": "math"})
    dp = run.gpus // (run.tp * run.pp)
    schedules: tuple[str, ...] = ("1f1b", "interleaved")
    virtual: tuple[int, ...] | None = None  # the planner's own choice of depth
    if run.pp > 1 and run.virtual_stages is not None:
        schedules = ("1f1b",) if run.virtual_stages == 1 else ("interleaved",)
        virtual = (run.virtual_stages,)
    elif run.pp > 1 and run.source == NARAYANAN:
        schedules = ("interleaved",)  # Sec. 5.1: the interleaved schedule throughout
    # Neither paper shards the optimizer (Megatron's distributed optimizer came later).
    constraints = Constraints(tp=run.tp, pp=run.pp, dp=dp, zero=0, recompute=(run.recompute,),
                              sequence_parallel=(run.sequence_parallel,), schedules=schedules,
                              virtual_stages=virtual, micro_batch=run.micro_batch)
    overlap = Overlap(dp=run.dp_overlap)
    result = search(cfg, cluster, run.seq_len, run.global_batch, constraints, overlap=overlap)
    ranked = result.ranked or [r.estimate for r in result.too_big if r.estimate]
    best = ranked[0]
    if run.metric == "iteration_s":
        value = best.step_time_s
    else:
        # the paper's eq. 3: full recomputation counted, the full attention square (not the
        # causal half the planner's own MFU and HFU count, plan/compute.py)
        flops = iteration_flops(cfg, run.seq_len, run.global_batch, run.recompute,
                                causal=False)["hardware"]
        value = flops / (best.step_time_s * run.gpus) / 1e12
    note = "" if best.fits else " (does not fit in the model)"
    return value, f"{best.layout}{note}"


def render() -> tuple[str, float]:
    lines = [
        "# Planner validation: predicted vs published",
        "",
        "Generated by `python -m validation` (do not edit by hand). Every run is",
        "priced with its published tensor/pipeline/data degrees, recomputation, sequence",
        "parallelism, global batch and (where the paper gives them) microbatch size and",
        "interleaving, on the `a100-80gb` preset (DGX A100: 8 GPUs per node on NVLink, 8 x",
        "200 Gb/s HDR InfiniBand per node = 25 GB/s per GPU, as on Selene where both papers",
        "ran). The planner picks only what a paper leaves open (microbatch size and",
        "interleaving depth for Narayanan 2021 Table 1). Neither paper shards the optimizer,",
        "so every run is priced with ZeRO off, and with the attention kernel Megatron-LM ran",
        "then (`attention_kernel = \"math\"`: fused softmax, scores kept for backward).",
        "",
        "Calibration: the A100 preset's physical efficiency factors, shared by every run",
        "and every layout the planner ranks: `matmul_efficiency` and `gemm_half_width` (the",
        "fraction of the 312 TFLOP/s bf16 peak a GEMM reaches, by the width of its narrower",
        "side per GPU), `link_efficiency` (achieved NCCL bus",
        "bandwidth / link bandwidth) and `hbm_efficiency` (achieved / datasheet HBM bandwidth",
        "in memory-bound kernels). No per-run factor exists. Error = predicted / published",
        "- 1: for an iteration time a positive error means the planner predicts a slower run.",
        "",
        "## Fitted rows: the Megatron-LM runs the A100 factors were tuned on",
        "",
        "| run | source (table, row) | tp | pp | dp | GPUs | batch | metric | published | "
        "predicted | error | planner's layout |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    worst = 0.0
    errors = []
    for run in RUNS:
        value, layout = predict(run)
        error = value / run.published - 1
        errors.append(abs(error))
        worst = max(worst, abs(error))
        if run.metric == "iteration_s":
            metric, fmt = "iteration time (s)", (lambda x: f"{x:.2f}")
        else:
            metric, fmt = "TFLOP/s per GPU (with recompute)", (lambda x: f"{x:.0f}")
        dp = run.gpus // (run.tp * run.pp)
        lines.append(f"| {run.name} | {SHORT[run.source]}, {run.where} | {run.tp} | {run.pp} | "
                     f"{dp} | {run.gpus} | {run.global_batch} | {metric} | "
                     f"{fmt(run.published)} | {fmt(value)} | {error:+.1%} | `{layout}` |")
    mean = sum(errors) / len(errors)
    fitted = errors + [abs(e) for e in table_4_errors(Overlap())]
    fit_rms = math.sqrt(sum(e * e for e in fitted) / len(fitted))
    lines += [
        "", f"{len(RUNS)} runs. Largest error: {worst:.1%}; mean absolute error: {mean:.1%} "
        "(target: within 20% on each run).", "",
        "The fit (`python -m validation.fit_gemm`, on these rows and Korthikanti 2022 "
        "Table 4 only):",
        "a GEMM whose narrower side per GPU is w reaches 0.70 x w / (w + 192) of the bf16",
        "peak, so narrow GEMMs (small models, or wide ones split over TP = 8) run slower;",
        f"rms error {fit_rms:.2%} over the {len(fitted)} fitted measurements. The command's",
        "grid is flat around it: its best and the best single efficiency are within a few",
        "tenths of a point. The data barely call for the shape term, and the held-out rows below",
        "come out worse with it (mean |error| 14.7%) than with the former single 0.65",
        "(13.3%, this file before the fit commit): the shape of the GEMM is not what the",
        "planner misses on those runs.",
        "The 1T runs of Korthikanti use the plain 1F1B schedule (interleaving is stated",
        "only for 175B and 530B, Sec. 6), whose 11% bubble the planner charges in full.", "",
        "Sources (each figure above was checked against the paper's own table or section):", "",
        f"- {NARAYANAN}: Table 1 (weak scaling; per-GPU TFLOP/s counted by eq. 3, which "
        "includes the recomputed forward) and Table 2 (PTD Parallelism rows; the paper gives "
        "the model-parallel size t*p = 96 and 280, t = 8 throughout (Sec. 4.1) and microbatch 1; "
        "recomputation is not stated for Table 2 and is priced as in Table 1, full).",
        f"- {KORTHIKANTI}: Table 3 (shapes, tp = 8, global and micro batch sizes, no data "
        "parallelism), Sec. 6 (interleaving depth 3 for 175B and 530B), Table 5 (iteration "
        "times: full recompute baseline and sequence parallelism + selective recomputation; "
        "MFU 41.5 / 51.4 / 56.0 / 56.3%) and Sec. 6.3 (530B on 2240 GPUs, 39.15 s, no "
        "overlap of the gradient all-reduce).",
        "",
        "Per-layer check: Korthikanti 2022 Table 4 (one 22B layer, tp = 8, microbatch 4: "
        "forward 7.7 ms, backward 11.9 ms without recomputation) is reproduced by the same "
        "model in `tests/test_plan_validation.py`; it is the evidence that Megatron hides the "
        "backward's TP collectives behind the weight-gradient GEMMs (Sec. 6.2).",
        "",
    ]
    lines += held_out_section(errors)
    return "\n".join(lines), worst


def held_out_section(fitted_errors: list[float]) -> list[str]:
    """The held-out runs (validation/heldout_runs.py), their errors apart from the fitted ones,
    and where they stand against the held-out targets."""
    table, summary, priced, memory_faults = render_held_out()
    errors = [r.error for r in priced if r.error is not None]
    short = [r.error for r in priced if r.error is not None and r.run.seq_len <= 8192]
    long = [r.error for r in priced if r.error is not None and r.run.seq_len > 8192]
    sources = {run.source for run in HELD_OUT}
    return [
        "## Held-out rows: committed before any fitting, never tuned on",
        "",
        "Every row of each table used is listed (validation/heldout_runs.py; the first batch was",
        "committed before any fitting commit, the second (llm-foundry, BLOOM, FlashAttention)",
        "before any change to a fitted parameter, the third (Llama 3, NeMo's CP table) after",
        "the fit, with no fitted parameter changed since: the one pricing change it prompted,",
        "FSDP's per-layer gradient calls, is finding (4) with its before and after; the fourth",
        "(NeMo AutoModel, DeepSeek-V3) with the planner's mixtures of experts, the fifth",
        "(NVIDIA's DGX Cloud benchmarking recipes) after the runtime switches of finding (7)",
        "and before any change that could see it); rows",
        "the planner cannot price say why.",
        "Each run is priced as its source ran it (`validation/validate_heldout.py`): its GPU, GPU",
        "count, data/tensor/pipeline/context degrees (and the CP variant: ring, or all-gather",
        "of K/V), ZeRO stage (FSDP FULL_SHARD = 3, SHARD_GRAD_OP = 2), gradient precision,",
        "micro-batch size and accumulation, elementwise kernels (eager PyTorch, or fused where",
        "the source fuses them), attention kernel (flash, at the measured rate of the",
        "implementation the source ran, or the math kernel where the source keeps the",
        "scores) and checkpointing. torchtitan's two policies that paraxis lacks are",
        "priced from paraxis's none and full: `layer-2` checkpoints every second layer, `op`",
        "keeps the outputs of every other matmul and of the attention kernel and recomputes",
        "the rest (`estimate_as_run`). Error = predicted / published - 1 on tokens per second",
        "per GPU: positive means the planner predicts a faster run. Memory: the planner's total",
        "per GPU against the GPU's memory.",
        "",
        *summary,
        "",
        f"Fitted rows: {len(fitted_errors)} priced, mean |error| "
        f"{sum(fitted_errors) / len(fitted_errors):.1%}, largest {max(fitted_errors):.1%}.",
        f"Held-out rows: {len(HELD_OUT)} listed (the {len(fp8_runs())} FP8 ones accounted in "
        f"their own section below) from {len({s.split(' ')[0] for s in sources})} "
        f"independent sources (with the fitted rows' two papers, "
        f"{len({s.split(' ')[0] for s in sources}) + 2}), {len(errors)} priced: "
        f"{error_stats(errors)}, 95th percentile "
        f"{abs_percentile(errors, 0.95):.1%} ({target_verdict(errors)}).",
        f"By sequence length: up to 8K tokens ({len(short)} rows) {error_stats(short)}; longer "
        f"({len(long)} rows) {error_stats(long)}.",
        f"Memory: {len(memory_faults)} verdicts against the sources: a run that ran must fit, "
        "one the source reports out of memory must not.",
        "",
        *largest_error_lines(errors, fitted_errors),
        "",
        *HELD_OUT_FINDINGS,
        "",
        *kernel_lines(priced),
        *gemm_lines(priced),
        *bound_lines(priced),
        *twin_lines(priced),
        *switch_lines(priced)[:-1],
        record_line(),
        "",
        *search_lines(),
        *llama3_lines(),
        "",
        *table,
        "",
        "Sources of the held-out rows:",
        "",
        f"- {TORCHTITAN_A100}: the Llama 3 table (seq 8192) and the Llama 2 table (seq 4096),",
        "  tokens per second per GPU (WPS) and MFU, local batch per GPU, checkpointing; its",
        "  footnote 1 reports Llama 2 70B at local batch 2 with selective checkpointing OOM.",
        f"- {TORCHTITAN_H100}: Tables 1-6 (TPS/GPU).",
        f"- {LLM_FOUNDRY}: all five tables (H100 80GB BF16 at >= 128 GPUs and at 8-64 GPUs,",
        "  H100 80GB FP8, A100 80GB and A100 40GB with 1600 Gbps RoCE), copied verbatim to",
        "  validation/data/llm_foundry_benchmarks.md; shapes from scripts/train/yamls/pretrain.",
        f"- {BLOOM}: the replica setup (TP 4, PP 12, DP 8, MBS 2, GBS 2048, seq 2048) and",
        "  the logged iteration 85376 (104.70 s, 149.77 TFLOPs with recompute).",
        f"- {FLASH}: the Training speed table (tokens/s on 8 GPUs) and the experiment configs",
        "  (per-GPU batch, DDP or ZeRO-1).",
        f"- {LLAMA3}: Sec. 3.3.1 (H100s, 400 Gb/s RoCE per GPU), Sec. 3.3.2 (FSDP that",
        "  shards optimizer states and gradients, fp32 gradient accumulation and",
        "  reduce-scatter, the interleaved schedule with one layer fewer on the first and last",
        "  stages, all-gather CP on 2 x CP chunks, no checkpointing at 8K) and Table 4 (every",
        "  row: GPUs, TP, CP, PP, DP, sequence, batch per DP, 16M tokens, TFLOPs/GPU, MFU;",
        "  the arXiv v1 HTML prints DP 4 for the 131,072 row, where 16,384 GPUs and 16M",
        "  tokens both need DP 8, as later versions print it).",
        f"- {NEMO_LONG}: the \"With CP\" columns of every row; FP8, its micro-batch,",
        "  checkpointing and optimizer sharding not stated, so none is priced.",
        f"- {AUTOMODEL}: every row of the table (time per global step, tokens/s/GPU) and the",
        "  DeepSeek V3 configs (forced-balanced gate, checkpointing, pipeline microbatch 1).",
        f"- {DEEPSEEK_V3}: Sec. 1 (180K H800 GPU hours per trillion tokens, 2048 H800s),",
        "  Sec. 3.2 (PP16, EP64 over 8 nodes, ZeRO-1), Sec. 4.2 (4K tokens, batch 15360).",
        "",
        *moe_findings(priced),
        *fp8_section(errors),
    ]


def target_verdict(errors: list[float]) -> str:
    """The held-out targets, each met or not at two decimals (8.03% rounds to "8.0%")."""
    mean = sum(map(abs, errors)) / len(errors)
    p95 = abs_percentile(errors, 0.95)
    return (f"targets: mean |error| <= 8%, {'met' if mean <= 0.08 else 'not met'} at {mean:.2%}; "
            f"95th percentile <= 20%, {'met' if p95 <= 0.20 else 'not met'} at {p95:.2%}")


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m validation",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/validation.md")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    text, worst = render()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(text)
    return 1 if args.check and worst > 0.20 else 0


if __name__ == "__main__":
    raise SystemExit(main())

