"""Price the held-out published runs (validation/heldout_runs.py) and render their table.

Each run is priced exactly as published: its (dp, tp, pp), ZeRO-3 over the FSDP degree, one
microbatch of the local batch (no accumulation), its checkpointing mapped to paraxis's
closest setting, on the GPU it ran on with eager elementwise kernels (torchtitan without
torch.compile runs PyTorch's eager ops) and the flash attention kernel (PyTorch SDPA), at the
measured rate of the implementation the source ran (`HeldOutRun.attention_impl`).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from paraxis.plan.activations import layer_activation_bytes
from paraxis.plan.compute import layer_forward_flops_per_token, model_flops_per_token
from paraxis.plan.cost import Estimate, evaluate
from paraxis.plan.experts import ep_link, remote_nodes_per_token
from paraxis.plan.hardware import GPUS, MAMF_SHARE, Cluster, build_cluster
from paraxis.plan.layer_cost import runtime_dropout
from paraxis.plan.stages import stage_layers
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import PRESETS, ModelConfig
from paraxis.spec.precision import PRECISIONS, Precision
from paraxis.spec.units import DEFAULT_BUCKET_BYTES
from validation.heldout_dgxc import DGXC as DGXC_SOURCE
from validation.heldout_record import HeldOutRun
from validation.heldout_runs import BLOOM as BLOOM_SOURCE
from validation.heldout_runs import HELD_OUT


class HeldOutResult(NamedTuple):
    run: HeldOutRun
    estimate: Estimate | None  # None: not priced (run.unpriced says why)
    tokens_per_gpu_s: float | None
    error: float | None  # predicted / published - 1 on tokens per second per GPU


# The GPU and network each source ran on (validation/heldout_runs.py names them by key).
CLUSTERS: dict[str, tuple[str, dict[str, object]]] = {
    # DGX A100-80GB: 8 x 200 Gb/s rails (torchtitan; llm-foundry's "1600 Gbps node-node
    # interconnect (RoCE)" is the same 200 GB/s per node)
    "a100": ("a100-80gb", {}),
    "a100-40gb": ("a100-40gb", {}),
    # llm-foundry's H100 80GB tables do not state the network: the DGX H100 reference design
    "h100": ("h100-sxm-80gb", {"nics_per_node": 8, "inter_node_bandwidth_Bps": 50e9}),
    # torchtitan's H100s: 96 GB HBM2e at 2.4 TB/s, 400 Gb/s RDMA per GPU; the SXM bf16 peak
    # (the source runs them at 500 W and does not know their exact peak)
    "h100-96gb": ("h100-sxm-80gb", {"memory_bytes": 96e9, "hbm_bandwidth_Bps": 2.4e12,
                                    "inter_node_bandwidth_Bps": 50e9}),
}


def cluster_for(run: HeldOutRun) -> Cluster:
    """The cluster `run` ran on, with its runtime's settings. PyTorch FSDP reduces gradients
    one wrapped block at a time (no buckets) and gathers a block's parameters in its forward,
    where the previous block's compute hides the gather (SHARD_GRAD_OP's and ZeRO-1-style
    sharding's too: `param_gather_overlap`)."""
    gpu, overrides = CLUSTERS[run.gpu]
    return build_cluster(gpu, run.gpus, 8, {
        **overrides, "kernels": run.kernels, "optimizer_kernel": optimizer_kernel(run),
        "attention_kernel": run.attention_kernel,
        "attention_impl": run.attention_impl, "param_gather_overlap": run.fsdp,
        "gradient_bucket_bytes": 0 if run.fsdp else DEFAULT_BUCKET_BYTES, **dict(run.network)})


def optimizer_kernel(run: HeldOutRun) -> str:
    """How `run`'s AdamW ran: as its record says, else torch.optim.AdamW's multi-tensor ops
    beside eager elementwise kernels (what these rows were priced with from the start; the
    sources do not say) and a fused Adam beside fused ones."""
    if run.optimizer_kernel != "auto":
        return run.optimizer_kernel
    return "foreach" if run.kernels == "eager" else "fused"


def torchtitan_op_bytes(cfg: ModelConfig, seq_len: int, micro_batch: int) -> float:
    """Bytes one Llama layer keeps under torchtitan's selective op checkpointing
    (torchtitan/parallelisms/parallelize_llama.py at 0413364, no_recompute_list): the
    block's input, the outputs of every other matmul in call order (wq, wv, w1, w2 of
    wq wk wv wo w1 w3 w2) and the flash kernel's output and fp32 log-sum-exp; the rest
    (norms, RoPE, SiLU, wk, wo, w3) is recomputed in the backward."""
    h, kv, f = cfg.d_model, cfg.kv_dim, cfg.d_ff
    per_token = 2 * (h + h + kv + h + f + h) + 4 * cfg.n_heads
    return per_token * seq_len * micro_batch


# Interleaving depths tried where the source does not publish its own (virtual_stages = 0).
OPEN_VIRTUAL_STAGES = (1, 2, 4, 8)


def _evaluate(run: HeldOutRun, recompute: str) -> Estimate:
    """The estimate of `run` with `recompute`; where the source leaves the interleaving depth
    open, the fastest depth that fits (else the fastest), as the planner's search would."""
    micro_batch = run.micro_batch or run.local_batch
    cfg, cluster = model_of(run), cluster_for(run)
    depths = (run.virtual_stages,) if run.virtual_stages else tuple(
        v for v in OPEN_VIRTUAL_STAGES if v == 1 or 1 < run.pp and run.pp * v <= cfg.n_layers)
    imbalance = {"expert_imbalance": run.expert_imbalance} if run.expert_imbalance else {}
    estimates = []
    for virtual in depths:
        layout = Layout(dp=run.dp, tp=run.tp, pp=run.pp, cp=run.cp,
                        zero=run.zero if run.dp * run.cp > 1 else 0, recompute=recompute,
                        schedule="interleaved" if virtual > 1 else run.schedule,
                        virtual_stages=virtual, microbatches=run.local_batch // micro_batch,
                        cp_attention=run.cp_attention,
                        sequence_parallel=run.sequence_parallel, ep=run.ep, etp=run.etp)
        estimates.append(evaluate(cfg, layout, cluster, run.seq_len, run.local_batch * run.dp,
                                  precision_of(run), **imbalance))
    return min(estimates, key=lambda e: (not e.fits, e.step_time_s))


def precision_of(run: HeldOutRun) -> Precision:
    """The precision the source ran, its FP8 recipe and weight gathers included."""
    precision = PRECISIONS[run.precision]
    if run.fp8_recipe is not None:
        precision = dataclasses.replace(precision, fp8_recipe=run.fp8_recipe)
    precision = dataclasses.replace(precision, fp8_weight_gather=run.fp8_weight_gather)
    if run.optimizer_bytes:
        precision = dataclasses.replace(precision, optimizer_bytes=run.optimizer_bytes)
    return precision


def is_fp8(run: HeldOutRun) -> bool:
    """An FP8 row: accounted apart from the bf16 rows (validation/heldout_fp8.py)."""
    return PRECISIONS[run.precision].fp8_recipe is not None


def model_of(run: HeldOutRun) -> ModelConfig:
    return PRESETS[run.model] if isinstance(run.model, str) else run.model


def _blend(none: Estimate, full: Estimate, share: float, activations: float) -> Estimate:
    """An estimate between no recompute and full recompute: `share` of the full recompute's
    extra time, `activations` bytes kept, and the full layer rebuilt in the backward."""
    memory = dict(none.memory, activations=activations, buffers=full.memory["buffers"])
    memory["total"] = sum(memory[k] for k in ("params", "grads", "optimizer", "activations",
                                             "buffers", "reserved"))
    time = dict(none.time, step=none.step_time_s + share * (full.step_time_s -
                                                            none.step_time_s))
    return dataclasses.replace(none, memory=memory, time=time)


def estimate_as_run(run: HeldOutRun) -> Estimate:
    """The planner's estimate of the checkpointing the source ran. paraxis's own policies
    (none, selective, full) are priced directly; torchtitan's two that paraxis lacks are
    priced from the none and full estimates: "layer-2" checkpoints every second layer (half
    the layers keep everything, half only their input; half the recompute), "op" keeps
    torchtitan_op_bytes per layer and recomputes wk, wo and w3 (their share of the
    layer's forward FLOPs of the full recompute's extra time; the recomputed elementwise
    ops are not priced)."""
    if run.recompute not in ("layer-2", "op"):
        return _evaluate(run, run.recompute)
    # "op"'s share is of the whole forward: its full estimate reruns the block whole
    whole = dataclasses.replace(run, network=(*run.network, ("recompute_rerun", "whole")))
    none, full = _evaluate(run, "none"), _evaluate(whole if run.recompute == "op" else run,
                                                   "full")
    cfg, micro = model_of(run), run.micro_batch or run.local_batch
    layers = max(stage_layers(cfg, run.pp, 1, run.seq_len))
    dropout = runtime_dropout(cfg, cluster_for(run).gpu)
    kept_none = layer_activation_bytes(cfg, run.seq_len, micro, dropout=dropout)
    kept_full = layer_activation_bytes(cfg, run.seq_len, micro, recompute="full")
    if run.recompute == "layer-2":
        kept, share = (kept_none + kept_full) / 2, 0.5
    else:
        h, kv, f = cfg.d_model, cfg.kv_dim, cfg.d_ff
        weights, scores = layer_forward_flops_per_token(cfg, run.seq_len)
        kept, share = torchtitan_op_bytes(cfg, run.seq_len, micro), 2 * h * (kv + h + f) / (
            weights + scores / 2)
    activations = none.memory["activations"] - layers * (kept_none - kept)
    return _blend(none, full, share, activations)


def price(run: HeldOutRun) -> HeldOutResult:
    if run.unpriced:
        return HeldOutResult(run, None, None, None)
    estimate = estimate_as_run(run)
    tokens = run.local_batch * run.dp * run.seq_len / estimate.step_time_s / run.gpus
    error = tokens / run.tokens_per_gpu_s - 1 if run.tokens_per_gpu_s else None
    return HeldOutResult(run, estimate, tokens, error)


def short_source(run: HeldOutRun) -> str:
    return run.source.split(" ")[0].split("/")[-1]


def render_held_out(runs: list[HeldOutRun] | None = None,
                    ) -> tuple[list[str], list[str], list[HeldOutResult], list[str]]:
    """Markdown lines of the held-out table of `runs` (default: every row but the FP8 ones),
    of its summary by source and GPU, the priced rows (with an error), and the memory
    verdicts that break the acceptance rule (a run that ran must fit, an OOM must not)."""
    lines = [
        "| run | source (table, row) | GPUs | dp | zero | tp | pp | cp | micro x accumulation "
        "x seq | recompute | published tokens/s/GPU | predicted | error | memory (GB/GPU) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    priced: list[HeldOutResult] = []
    memory_faults: list[str] = []
    groups: dict[tuple[str, str], list[HeldOutResult]] = {}
    for result in map(price, [run for run in HELD_OUT if not is_fp8(run)]
                      if runs is None else runs):
        run, estimate = result.run, result.estimate
        groups.setdefault((short_source(run), run.gpu), []).append(result)
        published = "OOM" if run.out_of_memory else f"{run.tokens_per_gpu_s:,.0f}"
        if estimate is None:
            predicted, error, memory = "not priced", run.unpriced, ""
        else:
            fits = "fits" if estimate.fits else "does not fit"
            memory = f"{estimate.memory['total'] / 1e9:.1f} ({fits})"
            if run.out_of_memory == estimate.fits:
                memory_faults.append(run.name)
            predicted = f"{result.tokens_per_gpu_s:,.0f}"
            error = "" if result.error is None else f"{result.error:+.1%}"
            if result.error is not None:
                priced.append(result)
        micro = run.micro_batch or run.local_batch
        batch = (f"{micro} x {run.local_batch // micro}" if micro > 0
                 else f"? ({run.local_batch} per replica)")
        zero = "?" if run.zero < 0 else run.zero if run.dp * run.cp > 1 else 0
        pp = f"{run.pp}"
        if estimate is not None and not run.virtual_stages:  # the depth the planner picked
            pp += f" (v={estimate.layout.virtual_stages})"
        cp = f"{run.cp}" + (f" {run.cp_attention.replace('_', '-')}"
                             if run.cp > 1 and run.cp_attention != "ring" else "")
        lines.append(f"| {run.name} | {run.where} | {run.gpus} | {run.dp} | "
                     f"{zero} | {run.tp} | {pp} | {cp} | {batch} x {run.seq_len} | "
                     f"{run.recompute} | "
                     f"{published} | {predicted} | {error} | {memory} |")
    return lines, summary_lines(groups), priced, memory_faults


def summary_lines(groups: dict[tuple[str, str], list[HeldOutResult]]) -> list[str]:
    lines = ["| source | GPU | rows | priced | mean abs. error | mean signed | largest | "
             "memory verdicts against the source |", "|---|---|---|---|---|---|---|---|"]
    for (source, gpu), results in groups.items():
        errors = [r.error for r in results if r.error is not None]
        faults = sum(r.estimate is not None and r.run.out_of_memory == r.estimate.fits
                     for r in results)
        stats = (f"{sum(map(abs, errors)) / len(errors):.1%} | "
                 f"{sum(errors) / len(errors):+.1%} | {max(map(abs, errors)):.1%}"
                 if errors else "| |")
        lines.append(f"| {source} | {gpu} | {len(results)} | {len(errors)} | {stats} | "
                     f"{faults} |")
    return lines


def llama3_lines() -> list[str]:
    """How the Llama 3 rows come out, part by part, and under the other reading of its FSDP
    (gradients accumulated unsharded in fp32 over the microbatches, reduced once a step:
    paraxis's ZeRO-1), so the table's ZeRO-2 reading is not the only one shown."""
    from validation.heldout_runs import LLAMA3_RUNS

    lines = []
    for run in LLAMA3_RUNS:
        as_run, other = price(run), price(dataclasses.replace(run, zero=1))
        assert as_run.estimate is not None and other.estimate is not None
        time, step = as_run.estimate.time, as_run.estimate.step_time_s
        fits = "fits" if other.estimate.fits else "does not fit"
        published = run.local_batch * run.dp * run.seq_len / (run.tokens_per_gpu_s or 1)
        lines.append(
            f"- {run.name}: {step:.1f} s a step (published {published / run.gpus:.1f} s): "
            f"compute {time['compute']:.1f}, exposed DP {time['dp']:.1f}, bubble "
            f"{time['bubble']:.1f}, TP {time['tp']:.1f}, CP {time['cp']:.1f}; MFU "
            f"{as_run.estimate.mfu:.1%} (causal count). With ZeRO-1: {other.error:+.1%}, "
            f"{other.estimate.memory['total'] / 1e9:.1f} GB ({fits}). Table 4's TFLOPs "
            f"counted with the causal half would be {_causal_tokens(run):,.0f} tokens/s/GPU "
            f"(+{_causal_tokens(run) / run.tokens_per_gpu_s - 1:.0%}).")
    return lines


def moe_findings(priced: list[HeldOutResult]) -> list[str]:
    """The mixture-of-experts rows (ep > 1) in words, with the figures behind their error."""
    rows = [r for r in priced if r.run.ep > 1]
    lines = ["Mixtures of experts: the rows with expert parallelism, priced with",
             "the planner's model of paraxis's runtime (four all-to-alls per MoE block per",
             "microbatch, spec/expert_placement.py), each all-to-all sent as its source sends it",
             "(`expert_dispatch`):", ""]
    for r in rows:
        assert r.estimate is not None and r.error is not None
        time = r.estimate.time
        lines.append(
            f"- {r.run.name}: published {r.run.tokens_per_gpu_s:,.0f} tokens/s/GPU, predicted "
            f"{r.tokens_per_gpu_s:,.0f} ({r.error:+.1%}); predicted step {time['step']:.2f} s "
            f"of which compute {time['compute']:.2f} s, all-to-alls {time['ep']:.2f} s, "
            f"gradient sync {time['dp']:.2f} s exposed, bubble {time['bubble']:.2f} s; "
            f"{r.estimate.memory['total'] / 1e9:.1f} GB per GPU.")
    deepep = [r for r in rows if dict(r.run.network).get("expert_dispatch") == "per_node"]
    if deepep:
        first = deepep[0]
        assert first.estimate is not None
        cfg, layout = model_of(first.run), first.estimate.layout
        link = ep_link(layout, cluster_for(first.run))
        off_node = cfg.top_k * (layout.ep - link.per_node) / layout.ep
        lines += [
            "",
            f"The rows above that ran DeepEP ({', '.join(r.run.name for r in deepep)}) send a",
            "token once to each destination node over RDMA and forward it to that node's",
            "experts over NVLink, where paraxis's runtime sends each (token, expert) row; they",
            "are priced as DeepEP sends (`expert_dispatch = \"per_node\"`, plan/experts.py).",
            f"For {first.run.name} (EP{layout.ep} over {link.nodes} nodes), under uniform "
            f"routing a token's {cfg.top_k} experts sit on "
            f"{remote_nodes_per_token(cfg, link.nodes):.2f} of the {link.nodes - 1} other nodes "
            f"on average, against {off_node:.2f} rows a token sent off the node row by row.",
            "Priced row by row instead: " + "; ".join(
                f"{r.run.name} {price(_row_by_row(r.run)).error:+.1%} -> {r.error:+.1%}"
                for r in deepep) + ".",
        ]
    return lines + [
        "DeepSeek-V3's router sends a token to at most 4 nodes (DeepSeek-AI 2024, Sec. 2.1.2);",
        "whether the forced-balanced gate keeps that limit is not stated, so it is not assumed.",
        "The preset models DeepSeek's latent attention as plain 128-head attention (about the",
        "same parameters, but a third of MLA's score FLOPs at 4K tokens). The 1024-GPU row is",
        "priced with activation checkpointing, as its config was first committed (Automodel",
        "2c236e08, two days after the table); a refactor (194103bf, 2026-02-12) later dropped",
        "the key with the section it sat in (validation/heldout_runs.py).",
        "",
    ]


def _row_by_row(run: HeldOutRun) -> HeldOutRun:
    """`run` with its all-to-alls priced as paraxis's runtime sends them (every row)."""
    return dataclasses.replace(run, network=tuple(
        (key, value) for key, value in run.network if key != "expert_dispatch"))


def _causal_tokens(run: HeldOutRun) -> float:
    """Tokens per second per GPU of a run published in PaLM's FLOPs (the full attention
    square), had its FLOPs been counted with the causal half (Megatron-LM since 2025)."""
    cfg = model_of(run)
    return (run.tokens_per_gpu_s or 0.0) * model_flops_per_token(
        cfg, run.seq_len, causal=False) / model_flops_per_token(cfg, run.seq_len)


def error_stats(errors: list[float]) -> str:
    """Mean |error|, largest and mean signed error of a list of relative errors."""
    return (f"mean |error| {sum(map(abs, errors)) / len(errors):.1%}, largest "
            f"{max(map(abs, errors)):.1%}, mean signed {sum(errors) / len(errors):+.1%}")


def kernel_lines(priced: list[HeldOutResult]) -> list[str]:
    """What pricing each source's attention kernel at its measured rate changed (finding 2):
    the held-out errors with every core at the GEMM rate instead (`attention_impl` "", how
    every row was priced before the kernel fits) -> as priced, by kernel and sequence."""
    pairs = {id(r): (price(dataclasses.replace(r.run, attention_impl="")).error or 0.0,
                     r.error or 0.0) for r in priced}
    lines = ["Kernel rates: the held-out rows' errors with the attention core at the GEMM rate",
             "-> at the measured rate of the kernel each source ran (`attention_impl`):", ""]
    groups = [("every row", priced)] + [
        (f"`{impl or 'unknown'}` {label}", [r for r in priced if r.run.attention_impl == impl
                                            and (r.run.seq_len > 8192) == long])
        for impl in ("fa2", "fa1", "triton", "") for label, long in (("up to 8K", False),
                                                                     ("beyond 8K", True))]
    for label, rows in groups:
        if rows:
            chosen = [pairs[id(r)] for r in rows]
            lines.append(f"- {label} ({len(rows)} rows): "
                         f"{error_stats([pair[0] for pair in chosen])} -> "
                         f"{error_stats([pair[1] for pair in chosen])}")
    worse = [r for r in priced if abs(pairs[id(r)][1]) > abs(pairs[id(r)][0]) + 1e-9]
    triton = sum(r.run.attention_impl == "triton" for r in worse)
    return lines + [f"- worse with the kernel rates: {len(worse)} of {len(priced)} rows, "
                    f"{triton} of them `triton`.", ""]


# How every H100 row was priced before the GEMM curve was carried over from the A100 (finding 5).
FLAT_H100 = (("matmul_efficiency", 0.5), ("gemm_half_width", 0.0))


def gemm_lines(priced: list[HeldOutResult]) -> list[str]:
    """What carrying the A100's GEMM curve over to H100 changed (finding 5): the errors of
    the rows that ran on an H100 with the former flat 0.5 of peak -> as priced, by source."""
    h100 = [r for r in priced if CLUSTERS[r.run.gpu][0].startswith("h100")]
    before = {id(r): price(dataclasses.replace(r.run, network=(*r.run.network, *FLAT_H100)))
              .error or 0.0 for r in h100}
    lines = ["H100 GEMMs: the errors of the rows that ran on an H100 with the former flat 0.5",
             "of peak -> with the A100's curve carried over (`carried_from_a100`):", ""]
    for label in ["every H100 row", *sorted({short_source(r.run) for r in h100})]:
        rows = [r for r in h100 if label == "every H100 row" or short_source(r.run) == label]
        lines.append(f"- {label} ({len(rows)} rows): "
                     f"{error_stats([before[id(r)] for r in rows])} -> "
                     f"{error_stats([r.error or 0.0 for r in rows])}")
    every = [r.error or 0.0 for r in priced]
    every_before = [before.get(id(r), r.error or 0.0) for r in priced]
    # The 96 GB H100s' HBM2e (2.4 TB/s) raises their balance: their half width as the SXM's
    # (before an hbm override moved it) -> their own.
    sxm = (("gemm_half_width", GPUS["h100-sxm-80gb"].gemm_half_width),)
    hbm2e = [r for r in h100 if r.run.gpu == "h100-96gb"]
    own = [price(dataclasses.replace(r.run, network=(*r.run.network, *sxm))).error or 0.0
           for r in hbm2e]
    return lines + [f"- every held-out row ({len(priced)}): {error_stats(every_before)} -> "
                    f"{error_stats(every)}",
                    f"- the 96 GB H100s at 2.4 TB/s ({len(hbm2e)} rows) with the SXM's half "
                    f"width -> their own balance's: {error_stats(own)} -> "
                    f"{error_stats([r.error or 0.0 for r in hbm2e])}", ""]


# The ideal machine of a row's GPUs (finding 6): every GEMM at the chip's best measured bf16
# matmul rate (MAMF_SHARE), the attention core at FlashAttention-2's measured rate (the fastest
# kernel charted), elementwise ops, links and latencies free. What is left is the row's own
# FLOPs (its recompute included) and its schedule's bubble.
FREE = (("gemm_half_width", 0.0), ("kernels", "fused"), ("hbm_bandwidth_Bps", 1e18),
        ("hbm_efficiency", 1.0), ("nvlink_bandwidth_Bps", 1e18), ("link_efficiency", 1.0),
        ("inter_node_bandwidth_Bps", 1e18), ("intra_node_latency_s", 0.0),
        ("inter_node_latency_s", 0.0), ("collective_latency_s", 0.0))


def ideal_share(result: HeldOutResult) -> float:
    """The row's published tokens/s over what the ideal machine of its GPUs would reach."""
    run = result.run
    chip = "h100" if CLUSTERS[run.gpu][0].startswith("h100") else "a100"
    free = (*FREE, ("matmul_efficiency", MAMF_SHARE[chip]))
    if run.attention_kernel != "math":  # the math kernel's scores are GEMMs: at MAMF too
        free = (*free, ("attention_impl", "fa2"))
    ideal = price(dataclasses.replace(run, network=(*run.network, *free)))
    return (run.tokens_per_gpu_s or 0.0) / (ideal.tokens_per_gpu_s or 1.0)


def bound_lines(priced: list[HeldOutResult]) -> list[str]:
    """How close each published row ran to the ideal machine of its GPUs (finding 6)."""
    shares = sorted(((ideal_share(r), r) for r in priced), key=lambda pair: -pair[0])
    top, first = shares[0]
    lines = ["Ideal machine: each priced row's published tokens/s over what its GPUs would reach",
             "with every GEMM at the chip's best measured matmul rate, the attention core at",
             "FlashAttention-2's and everything else free (`ideal_share`):", "",
             f"- above it: {sum(share > 1 for share, _ in shares)} of {len(shares)} rows; the "
             f"closest {top:.2f} of it ({first.run.name}); half the rows below "
             f"{shares[len(shares) // 2][0]:.2f}",
             "- the rows the planner misses by more than 20%, with their share of it:"]
    lines += [f"  - {r.run.name}: error {r.error:+.1%}, {share:.2f} of the ideal machine"
              for share, r in shares if abs(r.error or 0.0) > 0.20]
    return lines + [""]


def _userbuffers(run: HeldOutRun) -> bool:
    return run.tp > 1 and ("tp_comm_overlap", "all") in run.network


# The runtime switches of the cost model (plan/hardware.py), each set as its source ran it
# (validation/heldout_runs.py): what each does to the rows it touches, against the other
# setting. (label, rows it applies to, overrides of the other setting)
SWITCHES = (
    ("FSDP gathers a block's parameters in its forward (`param_gather_overlap`), against "
     "an exposed all-gather after the step",
     lambda run: run.fsdp and run.zero in (1, 2), (("param_gather_overlap", False),)),
    ("BLOOM's DeepSpeed buckets of 5e8 elements (`gradient_bucket_bytes`), against DDP's "
     "25 MiB", lambda run: run.source == BLOOM_SOURCE,
     (("gradient_bucket_bytes", DEFAULT_BUCKET_BYTES),)),
    ("the host's kernel launches (`kernel_launch_s`), against none",
     lambda run: True, (("kernel_launch_s", 0.0),)),
    ("the backward's TP overlap the TP rows with SP ran without userbuffers "
     "(`tp_comm_overlap` \"backward\"), against every TP collective pipelined with its GEMM",
     lambda run: run.tp > 1 and run.sequence_parallel and not _userbuffers(run),
     (("tp_comm_overlap", "all"),)),
    ("NeMo's userbuffers (`ub_tp_comm_overlap`: `tp_comm_overlap` \"all\"), against the "
     "backward's overlap only",
     _userbuffers, (("tp_comm_overlap", "backward"),)),
    ("Megatron-Core's parameter all-gather behind the next forward (`overlap_param_sync`: "
     "`param_gather_overlap`), against exposed after the step",
     lambda run: run.source == DGXC_SOURCE, (("param_gather_overlap", False),)),
    ("Megatron-Core's all-to-all dispatcher sending sequence shards (`expert_tp_dispatch` "
     "\"sequence_shard\"), against every TP rank's tokens",
     lambda run: ("expert_tp_dispatch", "sequence_shard") in run.network,
     (("expert_tp_dispatch", "every_rank"),)),
    ("Transformer Engine's cuDNN attention (`attention_impl` \"cudnn\"), against "
     "FlashAttention-2's rate",
     lambda run: run.attention_impl == "cudnn", (("attention_impl", "fa2"),)),
    ("PyTorch's non-reentrant checkpoint from 2.1, whose rerun stops once the backward's "
     "tensors are rebuilt (`recompute_rerun` \"needed\"), against the block rerun whole",
     lambda run: ("recompute_rerun", "needed") in run.network and run.recompute in (
         "full", "layer-2"), (("recompute_rerun", "whole"),)),
)


def switch_lines(priced: list[HeldOutResult]) -> list[str]:
    """The held-out errors of the rows each runtime switch touches, priced with the other
    setting -> as priced."""
    lines = ["Runtime switches: the errors of the rows each one touches with the other "
             "setting -> as priced:", ""]
    for label, applies, other in SWITCHES:
        rows = [r for r in priced if applies(r.run)]
        if not rows:
            continue
        before = [price(dataclasses.replace(r.run, network=(*r.run.network, *other))).error
                  or 0.0 for r in rows]
        after = [r.error or 0.0 for r in rows]
        lines.append(f"- {label} ({len(rows)} rows): {error_stats(before)} -> "
                     f"{error_stats(after)}")
    return lines + [""]

