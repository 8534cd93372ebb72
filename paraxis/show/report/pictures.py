"""The report's pictures of the plan: rank grid, tensor-parallel split, context parallelism
(when the layout has cp > 1), experts (for a mixture of experts), memory, ring.

Each is drawn by `paraxis.show.viz` from the planner's or the simulators' numbers; the pipeline
section has its own module (`paraxis.show.report.pipeline`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from paraxis.plan.attribution import sync_group_words
from paraxis.plan.experts import experts_over_tp
from paraxis.plan.memory import stage_local_params, stage_states
from paraxis.show.report.experts import experts_section
from paraxis.show.report.plan import Plan
from paraxis.show.report.text import duration, layout_text
from paraxis.show.viz.context import MAX_LABELLED_CP, plot_chunks
from paraxis.show.viz.context_ring import plot_kv_exchange
from paraxis.show.viz.grid import plot_rank_grid
from paraxis.show.viz.html import figure
from paraxis.show.viz.memory import component_label, plot_stage_memory, plot_zero_memory
from paraxis.show.viz.ring import plot_ring
from paraxis.show.viz.style import figure_data_uri
from paraxis.show.viz.tp_split import plot_tp_split
from paraxis.spec.cp_balance import pairs_per_rank

if TYPE_CHECKING:
    from paraxis.show.report.measured import MeasuredRun

Section = tuple[str, str, str]  # (anchor, heading, HTML body)


def pictures(plan: Plan, pipeline: Section, run: MeasuredRun | None = None
             ) -> list[Section]:
    """Every picture section, in reading order, with `pipeline` in its place; context
    parallelism's only when the layout splits sequences (cp > 1), experts' only for a
    mixture of experts (with the run's expert load when a run is given)."""
    context = [_context(plan)] if plan.layout.cp > 1 else []
    experts = [experts_section(plan, run)] if plan.cfg.is_moe else []
    return [_grid(plan), _tp(plan), *context, *experts, pipeline, _memory(plan), _ring(plan)]


def ring_ranks(dp: int) -> int:
    """The ring drawn: the run's DP group from 3 ranks up (at most 8, to stay legible);
    a ring of 2 is a plain swap, so smaller groups are shown as 4."""
    return min(dp, 8) if dp >= 3 else 4


def _grid(plan: Plan) -> Section:
    name, axes = ("3D rank grid", "dp, tp, pp") if plan.layout.cp == 1 else \
        ("4D rank grid", "dp, cp, tp, pp")
    return ("grid", name, figure(
        figure_data_uri(plot_rank_grid(plan.layout, plan.cluster.gpus_per_node,
                                       plan.hardware.device)),
        name, f"Every rank's ({axes}) coordinates from Layout.coords, the "
        "function the runtime builds its process groups from."))


def _context(plan: Plan) -> Section:
    layout, e = plan.layout, plan.estimate
    cp, variant = layout.cp, layout.cp_attention
    pairs = pairs_per_rank(plan.seq_len, cp)
    split = figure(figure_data_uri(plot_chunks(plan.seq_len, cp, variant)),
                   "context-parallel split and attention blocks",
                   f"The sequence of {plan.seq_len} tokens cut into 2·cp = {2 * cp} chunks, "
                   f"rank i holding chunks i and {2 * cp - 1}-i, and the causal attention "
                   f"blocks by the rank that computes them: every rank computes {pairs[0]:,} "
                   "(query, key) pairs per head and sequence (balance.pairs_per_rank, the "
                   "count the kernels are tested against).")
    drawn = min(cp, MAX_LABELLED_CP)
    shown = "" if drawn == cp else f" The picture shows cp = {drawn} to stay legible."
    command = f"paraxis context --cp {drawn} --attention {variant} --out DIR" + (
        f" --seq-len {plan.seq_len}" if drawn == cp else "")
    how = {"ring": "K/V blocks travel the ring one rank per step, behind each step's "
                   "compute; in backward the dK/dV follow one hop behind and land on their "
                   "owners.",
           "all_gather": "K/V are gathered once per layer (again in backward) and the dK/dV "
                         "reduce-scattered back to their owners.",
           "all_to_all": "An all-to-all gives each rank one head group of the whole "
                         "sequence (q, k and v), the output returns by a second one, and "
                         "backward runs both in reverse."}[variant]
    exchange = figure(figure_data_uri(plot_kv_exchange(drawn, variant)),
                      f"context parallelism: {variant}",
                      f"{how} The planner prices this exchange at "
                      f"{duration(e.time.get('cp_total', 0.0))} per step, "
                      f"{duration(e.time.get('cp', 0.0))} of it on the critical path "
                      f"(`{command}` draws these pictures).{shown}")
    return ("context", "Context parallelism", split + exchange)


def _tp(plan: Plan) -> Section:
    layout = plan.layout
    tp = layout.tp if layout.tp > 1 else 2
    note = "" if layout.tp > 1 else (" This plan uses tp=1 (every rank holds whole weights); "
                                     "the picture shows tp=2 to illustrate.")
    etp = tp if layout.etp > 1 else 1
    experts = experts_over_tp(plan.cfg, layout)  # what the grey (whole) experts mean
    return ("tp", "Tensor-parallel split", figure(
        figure_data_uri(plot_tp_split(plan.cfg, tp, etp)), "tensor-parallel split",
        "Column-parallel layers split output features, row-parallel ones input features; "
        + ("a reduce-scatter joins them, and an all-gather rebuilds the sequence before the "
           "next column-parallel layer (sequence parallelism, Korthikanti 2022)."
           if layout.tp > 1 and layout.sequence_parallel else
           "one all-reduce joins them (Megatron-LM).")
        + note + (" " + experts if experts else "")))


def stage_model_states(plan: Plan) -> list[dict[str, float]]:
    """Each pipeline stage's model states per device, as `memory.layout_memory` counts them:
    the stage's `stage_local_params` (TP's shard, the routed experts over ep, the schedule's
    placement of blocks) sharded by the layout's ZeRO over its `zero_ranks` (dp x cp, or a
    hybrid shard group; the routed experts' over 1/ep of them)."""
    layout = plan.layout
    return [dict(stage_states(round(local), round(experts), layout.zero_ranks, layout.ep,
                              layout.zero, plan.inputs.precision_rule()))
            for local, experts in stage_local_params(plan.cfg, layout, plan.seq_len)]


def _memory(plan: Plan) -> Section:
    layout, cfg, hw = plan.layout, plan.cfg, plan.hardware
    gpu = plan.cluster.gpu
    capacity = "RAM share of a rank" if hw.cpu else gpu.name
    worst = plan.memory  # the estimate's own count (its kernels, its dropout, its reserve)
    busiest = int(worst["stage"])
    local, experts = stage_local_params(cfg, layout, plan.seq_len)[busiest]
    of_stage = f" of stage {busiest}" if layout.pp > 1 else ""
    zero = figure(figure_data_uri(plot_zero_memory(
        round(local), layout.zero_ranks, gpu.memory_bytes, capacity,
        plan.inputs.precision_rule(), model_name=f"{cfg.name}, one {hw.device}'s share"
        f"{of_stage}", device=hw.device, expert_params=round(experts), ep=layout.ep)),
        "ZeRO memory", f"Parameters, gradients and optimizer states per {hw.device} under "
        f"each ZeRO stage{of_stage}, sharded over {layout.zero_ranks} ranks (dp x cp, or one "
        "hybrid shard group; planner: plan.memory), against the capacity. Activations come "
        "on top (next picture).")
    rows = stage_model_states(plan)
    labels = [f"stage {stage}\nmodel states" for stage in range(len(rows))]
    leave = ("stage", "total")
    rows.append({k: v for k, v in worst.items() if k not in leave})
    labels.append(f"stage {busiest}\neverything")
    reserve = f"; reserved: a rank's {component_label('reserved', hw.device)}" if hw.cpu else ""
    stages = figure(figure_data_uri(plot_stage_memory(
        rows, gpu.memory_bytes, capacity, layout_text(layout), labels, hw.device)),
        "memory per stage", "Model states on every pipeline stage, and the planner's full "
        "count (activations, buffers, reserved) for the stage "
        f"that needs the most: the one that must fit{reserve}.")
    return ("memory", "Memory", zero + stages)


def _ring(plan: Plan) -> Section:
    layout, e = plan.layout, plan.estimate
    group = layout.zero_ranks  # the ranks a gradient is synced over (dp, or dp x cp)
    ranks = ring_ranks(group)
    if group > 1:
        over = (f"dp={layout.dp}" if group == layout.dp else
                f"{group} ranks (dp={layout.dp}{sync_group_words(layout)})")
        sync = (f"This plan's gradient sync runs over {over}, priced at "
                f"{duration(e.time.get('dp_total', 0.0))} per step in all, "
                f"{duration(e.time.get('dp', 0.0))} of it not hidden behind the backward.")
        if layout.zero:
            sync += (f" Under ZeRO-{layout.zero} it is a reduce-scatter and an all-gather, "
                     "the two halves of the ring all-reduce drawn here.")
        if ranks != group:
            sync += (f" A ring of {group} is a plain swap, so the picture shows "
                     f"{ranks} ranks." if group < ranks else
                     f" A ring of {group} takes 2 x {group - 1} steps; the picture "
                     f"shows the same algorithm on {ranks} ranks, which stays legible.")
    else:
        sync = "This plan has dp=1, so no gradient all-reduce; the picture shows 4 ranks."
    return ("ring", "Ring all-reduce", figure(
        figure_data_uri(plot_ring(ranks)), "ring all-reduce",
        f"The gradient all-reduce of a {ranks}-rank data-parallel group, step by step "
        f"(`paraxis ring --ranks {ranks}` prints the values). {sync}"))
