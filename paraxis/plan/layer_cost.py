"""Price one transformer layer on one GPU per microbatch: its compute, forward and backward,
and the TP, CP and EP communication on its critical path (`layer_times`), the parts
`cost.evaluate` adds up over a stage's layers; a dense block's, an MoE block's and the head's
once per search setting (`block_times`)."""

from __future__ import annotations

from paraxis.plan.comm import axis_link, tp_collectives_per_layer
from paraxis.plan.compute import (
    BACKWARD_FLOPS_RATIO,
    layer_forward_flops_per_token,
    layer_forward_traffic_per_token,
    layer_forward_traffic_per_token_eager,
    layer_kernels,
)
from paraxis.plan.context import exchange_times, imbalance, kernel_pieces
from paraxis.plan.experts import (
    DEFAULT_IMBALANCE,
    all_to_all_times,
    busiest_load,
    feed_forward,
    moe_forward_seconds,
    rank_imbalance,
    routing_share,
    sequence_shard_dispatch,
    shard_dispatch_times,
    with_routing_calls,
)
from paraxis.plan.fp8 import layer_linears_seconds
from paraxis.plan.hardware import GPU, Cluster
from paraxis.plan.head import embedding_tp_times, head_times
from paraxis.plan.rates import (
    DEFAULT_OVERLAP,
    Overlap,
    attention_kernel_rate,
    down_projection_seconds,
    layer_rates,
    overlap_on,
    weight_gemm_seconds,
)
from paraxis.plan.sync_wait import after_backward, at_segment, sync_segment_s
from paraxis.plan.tp_layer import tp_layer_exposed_time, tp_layer_time
from paraxis.spec.kernels import AttentionKernel, get_kernel
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import ModelConfig
from paraxis.spec.precision import MIXED_ADAM, Precision


def _core_times(scores: float, score_bytes: float, gemm_rate: float, measured_rate: float,
                hbm: float, measured: bool, kernel: AttentionKernel,
                peak: float = float("inf"), kernel_rate: float = 0.0) -> tuple[float, float]:
    """(forward, backward) seconds per token of the attention core. A measured rate
    (a calibration, `paraxis.train.calibrate.kernels.attention_rate`) is in the planner's count,
    3 x `scores` forward + backward, and cannot beat the kernel's own FLOPs at `peak` (the
    cap keeps MFU <= 1 whatever a profile says). Else a fitted `kernel_rate` (the named flash
    implementation at this shape, `rates.attention_kernel_rate`) is in the kernel's own
    count: the score entries it computes (flash skips the causal mask's upper half), forward
    and backward at one rate (the charts time them together). Unfitted, the core runs at the
    GEMM rate on those entries, with its backward ratio; the math kernel also moves its
    scores through memory (`score_bytes`)."""
    traffic = score_bytes / hbm if kernel.keeps_scores else 0.0
    if measured:
        work = kernel.causal_fraction * (1 + kernel.backward_ratio) / 3  # per counted FLOP
        rate = min(measured_rate, peak / work)
        return scores / rate + traffic, 2 * (scores / rate + traffic)
    forward = kernel.causal_fraction * scores / (kernel_rate or gemm_rate)
    return forward + traffic, kernel.backward_ratio * forward + 2 * traffic


def runtime_dropout(cfg: ModelConfig, gpu: GPU) -> bool:
    """Whether the runtime's blocks have dropout (its masks kept, its kernels run): Megatron's
    ("fused") GPT blocks do; paraxis's, eager or compiled, have none."""
    return cfg.style == "gpt2" and gpu.megatron_runtime


def layer_times(cfg: ModelConfig, layout: Layout, cluster: Cluster, seq_len: int,
                micro_batch: int, overlap: Overlap = DEFAULT_OVERLAP,
                precision: Precision = MIXED_ADAM, moe: bool = False,
                expert_imbalance: float = DEFAULT_IMBALANCE,
                routing_calls: bool = True) -> dict[str, float]:
    """Seconds one transformer layer takes on one GPU per microbatch.

    Keys: forward / backward (compute; backward includes recomputation), tp_forward /
    tp_backward (TP communication on the critical path; a full recomputation reruns the
    forward's), tp_total (all TP traffic, hidden or not), cp_forward / cp_backward / cp_total
    likewise for context parallelism's K/V exchange (`plan/context.py`).

    With cp > 1 a rank holds s/cp tokens of each sequence, each attending to keys across the
    whole sequence: the dense work is priced on those tokens, the attention core at the full
    sequence's scores per token, times the split's imbalance (1.0 for the zig-zag split).

    With `moe`, a mixture-of-experts block: its attention half as above, its experts on the
    busiest EP rank (`expert_imbalance` x the mean rows with ep > 1; of 1/tp of the tokens
    where each tp rank routes its own shard) and its all-to-alls (`plan/experts.py`), keys
    ep_forward / ep_backward / ep_total, with its routing's small calls unless
    `routing_calls` is False
    (`experts.with_routing_calls` adds them: all else here reads the rank grid only through
    groups that do not change with the dp or pp degree)."""
    gpu, overlap = cluster.gpu, overlap_on(cluster, overlap)
    expert_imbalance = rank_imbalance(layout, expert_imbalance)
    tokens = micro_batch * seq_len // layout.cp
    rate, attention_rate, hbm = layer_rates(cluster, layout.tp)
    _, scores = layer_forward_flops_per_token(cfg, seq_len)
    act = precision.activation_bytes
    mlp = not moe  # an MoE block's feed-forward half is priced by plan/experts.py
    if gpu.kernels == "eager":
        hidden_bytes = act * layer_forward_traffic_per_token_eager(cfg, layout.tp, mlp)
        score_bytes = 0.0  # the attention kernel's own traffic is in its measured rate
    else:
        hidden_bytes, score_bytes = (b * act / 2 for b in layer_forward_traffic_per_token(
            cfg, seq_len, layout.tp, layout.sequence_parallel, mlp,
            runtime_dropout(cfg, gpu)))  # in 16-bit bytes
    # the context-parallel kernels are flash (paraxis/parallel/context/kernel.py)
    kernel = get_kernel("flash" if layout.cp > 1 else gpu.attention_kernel)
    fitted = attention_kernel_rate(cluster, kernel, seq_len, cfg.head_dim,
                                   kernel_pieces(layout), layout.tp)
    core_forward, core_backward = (imbalance(seq_len, layout.cp) * t for t in _core_times(
        scores, score_bytes, rate, attention_rate, hbm, gpu.attention_flops > 0, kernel,
        gpu.peak_flops * layout.tp * cluster.compute_share, fitted))
    gemms = weight_gemm_seconds(cfg, cluster, layout.tp, rate, mlp) * tokens
    gemms_backward = bf16_backward = BACKWARD_FLOPS_RATIO * gemms
    if precision.fp8_recipe is not None:  # the block linears on FP8 tensor cores, with their casts
        # where ZeRO-3 gathers FP8 weights, each rank casts its shard before the gather
        gathered = layout.zero == 3 and precision.fp8_weight_gather
        shard = layout.zero_ranks if gathered else 1
        gemms, gemms_backward = layer_linears_seconds(cfg, cluster, precision, layout.tp,
                                                      tokens, hbm, mlp, 1 / shard, gathered)
    dense = hidden_bytes / hbm * tokens
    routed = tokens / routing_share(cfg, layout) if moe else tokens  # an MoE block's
    if moe:
        dense += moe_forward_seconds(cfg, cluster, routed, expert_imbalance, hbm, layout.etp,
                                     precision, layout.ep)
    if cluster.cores_per_node and gpu.kernels == "eager":
        # Eager dispatch, per layer per microbatch (a calibrated one-token pass, a third in
        # the forward as its FLOPs are): CPU work, time-shared like the kernels.
        dense += gpu.layer_overhead_s / 3 / cluster.compute_share
    forward = gemms + dense + core_forward * tokens
    # A full recomputation reruns the forward, or where the runtime stops once the tensors
    # the backward reads are rebuilt (`reruns_needed`), all of a dense block but its down
    # projection, whose input is the last tensor the block saves (and the residual add after
    # it, not priced apart); of a grouped checkpoint only the last block stops short. An FP8
    # linear is an autograd Function, which saves its inputs once its GEMM has run: the
    # rerun stops after it.
    early = not moe and reruns_needed(gpu) and precision.fp8_recipe is None
    rerun = forward - (down_projection_seconds(cfg, cluster, layout.tp, rate) * tokens
                       / layout.checkpoint_group if early else 0.0)
    recompute = {"none": 0.0, "full": rerun,
                 "selective": core_forward * tokens}[layout.recompute]
    # Backward = 2x forward (Narayanan et al. 2021 App.), the attention core's as its kernel
    # has it, plus the recomputed forward.
    backward = gemms_backward + BACKWARD_FLOPS_RATIO * dense + core_backward * tokens + recompute
    # the passes on the GPU and, where it prices them, on the host (before a rerun's)
    pass_times = {"gpu_forward": forward, "gpu_backward": backward - recompute,
                  "gpu_rerun": rerun, "host_forward": 0.0, "host_backward": 0.0}
    if gpu.kernel_launch_s and not cluster.cores_per_node:
        # The host issues the layer's kernels ahead of the GPU (GPU.kernel_launch_s): a pass
        # takes the longer of its GPU time and its launches, a third of them forward (as its
        # FLOPs are), the rerun forward's again in the backward. Small microbatches run
        # host-bound, so the microbatch size is priced.
        host = layer_kernels(cfg, gpu.kernels) * gpu.kernel_launch_s
        host_forward, host_backward = host / 3, 2 * host / 3
        pass_times.update(host_forward=host_forward, host_backward=host_backward)
        if layout.recompute == "full":
            host_backward += host_forward
        forward, backward = max(forward, host_forward), max(backward, host_backward)

    link = axis_link(layout, "tp", cluster)
    backward_link = axis_link(layout, "tp", after_backward(cluster))  # CPU: plan/sync_wait.py
    boundary_bytes = act * tokens * cfg.d_model  # activations s*b*h
    # Weight-gradient GEMM of each column-parallel linear (QKV; MLP-in, gate + up for SwiGLU;
    # split experts': over the busiest rank's rows and the shared experts): the window its
    # backward collective hides in. Whole experts sit outside the TP region: no window.
    ffn = feed_forward(cfg, layout) if moe else "split"
    mlp_in = (2 * cfg.d_ff_expert * (cfg.top_k * busiest_load(cfg, expert_imbalance)
                                     + cfg.n_shared_experts) if moe
              else cfg.d_ff * (1 if cfg.style == "gpt2" else 2))
    widths = (cfg.d_model + 2 * cfg.kv_dim, mlp_in)[:1 if ffn != "split" else 2]
    windows = tuple(2 * tokens * cfg.d_model * width / rate * gemms_backward / (bf16_backward or 1)
                    for width in widths)  # shorter where the GEMMs run in FP8
    regather = gpu.megatron_runtime  # Megatron re-gathers SP inputs in the backward
    # TP collectives pipelined with the GEMMs beside them, forward too (GPU.tp_comm_overlap
    # "all"): the row-parallel GEMMs' windows, attention's output projection and MLP-out
    row_windows = (2 * tokens * cfg.d_model * cfg.d_model / rate,
                   2 * tokens * cfg.d_model * cfg.d_ff / rate
                   ) if gpu.tp_comm_overlap == "all" and ffn == "split" and not moe else (
        (2 * tokens * cfg.d_model * cfg.d_model / rate,) if gpu.tp_comm_overlap == "all"
        else ())
    tp_forward, tp_backward = tp_layer_exposed_time(
        boundary_bytes, layout.tp, layout.sequence_parallel, link, windows, overlap.tp,
        overlap.contention, regather, backward_link, ffn, row_windows)
    # the rerun forward's collectives block the backward again; stopped early, all but the
    # down projection's (its output's all-reduce, or reduce-scatter under SP)
    calls = sum(tp_collectives_per_layer(layout.sequence_parallel, ffn)["forward"].values())
    rerun_calls = (calls - 1) / calls if early and calls else 1.0
    passes = 2 + rerun_calls if layout.recompute == "full" else 2
    if layout.recompute == "full":
        tp_backward += tp_forward * rerun_calls
    tp_total = tp_layer_time(boundary_bytes, layout.tp, layout.sequence_parallel, link,
                             passes, regather, backward_link, ffn) if layout.tp > 1 else 0.0
    cp = exchange_times(cfg, layout, cluster, seq_len, micro_batch, act, core_forward * tokens,
                        core_backward * tokens, overlap.contention if overlap.cp else 1.0)
    if layout.recompute != "none":  # the rerun attention core exchanges again
        rerun = "forward" if layout.recompute == "full" else "rerun"
        cp["backward"] += cp[rerun]
        cp["total"] += cp[rerun + "_total"]
    ep = all_to_all_times(cfg, layout, cluster, routed, act, expert_imbalance) if moe else {
        "forward": 0.0, "backward": 0.0, "total": 0.0}
    if moe and sequence_shard_dispatch(cfg, layout, cluster):
        ep = shard_dispatch_times(cfg, layout, cluster, routed, act, expert_imbalance, link,
                                  boundary_bytes)
    if layout.recompute == "full":
        ep["backward"] += ep["forward"]  # the rerun forward dispatches and combines again
        ep["total"] += ep["forward"]
    times = {"forward": forward, "backward": backward, "tp_forward": tp_forward,
             "tp_backward": tp_backward, "tp_total": tp_total, "cp_forward": cp["forward"],
             "cp_backward": cp["backward"], "cp_total": cp["total"],
             "ep_forward": ep["forward"], "ep_backward": ep["backward"], "ep_total": ep["total"],
             "core_forward": core_forward * tokens, "core_backward": core_backward * tokens,
             **pass_times}
    return with_routing_calls(cfg, layout, cluster, times) if moe and routing_calls else times


def block_key(layout: Layout, micro_batch: int, precision: Precision,
              cluster: Cluster) -> tuple:
    """What layer_times and head_times read of the layout: the grid, SP, CP variant and its
    levels, recompute (and a full one's blocks per checkpoint: only a group's last block
    stops its rerun short), where FP8 weights are cast on ZeRO-3's shards, their group, and
    where the fused head and loss are asked for, whether ZeRO-3 keeps them from running."""
    return ((layout.pp, layout.dp, layout.cp, layout.tp), layout.ep, layout.etp,
            layout.sequence_parallel, layout.cp_attention, layout.cp_a2a, layout.recompute,
            layout.checkpoint_group, micro_batch, layout.zero_ranks if layout.zero == 3
            and precision.fp8_recipe is not None and precision.fp8_weight_gather else 1,
            cluster.gpu.loss_kernel == "fused-linear" and layout.zero == 3)


def half_layer_s(cfg: ModelConfig, layout: Layout, cluster: Cluster, seq_len: int,
                micro_batch: int) -> float:
    """CPU ranks: a layer's calls wait after half a layer's forward on one TP rank
    (plan/sync_wait.py)."""
    tokens = micro_batch * seq_len // layout.cp
    return sync_segment_s(cfg, tokens / layout.tp, cluster.gpu.peak_flops)


def block_times(cfg: ModelConfig, layout: Layout, cluster: Cluster, seq_len: int,
                micro_batch: int, precision: Precision, overlap: Overlap,
                expert_imbalance: float, memo: dict, key: tuple | None = None
                ) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """(a dense block's, an MoE block's, the model's ends') times per microbatch
    (`layer_times`; `head_times` with `embedding_tp_times` as "embed_tp" and
    "embed_tp_total"), once per `block_key` in `memo`; all but an MoE block's routing calls
    once for every dp and pp degree (`layer_times`' `routing_calls`)."""
    key = block_key(layout, micro_batch, precision, cluster) if key is None else key
    if key not in memo:
        half_layer = half_layer_s(cfg, layout, cluster, seq_len, micro_batch)
        at = at_segment(cluster, half_layer)
        # what the blocks read of the grid beyond this: the tp, cp and ep groups, which lie
        # inside the dp x cp ranks of one stage, alike for every dp and pp
        shared = ("blocks", layout.cp, layout.tp, *key[1:])
        if shared not in memo:
            moe = layer_times(cfg, layout, at, seq_len, micro_batch, overlap, precision, True,
                              expert_imbalance, routing_calls=False) if cfg.is_moe else None
            # a model of MoE blocks only has no dense block to price (its rows count none)
            layer = None if cfg.n_moe_layers == cfg.n_layers else layer_times(
                cfg, layout, at, seq_len, micro_batch, overlap, precision)
            # the model's two ends: the head's times, and the embedding's TP collectives as
            # "embed_tp" and "embed_tp_total"
            ends = head_times(cfg, layout, at, micro_batch, seq_len, overlap, precision)
            ends.update({f"embed_{k}": v for k, v in embedding_tp_times(
                cfg, layout, at, micro_batch, seq_len, precision).items()})
            memo[shared] = (layer, moe, ends)
        layer, moe, head = memo[shared]
        if moe is not None:
            moe = with_routing_calls(cfg, layout, at, moe)
        memo[key] = (moe if layer is None else layer, layer if moe is None else moe, head)
    return memo[key]


def reruns_needed(gpu: GPU) -> bool:
    """Whether the runtime's full recomputation stops once the tensors the backward reads are
    rebuilt (`GPU.recompute_rerun`; "auto": paraxis's kernels, not Megatron's fused ones)."""
    return gpu.recompute_rerun == "needed" or (gpu.recompute_rerun == "auto"
                                               and not gpu.megatron_runtime)


def core_share_of_fastest(cfg: ModelConfig, layout: Layout, cluster: Cluster,
                          seq_len: int, memo: dict | None = None) -> float:
    """The fastest attention core any cp variant of `layout` runs, as a share of its own
    (1.0 without cp or a fitted kernel rate): the variants cut the sequence into different
    pieces (`context.kernel_pieces`: 1 for the all-to-all, cp/cp_a2a for the others), and a
    kernel's rate depends on its sequence (`rates.attention_kernel_rate`). Once per cp
    variant and tp degree in `memo` (a search's)."""
    if layout.cp == 1:
        return 1.0
    if memo is not None:
        key = ("core share", layout.cp, layout.cp_attention, layout.cp_a2a, layout.tp)
        if key not in memo:
            memo[key] = core_share_of_fastest(cfg, layout, cluster, seq_len)
        return memo[key]
    kernel = get_kernel("flash")
    own = attention_kernel_rate(cluster, kernel, seq_len, cfg.head_dim, kernel_pieces(layout),
                                layout.tp)
    if not own:
        return 1.0
    pieces = {layout.cp // a for a in range(1, layout.cp + 1) if layout.cp % a == 0}
    return own / max(attention_kernel_rate(cluster, kernel, seq_len, cfg.head_dim, p,
                                           layout.tp) for p in pieces)
