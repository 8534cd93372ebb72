"""Defend a chosen layout in the course's decision-tree language, with the figures behind it.

Decision tree (CS 229s, Parallelism Fundamentals, Ch. 8): fits on one GPU? -> data
parallelism. Fast intra-node links? -> tensor parallelism inside the node. Several nodes? ->
pipeline across nodes and data parallelism across groups. Still out of memory? -> ZeRO.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from paraxis.plan.comm import Link, axis_link
from paraxis.plan.context import copies_link, imbalance, zero_link
from paraxis.plan.cost import DEFAULT_OVERLAP, Estimate, Overlap, evaluate, too_big_reason
from paraxis.plan.experts import DEFAULT_IMBALANCE, ep_link, experts_over_tp
from paraxis.plan.fp8 import runtime_precision
from paraxis.plan.hardware import GPU, Cluster
from paraxis.plan.layer_cost import reruns_needed
from paraxis.plan.memory import model_state_bytes, peak_moment
from paraxis.plan.rates import overlap_on
from paraxis.plan.rivals import family_rivals, nearest_rivals, prediction_lines
from paraxis.plan.search import SearchResult, search
from paraxis.plan.uncertainty import MEMORY_BAND, error_band
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import ModelConfig
from paraxis.spec.precision import MIXED_ADAM, Precision
from paraxis.spec.units import GB, seconds


def _shape(estimate: Estimate) -> tuple[int, int, int]:
    layout = estimate.layout
    return layout.dp, layout.tp, layout.pp


def states_fit(state_bytes: float, gpu: GPU) -> bool:
    """The planner's first question ("Fits on one GPU?"), the ZeRO calculator's and the
    lab's: model states plus the memory the runtime holds back on every GPU within the GPU's
    memory; activations come on top."""
    return state_bytes + gpu.reserved_bytes <= gpu.memory_bytes


def explain(cfg: ModelConfig, cluster: Cluster, best: Estimate,
            result: SearchResult | None = None, precision: Precision = MIXED_ADAM,
            alternatives: int = 3, overlap: Overlap = DEFAULT_OVERLAP,
            expert_imbalance: float = DEFAULT_IMBALANCE) -> list[str]:
    """Short sentences, one idea each, that say why `best` and not its rivals."""
    gpu, layout, time = cluster.gpu, best.layout, best.time
    limit = gpu.memory_bytes / GB
    states = sum(model_state_bytes(cfg.num_params(), 1, 0, precision).values()) / GB
    lines = []
    one_gpu = states_fit(states * GB, gpu)
    lines.append(
        f"Fits on one GPU? {'yes' if one_gpu else 'no'}: {cfg.num_params() / 1e9:.3g}B "
        f"parameters need {precision.total_bytes:g} B each = {states:.1f} GB of model states "
        f"before activations, against {limit:.0f} GB per GPU.")
    if cfg.is_moe:
        shared = f", {cfg.n_shared_experts} shared" if cfg.n_shared_experts else ""
        lines.append(
            f"Mixture of experts: {cfg.num_params() / 1e9:.3g}B parameters, "
            f"{cfg.num_active_params() / 1e9:.3g}B active per token (router, top {cfg.top_k} "
            f"of {cfg.n_experts} experts{shared}): the FLOPs follow the active parameters, "
            "the memory all of them.")
    node = cluster.gpus_per_node
    per_gpu_in_node = states / node
    room = limit - gpu.reserved_bytes / GB  # what the runtime's reserve leaves
    lines.append(
        f"Fits in one node? sharded over its {node} GPUs (ZeRO-3 or TP x PP) the states take "
        f"{per_gpu_in_node:.1f} GB per GPU of the {room:.1f} GB the runtime's reserve leaves: "
        f"{'yes, before activations' if per_gpu_in_node < room else 'no'}.")
    # a calibrated CPU node's ranks talk through the kernel's loopback, not NVLink
    intra = ("loopback (gloo)" if cluster.cores_per_node else
             "NVLink" if gpu.nvlink_bandwidth_Bps > 64e9 else "PCIe")
    if layout.tp > 1:
        link = axis_link(layout, "tp", cluster)
        where = "across nodes (slow)" if link.crosses_nodes else f"inside one node over {intra}"
        lines.append(
            f"TP={layout.tp} lives {where} at {link_speed(link, cluster)}: its 4 "
            f"collectives per layer per microbatch and pass move {_s(time, 'tp_total')} s of "
            f"traffic per step, {_s(time, 'tp')} s ({time['tp'] / time['step']:.0%}) of it "
            f"exposed, paid for by splitting every matrix {layout.tp} ways.")
    elif not best.fits:
        lines.append(f"No TP, and this layout does not fit: it {too_big_reason(best)}.")
    else:
        others = [name for name, on in (("cp", layout.cp > 1), ("ep", layout.ep > 1)) if on]
        lines.append(f"No TP: {_whole_matrices(layout)} ({best.memory['total'] / GB:.1f} of "
                     f"{limit:.1f} GB per GPU), so no TP collectives sit on the critical path"
                     + (f" (the per-layer exchanges of {' and '.join(others)} are below)."
                        if others else "."))
    if layout.cp > 1:
        lines.append(context_line(best, cluster, intra))
    if cfg.is_moe:
        lines.append(expert_line(cfg, best, result, cluster, intra, expert_imbalance,
                                 precision))
    if layout.pp > 1:
        link = axis_link(layout, "pp", cluster)
        lines.append(
            f"PP={layout.pp} stages {'across nodes' if link.crosses_nodes else 'in the node'}"
            f" ({layout.schedule}, M={layout.microbatches}"
            f"{f', v={layout.virtual_stages}' if layout.virtual_stages > 1 else ''}): only "
            f"point-to-point sends ({_s(time, 'pp')} s) and a bubble of {_s(time, 'bubble')} s "
            f"({time['bubble'] / time['step']:.1%} of the step).")
    global_batch = best.micro_batch * layout.dp * layout.microbatches

    def price(estimate: Estimate, changed: Cluster) -> float:
        return evaluate(cfg, estimate.layout, changed, best.seq_len, global_batch,
                        runtime_precision(precision, estimate.layout.zero), overlap,
                        expert_imbalance).step_time_s

    if layout.zero_ranks > 1:  # dp, or dp x cp: every rank holding a parameter
        link = zero_link(layout, cluster)
        zero = f"ZeRO-{layout.zero}" if layout.zero else "no ZeRO"
        if layout.zero == 3 and layout.pp > 1:  # pipeline_parallel/zero3.py
            zero += (" (each chunk gathered per microbatch)" if layout.zero3_reshard == "forward"
                     else " (each chunk gathered once and kept for the step)")
        if layout.hybrid:
            lines.append(hybrid_line(best, cluster, intra, zero, lambda other: evaluate(
                cfg, other, cluster, best.seq_len, global_batch,
                runtime_precision(precision, other.zero), overlap, expert_imbalance)))
        else:
            lead = (f"DP={layout.dp} on top with {zero}" if layout.dp > 1 else
                    f"No DP; the CP={layout.cp} ranks hold the same parameters, with {zero}")
            if layout.dp > 1 and layout.cp > 1:
                lead += (f" (its sync over the dp x cp = {layout.zero_ranks} ranks holding each "
                         "parameter)")
            lines.append(
                f"{lead}: gradient sync moves "
                f"{_s(time, 'dp_total')} s of traffic over "
                f"{'the network' if link.crosses_nodes else intra} at "
                f"{link_speed(link, cluster)}, {_s(time, 'dp')} s of it exposed."
                + _hybrid_rival(cfg, cluster, best, result, link.crosses_nodes, precision,
                                overlap, expert_imbalance))
    mem = best.memory
    # used and capacity to the same digits: rounding keeps their order, so a layout that
    # fits never reads as more than the GPU holds
    lines.append(
        f"Memory per GPU {mem['total'] / GB:.1f} of {limit:.1f} GB at its peak, "
        f"{peak_moment(mem)} (params "
        f"{mem['params'] / GB:.1f}, grads {mem['grads'] / GB:.1f}, optimizer "
        f"{mem['optimizer'] / GB:.1f}, activations {mem['activations'] / GB:.1f}, buffers "
        f"{mem['buffers'] / GB:.1f}, reserved {mem['reserved'] / GB:.1f}, "
        f"recompute={layout.recompute}); {best.tokens_per_s:,.0f} tokens/s, MFU {best.mfu:.1%}.")
    if precision.fp8_recipe is not None:
        lines.append(fp8_line(best, cluster, evaluate(
            cfg, layout, cluster, best.seq_len, global_batch,
            dataclasses.replace(precision, fp8_recipe=None, fp8_weight_gather=False), overlap,
            expert_imbalance), precision))
    lines.append(assumptions_line(best, overlap_on(cluster, overlap), cluster.gpu, precision))
    band = error_band(cluster)
    lines += prediction_lines(best, result, band, cluster, price)
    if result is not None:
        lines += nearest_rivals(best, result, band, alternatives)
        lines += family_rivals(best, result, band, cluster.gpus_per_node, lines)
    return lines


def fp8_line(best: Estimate, cluster: Cluster, bf16: Estimate, precision: Precision) -> str:
    """What FP8 buys on the chosen layout: its step and activations against the same layout
    in bf16 (plan/fp8.py)."""
    layout = best.layout
    gathers = "" if not layout.zero or layout.zero_ranks == 1 else (
        f"; ZeRO gathers {'FP8' if precision.fp8_weight_gather else 'bf16'} weights")
    speedup = bf16.step_time_s / best.step_time_s
    return (f"FP8 ({precision.fp8_recipe} scales): the block linears (q/k/v, attention output, "
            f"MLP) run on FP8 tensor cores ({cluster.gpu.fp8_peak_flops / 1e12:,.0f} TFLOP/s "
            f"dense peak, {cluster.gpu.fp8_peak_flops / cluster.gpu.peak_flops:.0f}x bf16's), "
            "each paying an amax and a cast pass over its input, weight and output gradient; "
            "the LM head, router and attention core stay bf16. Step "
            f"{_s(best.time, 'step')} s against "
            f"{seconds(bf16.step_time_s, best.step_time_s)} s in bf16 on this "
            f"layout ({speedup:.2f}x{', FP8 does not pay here' if speedup < 1 else ''}), "
            f"activations {best.memory['activations'] / GB:.1f} GB against "
            f"{bf16.memory['activations'] / GB:.1f}{gathers}; MFU is counted against the "
            "bf16 peak.")


def assumptions_line(best: Estimate, overlap: Overlap, gpu: GPU | None = None,
                     precision: Precision = MIXED_ADAM) -> str:
    """What the price assumed hidden and what exposed (`Overlap`, and the runtime's own
    switches on `gpu`: TP overlap, the parameter all-gather), for the axes the layout uses,
    and the memory it kept free: the reserve and what is left under the capacity."""
    layout = best.layout
    pipelined_tp = (gpu is not None and gpu.tp_comm_overlap == "all"
                    and layout.sequence_parallel)
    calls = {"dp": ("the gradient sync", "the backward (but for its last bucket)",
                    layout.dp * layout.cp > 1 and layout.zero < 3),
             "tp": (("every TP collective", "the GEMM beside it") if pipelined_tp else
                    ("TP's backward collectives", "the weight-gradient GEMMs"))
             + (layout.tp > 1,),
             "zero3_prefetch": ("ZeRO-3's gathers and reduce-scatters", "a layer's compute",
                                layout.zero == 3 and layout.zero_ranks > 1),
             "cp": ("the K/V exchange", "attention", layout.cp > 1),
             "pp": ("the pipeline's sends", "compute", layout.pp > 1)}
    used = {name: call for name, call in calls.items() if call[2]}
    hidden = [f"{what} behind {behind}" for name, (what, behind, _) in used.items()
              if getattr(overlap, name)]
    exposed = [what for name, (what, _, _) in used.items() if not getattr(overlap, name)]
    if layout.tp > 1 and not (pipelined_tp and overlap.tp):
        exposed.append("TP's forward collectives")
    if layout.zero in (1, 2) and layout.dp * layout.cp > 1:
        if gpu is not None and gpu.param_gather_overlap and overlap.dp:
            hidden.append("ZeRO's parameter all-gather behind the next step's forward")
        else:
            exposed.append("ZeRO's parameter all-gather after the step")
    parts = []
    if layout.recompute == "full" and gpu is not None:
        first = layout.recompute_layers
        which = (f"the first {'block' if first == 1 else f'{first} blocks'} of each model "
                 "chunk (the block method), each its" if layout.recompute_method == "block"
                 else "each checkpointed block's")
        parts.append(f"Recomputed in the backward: {which} " + (
            "forward, a dense block's but for its down projection (the runtime's checkpoint "
            "stops once the tensors the backward reads are rebuilt)"
            if reruns_needed(gpu) and precision.fp8_recipe is None else "whole forward"))
    if hidden:
        parts.append(f"Assumed hidden: {', '.join(hidden)} (each hidden second still costs "
                     f"{overlap.contention:.0%} of itself, for the SMs and bandwidth shared)")
    if exposed:
        parts.append(f"{'exposed' if hidden else 'Assumed exposed'}: {', '.join(exposed)}")
    mem, limit = best.memory, best.memory_limit_bytes
    free = limit - mem["total"]
    headroom = (f"Headroom: {mem['reserved'] / GB:.1f} GB reserved for the runtime, and "
                f"{free / GB:.1f} GB ({free / limit:.1%}) of the GPU left free"
                if free >= 0 else f"Headroom: none, it needs {-free / GB:.1f} GB more")
    if 0 <= free < MEMORY_BAND * limit:
        margin = limit * (1 - 2 * MEMORY_BAND)  # twice the error left free
        places = 2 if margin < 10 * GB else 0
        margin = math.floor(margin / GB * 10**places) / 10**places
        headroom += (f", less than the memory forecast's own error ({MEMORY_BAND:.1%} of "
                     "measured peaks): measure its peak before a long run" + (
                         f", or plan with --memory-gb {margin:.{places}f} for layouts that "
                         "leave a margin" if margin * GB > mem["reserved"] else ""))
    return "; ".join(parts) + (". " if parts else "") + headroom + "."


def _s(time: dict[str, float], key: str) -> str:
    """A part of a step's time, to the places its step is shown to (`units.seconds`)."""
    return seconds(time[key], time["step"])


def _whole_matrices(layout: Layout) -> str:
    """How a layout without TP holds the model: split into stages, sharded or replicated."""
    over = (f"groups of {layout.shard_size} dp ranks" if layout.hybrid
            else f"dp={layout.dp}") + (f" x cp={layout.cp}" if layout.cp > 1 else "")
    sharded = {0: "", 1: f", ZeRO-1 sharding the optimizer states over {over}",
               2: f", ZeRO-2 sharding the optimizer states and gradients over {over}",
               3: f", ZeRO-3 sharding weights, gradients and optimizer states over {over}"}
    if layout.pp > 1:
        return (f"the model is split into {layout.pp} pipeline stages (by layers, not "
                f"matrices){sharded[layout.zero]}")
    whole = ("fits sharded" if layout.zero == 3 else
             f"fits with its dense weights whole on every GPU and its experts split over "
             f"ep={layout.ep}" if layout.ep > 1 else "fits with whole weights on every GPU")
    return f"the model {whole}{sharded[layout.zero]}"


def hybrid_line(best: Estimate, cluster: Cluster, intra: str, zero: str,
                judge: Callable[[Layout], Estimate]) -> str:
    """Hybrid sharding: where the shard group and its copies live, what each moves, and the
    same layout sharded over every dp rank beside it."""
    layout, time = best.layout, best.time
    shard = zero_link(layout, cluster)
    across = copies_link(layout, cluster)
    assert across is not None  # a hybrid layout has copies
    width = layout.zero_ranks * layout.tp
    where = ("across nodes" if shard.crosses_nodes else f"inside one node over {intra}")
    plain = judge(layout.replace(dp_shard=0))
    versus = plain.step_time_s / best.step_time_s - 1
    saved = (best.memory["total"] - plain.memory["total"]) / GB
    return (f"DP={layout.dp} on top with {zero} sharded within groups of "
            f"{_shard_group(layout)} ({width} consecutive GPUs with tp={layout.tp}"
            f"{f' and cp={layout.cp}' if layout.cp > 1 else ''}, {where}), replicated "
            f"{layout.replicas} times: each rank's gradient shard is all-reduced across its "
            f"{layout.replicas} copies over "
            f"{'the network' if across.crosses_nodes else intra} at "
            f"{link_speed(across, cluster)}; gradient sync moves {_s(time, 'dp_total')} s of "
            f"traffic, {_s(time, 'dp')} s of it exposed. Sharding over all {layout.dp} dp "
            f"ranks instead would hold {saved:.1f} GB less per GPU and take {versus:+.1%} "
            f"per step.")


def _shard_group(layout: Layout) -> str:
    """A ZeRO shard group's ranks: its dp ranks, times cp (ZeRO shards over dp x cp)."""
    if layout.cp == 1:
        return f"{layout.shard_size} dp ranks"
    return (f"{layout.shard_size * layout.cp} ranks ({layout.shard_size} dp x "
            f"{layout.cp} cp)")


def _hybrid_rival(cfg: ModelConfig, cluster: Cluster, best: Estimate,
                  result: SearchResult | None, crosses_nodes: bool, precision: Precision,
                  overlap: Overlap, expert_imbalance: float) -> str:
    """For a plain ZeRO layout whose dp group spans nodes: the fastest layout of its shape
    and stage with hybrid sharding, searched among the search's choices (whose own search
    skips what its answer does not show: `prune.py`)."""
    if result is None or not crosses_nodes or not best.layout.zero:
        return ""
    layout = best.layout
    shape = dataclasses.replace(result.constraints, dp=layout.dp, tp=layout.tp, pp=layout.pp,
                                cp=layout.cp, ep=layout.ep, zero=layout.zero, dp_shard=None)
    batch = best.micro_batch * layout.dp * layout.microbatches
    twins = search(cfg, cluster, best.seq_len, batch, shape, precision, overlap,
                   expert_imbalance, exhaustive=True)
    twin = next((e for e in twins.ranked if e.layout.hybrid), None)
    if twin is None:
        return ""
    return (f" With ZeRO-{layout.zero} sharded within groups of {_shard_group(twin.layout)} "
            f"instead (hybrid sharding, one copy per group) its best variant, "
            f"{twin.layout}, is {twin.step_time_s / best.step_time_s - 1:+.1%} at "
            f"{twin.memory['total'] / GB:.1f} GB per GPU.")


def context_line(best: Estimate, cluster: Cluster, intra: str) -> str:
    """What context parallelism buys (activations 1/cp, no per-layer collective over the
    hidden size) and pays (the K/V exchange, and how much of it the ring hides)."""
    layout, time = best.layout, best.time
    link = axis_link(layout, "cp", cluster)
    chunk = best.seq_len // (2 * layout.cp)
    how = {"ring": "a ring of K/V blocks whose hops hide behind each step's attention",
           "all_gather": "an all-gather of K/V before attention",
           "all_to_all": "all-to-alls of q, k, v and the output around attention, which "
                         "runs the whole sequence for heads/cp heads (DeepSpeed-Ulysses)",
           }[layout.cp_attention]
    if layout.cp_a2a > 1:  # two-level cp (parallel/context/hierarchical.py)
        how = (f"an all-to-all of heads inside groups of {layout.cp_a2a} ranks, then {how} "
               f"across the {layout.cp // layout.cp_a2a} groups on chunks {layout.cp_a2a}x "
               "longer")
    skew = imbalance(best.seq_len, layout.cp)
    return (f"CP={layout.cp} splits each {best.seq_len}-token sequence into {2 * layout.cp} "
            f"chunks of {chunk} (zig-zag: each rank holds 2, and computes {skew:.2f}x the mean "
            f"attention pairs, balance.pairs_per_rank), so activations are those of "
            f"{best.seq_len // layout.cp} tokens per rank (more TP would split them too, but "
            f"with blocking collectives of the hidden size every layer; recomputation with "
            f"a forward again); it pays {how}, over "
            f"{'the network' if link.crosses_nodes else intra}: {_s(time, 'cp_total')} s of "
            f"traffic per step, {_s(time, 'cp')} s ({time['cp'] / time['step']:.0%}) exposed.")


def expert_line(cfg: ModelConfig, best: Estimate, result: SearchResult | None,
                cluster: Cluster, intra: str, imbalance: float, precision: Precision) -> str:
    """Where expert parallelism lives and why: the experts' states it divides by ep against
    the four all-to-alls per MoE block per microbatch it pays, on the link its group spans."""
    layout, time = best.layout, best.time
    experts = cfg.n_moe_layers * cfg.n_experts * cfg.expert_params() / layout.pp
    whole = experts * precision.total_bytes / GB  # a mean stage's experts on one GPU, no EP
    replicas = layout.zero_ranks // layout.ep
    held = sum(model_state_bytes(round(experts / (layout.ep * layout.etp)), replicas,
                                 layout.zero, precision).values()) / GB
    split = " " + experts_over_tp(cfg, layout) if layout.tp > 1 else ""
    if time.get("tp_grads"):  # experts on sequence shards: their gradients summed over tp
        split += f" That sum takes {_s(time, 'tp_grads')} s a step, exposed."
    if layout.ep == 1:
        rival = next((e for e in (result.ranked if result else []) if e.layout.ep > 1), None)
        versus = (f"; the best layout with EP, {rival.layout}, is "
                  f"{rival.step_time_s / best.step_time_s - 1:+.1%}" if rival else "")
        sharded = (f"; ZeRO-{layout.zero} over its {replicas} replicas leaves {held:.1f} GB of "
                   "them per GPU, which fits" if layout.zero and replicas > 1 else ", which fit")
        share = "all" if layout.etp == 1 else f"1/{layout.etp} of each of the"
        return (f"EP=1: every rank holds {share} {cfg.n_experts} experts of its blocks (about "
                f"{whole / layout.etp:.1f} GB of states per GPU before ZeRO{sharded}), so no "
                f"token leaves its rank{versus}.{split}")
    link = ep_link(layout, cluster)
    where = ("across nodes, over the network" if link.crosses_nodes else
             f"inside one node over {intra}")
    return (f"EP={layout.ep} lives {where} (its {layout.ep} ranks are consecutive members of "
            f"a dp x cp group, {layout.tp * layout.ep} ranks wide with tp={layout.tp}): each "
            f"rank holds {cfg.n_experts // layout.ep} of the {cfg.n_experts} experts of every "
            f"MoE block, so a stage's expert states take {held:.1f} GB per GPU instead of "
            f"{whole:.1f} GB (1/{layout.ep * layout.etp}, ZeRO-{layout.zero} over their {replicas} "
            f"expert-data-parallel replicas); it pays 4 all-to-alls per MoE block per "
            f"microbatch (dispatch and combine, forward and backward; busiest rank at "
            f"{imbalance:g}x the mean load), {_s(time, 'ep_total')} s per step, all exposed "
            f"({time['ep'] / time['step']:.0%} of the step).{split}")


def link_speed(link: Link, cluster: Cluster) -> str:
    """A link's speed as datasheets state it (per GPU or per NIC, one direction), then what
    the model expects collectives to reach on it (after `link_efficiency`), or the
    calibrated figure."""
    bandwidth, _ = link.cost("all_reduce")
    if link.measured:
        return f"{bandwidth / GB:.3g} GB/s per rank (measured by a calibration)"
    efficiency = cluster.gpu.link_efficiency
    if not link.crosses_nodes:
        return (f"{link.datasheet_Bps / GB:.3g} GB/s per GPU each way ({bandwidth / GB:.3g} "
                f"GB/s achieved at link_efficiency {efficiency:g})")
    nics = cluster.nics_per_node or cluster.gpus_per_node
    nic = cluster.inter_node_bandwidth_Bps
    shared = ("one per GPU" if nics >= cluster.gpus_per_node else
              f"shared by its {cluster.gpus_per_node} GPUs, whose groups all cross them at "
              f"once: {nic * nics / cluster.gpus_per_node / GB:.3g} GB/s each")
    return (f"the node's {nics} NIC{'s' if nics > 1 else ''} x {nic / GB:.3g} GB/s each way "
            f"({shared}), for the group's {link.per_node} member(s) per node "
            f"({link.algorithm} algorithm; a ring reaches {bandwidth / GB:.3g} GB/s at "
            f"link_efficiency {efficiency:g})")
