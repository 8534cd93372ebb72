"""NVIDIA's DGX Cloud runs beyond their errors (docs/validation.md): what the planner's search
picks where NVIDIA published its own layout, and what their memory verdicts owe to the
optimizer and expert facts validation/heldout_dgxc.py records.

For each of NVIDIA's DGX Cloud recipes (validation/heldout_dgxc.py) at its smallest GPU count,
the search runs over every layout of those GPUs that the recipe's runtime runs (Megatron-Core's
distributed optimizer: ZeRO-1), priced on the cluster and runtime the recipe ran (its overlaps,
optimizer and attention kernel), with the recipe's global batch and sequence; its pick is
printed beside NVIDIA's layout, both as the planner prices them (the pick against NVIDIA's
layout, on the same model: what the search claims) and NVIDIA's as measured.
"""

from __future__ import annotations

import dataclasses

from paraxis.plan.search import Constraints, search
from validation.heldout_dgxc import dgxc_rows
from validation.heldout_record import HeldOutRun
from validation.validate_heldout import cluster_for, model_of, precision_of, price


def _first_of_each_recipe() -> list[HeldOutRun]:
    seen: set[str] = set()
    runs = []
    for run in dgxc_rows():
        recipe = run.where.split(",")[0]
        if run.unpriced or run.precision != "bf16" or recipe in seen:
            continue
        seen.add(recipe)
        runs.append(run)
    return runs


def search_lines() -> list[str]:
    lines = ["The search on NVIDIA's GPU counts: each DGX Cloud recipe's first row, its layout "
             "(as run) against the planner's pick of every ZeRO-1 layout of those GPUs, on the "
             "recipe's runtime (`python -m validation`, validation/heldout_search.py):", "",
             "| run | NVIDIA's layout | published tokens/s/GPU | priced | the planner's pick "
             "| priced | pick / NVIDIA's, priced |", "|---|---|---|---|---|---|---|"]
    for run in _first_of_each_recipe():
        ran = price(run)
        assert ran.estimate is not None and ran.tokens_per_gpu_s is not None
        found = search(model_of(run), cluster_for(run), run.seq_len, run.local_batch * run.dp,
                       Constraints(zero=1), precision=precision_of(run))
        best = found.ranked[0]
        tokens = best.tokens_per_s / run.gpus
        lines.append(f"| {run.name} | `{ran.estimate.layout}` | {run.tokens_per_gpu_s:,.0f} | "
                     f"{ran.tokens_per_gpu_s:,.0f} | `{best.layout}` | {tokens:,.0f} | "
                     f"{tokens / ran.tokens_per_gpu_s - 1:+.1%} |")
    return [*lines, ""]


def record_line() -> str:
    """How many DGX Cloud BF16 runs that ran would not fit priced with 12 bytes of optimizer
    states a parameter (fp32 moments and master) and experts whole on every TP rank."""
    runs = [run for run in dgxc_rows() if not run.unpriced and run.precision == "bf16"]
    out = [run.name for run in runs
           if not price(dataclasses.replace(run, optimizer_bytes=12, etp=1)).estimate.fits]
    recorded = sum(not price(run).estimate.fits for run in runs)
    return (f"- Priced with 12 bytes of AdamW states a parameter and experts whole on every "
            f"TP rank, {len(out)} of the {len(runs)} DGX Cloud BF16 runs that ran do not fit "
            f"({', '.join(out) or 'none'}); as recorded, {recorded}.")
