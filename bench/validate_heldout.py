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


# The GPU and network each source ran on (bench/heldout_runs.py names them by key).
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
    gpu, overrides = CLUSTERS[run.gpu]
    return build_cluster(gpu, run.gpus, 8, {
        **overrides, "kernels": run.kernels, "attention_kernel": run.attention_kernel,
        **dict(run.network)})


def price(run: HeldOutRun) -> HeldOutResult:
    if run.unpriced:
        return HeldOutResult(run, None, None, None)
    micro_batch = run.micro_batch or run.local_batch
    layout = Layout(dp=run.dp, tp=run.tp, pp=run.pp, zero=run.zero if run.dp > 1 else 0,
                    recompute=run.recompute, schedule=run.schedule,
                    microbatches=run.local_batch // micro_batch)
    model = PRESETS[run.model] if isinstance(run.model, str) else run.model
    estimate = evaluate(model, layout, cluster_for(run), run.seq_len, run.local_batch * run.dp)
    tokens = run.local_batch * run.dp * run.seq_len / estimate.step_time_s / run.gpus
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
