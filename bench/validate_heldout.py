"""Price the held-out published runs (bench/heldout_runs.py) and render their table.

Each run is priced exactly as published: its (dp, tp, pp), ZeRO-3 over the FSDP degree, one
microbatch of the local batch (no accumulation), its checkpointing mapped to paraxis's
closest setting, on the GPU it ran on with eager elementwise kernels (torchtitan without
torch.compile runs PyTorch's eager ops) and the flash attention kernel (PyTorch SDPA).
"""

from __future__ import annotations

from typing import NamedTuple

from bench.heldout_runs import HELD_OUT, HeldOutRun
from paraxis.layout import Layout
from paraxis.model_config import PRESETS
from paraxis.plan.cost import Estimate, evaluate
from paraxis.plan.hardware import Cluster, build_cluster


class HeldOutResult(NamedTuple):
    run: HeldOutRun
    estimate: Estimate | None  # None: not priced (run.unpriced says why)
    tokens_per_gpu_s: float | None
    error: float | None  # predicted / published - 1 on tokens per second per GPU


def cluster_for(run: HeldOutRun) -> Cluster:
    if run.gpu == "a100":
        return build_cluster("a100-80gb", run.gpus, 8, {"kernels": "eager"})
    # torchtitan's H100s: 96 GB HBM2e at 2.4 TB/s, 400 Gb/s RDMA per GPU; the SXM bf16 peak
    # (the source runs them at 500 W and does not know their exact peak)
    return build_cluster("h100-sxm-80gb", run.gpus, 8, {
        "kernels": "eager", "memory_bytes": 96e9, "hbm_bandwidth_Bps": 2.4e12,
        "inter_node_bandwidth_Bps": 50e9})


def price(run: HeldOutRun) -> HeldOutResult:
    if run.unpriced:
        return HeldOutResult(run, None, None, None)
    layout = Layout(dp=run.dp, tp=run.tp, pp=run.pp, zero=3 if run.dp > 1 else 0,
                    recompute=run.recompute, schedule=run.schedule)
    estimate = evaluate(PRESETS[run.model], layout, cluster_for(run), run.seq_len,
                        run.local_batch * run.dp)
    tokens = run.local_batch * run.seq_len / estimate.step_time_s
    error = tokens / run.tokens_per_gpu_s - 1 if run.tokens_per_gpu_s else None
    return HeldOutResult(run, estimate, tokens, error)


def render_held_out() -> tuple[list[str], list[float], list[str]]:
    """Markdown lines of the held-out table, the priced rows' errors, and the memory
    verdicts that break the acceptance rule (a run that ran must fit, an OOM must not)."""
    lines = [
        "| run | source (table, row) | GPUs | dp (FSDP) | tp | pp | local batch x seq | "
        "recompute | published tokens/s/GPU | predicted | error | memory (GB/GPU) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    errors: list[float] = []
    memory_faults: list[str] = []
    for result in map(price, HELD_OUT):
        run, estimate = result.run, result.estimate
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
                errors.append(result.error)
        lines.append(f"| {run.name} | {run.where} | {run.gpus} | {run.dp} | {run.tp} | "
                     f"{run.pp} | {run.local_batch} x {run.seq_len} | {run.recompute} | "
                     f"{published} | {predicted} | {error} | {memory} |")
    return lines, errors, memory_faults
