"""The planner prices context parallelism from the runtime's own counts (balance.py)."""

import time

import pytest

from paraxis.plan.activations import attention_kernel_bytes
from paraxis.plan.comm import axis_link
from paraxis.plan.context import MIN_CP_TOKENS, cp_layer_times, imbalance
from paraxis.plan.cost import Overlap, evaluate
from paraxis.plan.hardware import build_cluster
from paraxis.plan.layer_cost import layer_times
from paraxis.plan.search import Constraints, search
from paraxis.spec.cp_balance import pairs_per_rank, saved_bytes_per_rank
from paraxis.spec.kernels import workspace_bytes
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import PRESETS

LLAMA_8B = PRESETS["llama3-8b"]
LONG = 131072


def test_activation_memory_falls_as_one_over_cp() -> None:
    cluster = build_cluster("h100-sxm-80gb", 64, 8)
    base = None
    for cp in (1, 2, 4, 8):
        layout = Layout(dp=64 // (8 * cp), cp=cp, tp=8, sequence_parallel=True, zero=1,
                        microbatches=1)
        estimate = evaluate(LLAMA_8B, layout, cluster, 32768, 64 // (8 * cp))
        # the loss's chunk workspace is capped (paraxis.spec.kernels), the rest is per token
        workspace = workspace_bytes(32768 // cp, LLAMA_8B.vocab_size // 8)
        activations = estimate.memory["activations"] - workspace
        base = base or activations
        assert activations == pytest.approx(base / cp, rel=0.02)


@pytest.mark.parametrize("cp", [1, 2, 4, 8])
def test_saved_attention_bytes_match_the_runtime_count(cp: int) -> None:
    # what the planner charges the attention core for s/cp tokens against what the ring's
    # backward keeps (spec.cp_balance.saved_bytes_per_rank, checked with saved-tensor hooks
    # in tests/test_cp_attention.py): the same bytes
    cfg, batch, seq = LLAMA_8B, 2, 16384
    planner = attention_kernel_bytes(cfg, seq // cp, batch)
    runtime = saved_bytes_per_rank(batch, cfg.n_heads, cfg.n_kv_heads, seq, cfg.head_dim, cp,
                                   bytes_per_element=2)
    assert planner == pytest.approx(runtime, rel=1e-12)


def test_zigzag_split_leaves_no_imbalance_and_compute_falls_by_cp() -> None:
    assert imbalance(LONG, 16) == 1.0 and len(set(pairs_per_rank(LONG, 16))) == 1
    # The split's balance, on a kernel whose masked and unmasked blocks run at one rate at
    # these lengths (FA2's curves); the H100 preset's cuDNN runs a ring's unmasked blocks
    # faster than the masked whole (557 against 509 TFLOP/s at its plateaus, d = 128), a
    # property of the kernel, not of the split.
    cluster = build_cluster("h100-sxm-80gb", 16, 8, {"attention_impl": "fa2"})
    whole = layer_times(LLAMA_8B, Layout(dp=16), cluster, LONG, 1)
    split = layer_times(LLAMA_8B, Layout(cp=16), cluster, LONG, 1)
    assert split["forward"] == pytest.approx(whole["forward"] / 16, rel=0.01)
    assert split["backward"] == pytest.approx(whole["backward"] / 16, rel=0.01)


def test_ring_hides_the_exchange_behind_attention_and_all_gather_only_partly() -> None:
    cluster = build_cluster("h100-sxm-80gb", 16, 8)
    ring = layer_times(LLAMA_8B, Layout(cp=16), cluster, LONG, 1)
    gather = layer_times(LLAMA_8B, Layout(cp=16, cp_attention="all_gather"), cluster, LONG, 1)
    exposed = ring["cp_forward"] + ring["cp_backward"]
    assert 0 < exposed < 0.5 * ring["cp_total"]
    # all-gather (parallel/context/all_gather.py): the forward gather and backward's
    # reduce-scatter hide behind the diagonal block, backward's gather is waited for at once
    gathered = gather["cp_forward"] + gather["cp_backward"]
    assert exposed < gathered < gather["cp_total"]
    link = axis_link(Layout(cp=16), "cp", cluster)
    direct = cp_layer_times(LLAMA_8B, "all_gather", 16, 1, LONG, 1, 2, link, 1.0, 2.0, 0.0)
    # with a long window and no contention only backward's gather shows (of 2 gathers + RS)
    assert direct["forward"] == 0 and 0 < direct["backward"] < direct["total"] / 2
    # the same bytes either way (balance.sent_bytes_per_rank): a ring all-gather moves
    # (cp-1)/cp of the gathered tensor, as the cp-1 hops do
    assert gather["cp_total"] == pytest.approx(ring["cp_total"], rel=0.05)
    # short chunks: a hop outlasts its step's attention, and more of it shows
    short = layer_times(LLAMA_8B, Layout(cp=16), cluster, 8192, 1)
    assert (short["cp_forward"] + short["cp_backward"]) / short["cp_total"] > exposed / ring[
        "cp_total"]


def test_no_exchange_without_cp() -> None:
    times = cp_layer_times(LLAMA_8B, "ring", 1, 1, 4096, 1, 2, None, 1.0, 2.0, 0.2)
    assert times == dict.fromkeys(("forward", "backward", "total", "forward_total", "rerun",
                                   "rerun_total"), 0.0)


def test_states_shard_over_dp_times_cp() -> None:
    cluster = build_cluster("h100-sxm-80gb", 16, 8)
    four = evaluate(LLAMA_8B, Layout(dp=4, tp=4, zero=1, microbatches=4), cluster, 16384, 16)
    split = evaluate(LLAMA_8B, Layout(dp=2, cp=2, tp=4, zero=1, microbatches=8), cluster,
                     16384, 16)
    assert split.memory["optimizer"] == pytest.approx(four.memory["optimizer"])
    assert split.memory["params"] == pytest.approx(four.memory["params"])


@pytest.fixture(scope="module")
def long_search():
    """`paraxis plan --model llama3-8b --gpus 64 --seq-len 131072 --global-batch 64`."""
    cluster = build_cluster("a100-80gb", 64, 8)
    return cluster, search(LLAMA_8B, cluster, LONG, 64)


def test_long_sequences_pick_context_parallelism(long_search) -> None:
    result = long_search[1]
    best = result.ranked[0]
    assert best.layout.cp > 1 and best.fits
    without = next((e for e in result.ranked if e.layout.cp == 1), None)
    # without cp, 131072-token sequences fit only by deep model parallelism, much slower
    assert without is None or without.step_time_s > 1.1 * best.step_time_s
    assert LONG % (2 * best.layout.cp) == 0 and LONG // best.layout.cp >= MIN_CP_TOKENS


def test_short_sequences_do_not_try_context_parallelism() -> None:
    result = search(LLAMA_8B, build_cluster("a100-80gb", 64, 8), 4096, 256)
    assert all(e.layout.cp == 1 for e in result.ranked + [r.estimate for r in result.too_big
                                                          if r.estimate])


def test_a_fixed_cp_is_searched_around() -> None:
    result = search(LLAMA_8B, build_cluster("a100-80gb", 64, 8), 4096, 256, Constraints(cp=4))
    assert result.ranked and all(e.layout.cp == 4 for e in result.ranked)


def test_searching_1024_gpus_at_128k_tokens_stays_fast() -> None:
    cluster = build_cluster("h100-sxm-80gb", 1024, 8)
    # 3,644 layouts priced (2,810 of them too big at 128k tokens), 5,223 settings skipped on
    # their floors (plan/prune.py): 0.6-1.0 s of CPU on an AMD EPYC VM
    # (tools/probes/bench_plan.py times whole commands, target 2 s). CPU time, not wall
    # time: a host that takes the CPU away (steal) does not count. A process on the core's
    # sibling still slows this one's CPU time (its caches and execution units are shared),
    # so the faster of two searches is the one held to the bound, as timeit takes the best
    # of its repeats.
    elapsed = []
    for _ in range(2):
        start = time.process_time()
        result = search(PRESETS["llama3-405b"], cluster, LONG, 2048, workers=1)  # one process
        elapsed.append(time.process_time() - start)
        assert result.ranked and result.ranked[0].layout.cp > 1
    assert min(elapsed) < 6.0, f"search took {min(elapsed):.1f} s of CPU (best of two)"


def test_exposed_cp_shows_every_hop() -> None:
    cluster = build_cluster("h100-sxm-80gb", 16, 8)
    hidden = layer_times(LLAMA_8B, Layout(cp=16), cluster, LONG, 1)
    shown = layer_times(LLAMA_8B, Layout(cp=16), cluster, LONG, 1, Overlap(cp=False))
    assert shown["cp_forward"] + shown["cp_backward"] > hidden["cp_forward"] + hidden[
        "cp_backward"]
    # nothing hides: every hop of the forward, every K/V and dK/dV hop of the backward
    assert shown["cp_forward"] + shown["cp_backward"] == pytest.approx(shown["cp_total"])


def test_long_sequence_mfu_stays_below_the_peak(long_search) -> None:
    # `paraxis plan --model llama3-8b --gpus 64 --seq-len 131072 --global-batch 64` printed
    # MFU 102.3%: the time model priced the flash kernel's causal half of the scores while
    # the MFU counted the full square. Now both count the causal half (plan/compute.py).
    from paraxis.plan.compute import layer_forward_flops_per_token, model_flops_per_token
    from paraxis.spec.kernels import FLASH

    cluster, result = long_search
    best = result.ranked[0]
    assert all(e.mfu <= e.hfu <= 1.0 for e in result.ranked)
    peak = cluster.world_size * cluster.gpu.peak_flops
    # the full-square count of the same run would claim more than the peak (the old defect),
    # priced as when it was found: the core at the GEMM rate (attention_impl ""; at FA2's
    # measured rate, plan/attention_rates.py, the plan is slower and the claim just below)
    found_on = evaluate(LLAMA_8B, best.layout, build_cluster("a100-80gb", 64, 8, {
        "attention_impl": ""}), LONG, 64)
    assert model_flops_per_token(LLAMA_8B, LONG, causal=False) * found_on.tokens_per_s > peak
    assert found_on.mfu <= found_on.hfu <= 1.0
    # the compute time is at least the FLOPs the time model prices, at the peak: the GEMMs
    # (forward + two backward products) and what the flash kernel computes of the scores
    weights, scores = layer_forward_flops_per_token(LLAMA_8B, LONG)
    core = FLASH.causal_fraction * scores * (1 + FLASH.backward_ratio)
    priced = (LLAMA_8B.n_layers * (3 * weights + core)
              + 6 * LLAMA_8B.d_model * LLAMA_8B.vocab_size) * 64 * LONG
    assert best.layout.pp == 1 and best.time["compute"] >= priced / peak
    assert priced >= model_flops_per_token(LLAMA_8B, LONG) * 64 * LONG


def test_a_measured_attention_rate_cannot_beat_the_peak() -> None:
    # a profile whose attention rate (in the planner's count) outruns what the kernel's own
    # FLOPs allow at the peak is capped there: MFU stays <= 1 whatever it says
    fast = build_cluster("a100-80gb", 16, 8, {"attention_flops": 10 * 312e12})
    estimate = evaluate(LLAMA_8B, Layout(cp=16), fast, LONG, 1)
    assert estimate.mfu <= estimate.hfu <= 1.0


def test_paraxis_plan_accepts_llama3_long_context_layout(capsys) -> None:
    # Llama 3 405B's 128K stage (Dubey et al. 2024 Table 4) as `paraxis plan` evaluates it:
    # all-gather CP over 16 ranks beside TP 8 and PP 16 (the held-out row picks its
    # interleaving depth; the command refuses depths that do not divide 126 layers)
    import json

    from paraxis.cli import main

    # Its FSDP reduce-scatters every microbatch's gradients under the pipeline; paraxis's
    # runtime would hold the stage's whole fp32 gradients until the step's end instead.
    def plan(*reduce: str) -> dict:
        code = main(["plan", "--model", "llama3-405b", "--gpus", "16384", "--gpu",
                     "h100-sxm-80gb", "--network-gbps", "50", "--seq-len", "131072",
                     "--global-batch", "128", "--precision", "bf16-fp32grad", "--json",
                     *reduce, "--layout",
                     "dp=8,tp=8,pp=16,cp=16,zero=2,microbatches=16,sequence_parallel=true,"
                     "cp_attention=all_gather"])
        doc = json.loads(capsys.readouterr().out)
        layout = doc["layouts"][0]
        assert code == (0 if layout["fits"] else 1) and doc["mode"] == "evaluate"
        return layout

    only = plan("--pipeline-zero2-reduce", "microbatch")
    assert only["fits"] and only["layout"]["cp_attention"] == "all_gather"
    assert 0 < only["mfu"] <= only["hfu"] <= 1 and only["time_s"]["cp"] > 0
    assert not plan()["fits"]


# ----------------------------------------------------------- all-to-all (Ulysses) variant


def test_all_to_all_moves_q_kv_and_output_and_hides_none_of_it() -> None:
    from paraxis.plan.comm import collective_time
    from paraxis.spec.cp_balance import sent_bytes_per_rank

    cluster = build_cluster("h100-sxm-80gb", 16, 8)
    link = axis_link(Layout(cp=8), "cp", cluster)
    times = cp_layer_times(LLAMA_8B, "all_to_all", 8, 1, LONG, 1, 2, link, 1.0, 2.0, 0.0)
    forward, backward = sent_bytes_per_rank("all_to_all", 1, LLAMA_8B.n_heads,
                                            LLAMA_8B.n_kv_heads, LONG, LLAMA_8B.head_dim, 8, 2)
    # q (32 heads) + k, v (8 each) over, the output (32) back: 80 head-widths of s/cp tokens
    head = (LONG // 8) * LLAMA_8B.head_dim * 2
    assert forward == backward == 80 * head
    # each call keeps 1/8 of its input on the rank (the runtime's record counts the input)
    qkv = collective_time("all_to_all", 48 * head * 7 / 8, 8, link)
    one_way = qkv + collective_time("all_to_all", 32 * head * 7 / 8, 8, link)
    # however long the attention core (1 s, 2 s here), nothing hides: the kernel needs it all
    assert (times["forward"], times["backward"], times["total"]) == (
        one_way, one_way, 2 * one_way)
    # selective recompute reruns the core until its saved tensors are back: q, k, v only
    assert (times["rerun"], times["forward_total"]) == (qkv, one_way)


def test_recomputation_counts_the_rerun_exchange_in_the_traffic() -> None:
    # found by a review: the exposed CP time (9.05 s) exceeded the CP traffic (6.03 s) under
    # selective recompute, whose rerun exchange was added to the one and not the other
    cluster = build_cluster("h100-sxm-80gb", 16, 8)
    for variant in ("ring", "all_gather", "all_to_all"):
        for recompute in ("none", "selective", "full"):
            layout = Layout(tp=2, cp=8, sequence_parallel=True, cp_attention=variant,
                            recompute=recompute)
            times = layer_times(LLAMA_8B, layout, cluster, LONG, 1)
            exposed = times["cp_forward"] + times["cp_backward"]
            assert 0 < exposed <= times["cp_total"] * (1 + 1e-9), (variant, recompute)


def test_all_to_all_runs_the_whole_sequence_kernel_on_a_cp_th_of_the_heads() -> None:
    # per rank exactly 1/cp of one device's layer: the same kernel shapes (the whole causal
    # sequence, fewer heads), where the ring's blocks run at the rate of s/cp-long blocks
    cluster = build_cluster("h100-sxm-80gb", 16, 8)
    whole = layer_times(LLAMA_8B, Layout(dp=16), cluster, LONG, 1)
    split = layer_times(LLAMA_8B, Layout(cp=16, cp_attention="all_to_all"), cluster, LONG, 1)
    assert split["forward"] == pytest.approx(whole["forward"] / 16, rel=1e-9)
    assert split["backward"] == pytest.approx(whole["backward"] / 16, rel=1e-9)


def test_all_to_all_keeps_its_repeated_kv_copies() -> None:
    # Llama 3 70B at tp=8 leaves one kv head per rank: at cp=4 the all-to-all repeats it to
    # 4, and the runtime saves those copies (balance.saved_bytes_per_rank, measured with
    # saved-tensor hooks in tests/test_cp_attention.py); the planner charges the same bytes
    from paraxis.plan.activations import projection_input_bytes, rotary_bytes
    from paraxis.plan.context import repeated_kv_bytes

    cfg, batch, seq, cp, tp = PRESETS["llama3-70b"], 1, 32768, 4, 8
    heads, kv = cfg.n_heads // tp, cfg.n_kv_heads // tp
    extra = (saved_bytes_per_rank(batch, heads, kv, seq, cfg.head_dim, cp, 2, "all_to_all")
             - saved_bytes_per_rank(batch, heads, kv, seq, cfg.head_dim, cp, 2, "ring"))
    assert extra == repeated_kv_bytes(cfg, "all_to_all", cp, tp, seq, batch) > 0
    assert repeated_kv_bytes(cfg, "ring", cp, tp, seq, batch) == 0
    cluster = build_cluster("h100-sxm-80gb", 32, 8)
    layouts = {v: Layout(tp=tp, cp=cp, sequence_parallel=True, cp_attention=v)
               for v in ("ring", "all_to_all")}
    memory = {v: evaluate(cfg, layout, cluster, seq, 1).memory["activations"]
              for v, layout in layouts.items()}
    # one microbatch in flight, every layer, in 16-bit elements; the all-to-all also hands
    # the output projection an output of its own and keeps none of rotary's tensors
    # (activations.projection_input_bytes, rotary_bytes; tests/test_plan_activations.py)
    local = seq // cp
    apart = (projection_input_bytes(cfg, local, batch, head_split=True)
             - rotary_bytes(cfg, local, batch)) / tp
    assert memory["all_to_all"] - memory["ring"] == pytest.approx(cfg.n_layers * (extra + apart))


def test_the_search_tries_every_cp_variant_unless_one_is_named() -> None:
    cluster = build_cluster("h100-sxm-80gb", 8, 8)
    priced = search(LLAMA_8B, cluster, 65536, 8)
    variants = {e.layout.cp_attention for e in priced.ranked if e.layout.cp > 1}
    assert variants == {"ring", "all_gather", "all_to_all"}
    # every layout priced is counted, and fits or is too big (the variants' too)
    assert priced.considered == len(priced.ranked) + len(priced.too_big)
    # the others are priced at each shape's fastest ring layout (plan/cp_variants.py)
    for other in (e for e in priced.ranked if e.layout.cp_attention != "ring"):
        shape = [e for e in priced.ranked if e.layout.cp_attention == "ring" and (
            e.layout.dp, e.layout.tp, e.layout.pp, e.layout.cp) == (
            other.layout.dp, other.layout.tp, other.layout.pp, other.layout.cp)]
        fastest = min(shape, key=lambda e: e.step_time_s)
        assert other.layout == fastest.layout.replace(cp_attention=other.layout.cp_attention,
                                                      cp_a2a=other.layout.cp_a2a)
    # and the ring and the all-gather in two levels, each cp_a2a dividing cp, once a shape
    two = {(e.layout.cp, e.layout.cp_attention, e.layout.cp_a2a) for e in priced.ranked
           if e.layout.cp_a2a > 1}
    assert {(8, "ring", 2), (8, "ring", 4), (8, "all_gather", 2), (8, "all_gather", 4)} <= two
    assert all(cp % a2a == 0 and 1 < a2a < cp for cp, _, a2a in two)
    named = search(LLAMA_8B, cluster, 65536, 8, Constraints(cp_attention=("all_to_all",)))
    assert {e.layout.cp_attention for e in named.ranked if e.layout.cp > 1} == {"all_to_all"}
    # a cp the heads do not divide by is a rule broken, said once per shape
    gpt2 = search(PRESETS["gpt2-1.5b"], cluster, 65536, 8,
                  Constraints(cp_attention=("all_to_all",)))
    assert all(e.layout.cp == 1 for e in gpt2.ranked)
    assert any("25 heads (per TP rank) do not divide by cp=2" in r.reason
               for r in gpt2.rule_breakers)


def test_two_level_cp_prices_its_all_to_all_inside_the_node_and_its_ring_across() -> None:
    # cp=16 over 2 nodes of 8 (cp_a2a=8): q, k, v and the output cross NVLink by all-to-all,
    # the K/V of heads/8 heads (chunks 8x longer) ring across the two nodes' network
    from paraxis.plan.comm import collective_time, group_link, leaving
    from paraxis.plan.context import exchange_times, level_times
    from paraxis.spec.cp_balance import all_to_all_inputs, kv_heads_sent

    cluster = build_cluster("h100-sxm-80gb", 16, 8)
    layout = Layout(cp=16, cp_a2a=8)
    times = exchange_times(LLAMA_8B, layout, cluster, LONG, 1, 2, 1.0, 2.0, 0.1)
    inside, across = group_link(list(range(8)), cluster), group_link([0, 8], cluster)
    assert inside.bandwidth_Bps > 5 * across.bandwidth_Bps  # NVLink against the network
    heads, kv = LLAMA_8B.n_heads, LLAMA_8B.n_kv_heads
    qkv, out = (collective_time("all_to_all", leaving(b, 8), 8, inside)
                for b in all_to_all_inputs(1, heads, kv, LONG, LLAMA_8B.head_dim, 16, 2, 8))
    ring = level_times("ring", (1, heads // 8, kv_heads_sent(kv, 8) // 8, LONG,
                                LLAMA_8B.head_dim, 2, 2), across, 1.0, 2.0, 0.1)
    assert times["forward"] == pytest.approx(ring["forward"] + qkv + out)
    assert times["total"] == pytest.approx(ring["total"] + 2 * (qkv + out))
    assert times["rerun"] == pytest.approx(ring["rerun"] + qkv)
    # one level over the same 16 ranks: the ring's 15 hops cross the network
    one = exchange_times(LLAMA_8B, Layout(cp=16), cluster, LONG, 1, 2, 1.0, 2.0, 0.1)
    assert one["total"] > times["total"]



def test_on_cpu_ranks_activation_reduce_scatters_are_priced_as_the_all_to_all_they_run() -> None:
    # gloo's reduce-scatter is slower than its all-to-all (spec.collectives): the runtime
    # carries SP's and the all-gather CP's reduce-scatters by an all-to-all there, each owner
    # summing its parts, and the planner prices that one; GPUs keep NCCL's reduce-scatter
    from paraxis.plan.comm import Link, collective_time, group_link, leaving, scatter_time
    from paraxis.spec.collectives import reduce_scatter_form
    from paraxis.spec.cp_balance import sent_bytes_per_rank

    assert (reduce_scatter_form(True), reduce_scatter_form(False)) == (
        "all_to_all", "reduce_scatter")
    cpu = build_cluster(gpus=4, overrides={"name": "cpu-core", "peak_flops": 1e11,
                                           "memory_bytes": 3e9, "cores_per_node": 2,
                                           "gpus_per_node": 8})
    assert group_link(range(4), cpu).through_host and group_link(range(4), cpu).sum_Bps > 0
    gpu_link = group_link(range(4), build_cluster("h100-sxm-80gb", 16, 8))
    assert not gpu_link.through_host and gpu_link.sum_Bps == 0
    fits = (("all_gather", 1e-4, 1e9), ("reduce_scatter", 1e-4, 0.3e9), ("all_to_all", 1e-4, 1e9))
    nccl = Link(1e9, 1e-4, False, measured=fits)
    host = nccl._replace(through_host=True, sum_Bps=2e9)
    # the owner's sum: its first part copied, three added into it (11 parts of 2 MB)
    assert scatter_time(8e6, 4, host) == pytest.approx(
        collective_time("all_to_all", 6e6, 4, host) + 22e6 / 2e9)
    assert scatter_time(8e6, 4, nccl) == collective_time("reduce_scatter", 8e6, 4, nccl)
    cp, seq = 4, 8192
    on_host = cp_layer_times(LLAMA_8B, "all_gather", cp, 1, seq, 1, 4, host, 1.0, 2.0, 0.0)
    on_nccl = cp_layer_times(LLAMA_8B, "all_gather", cp, 1, seq, 1, 4, nccl, 1.0, 2.0, 0.0)
    forward, backward = sent_bytes_per_rank("all_gather", 1, LLAMA_8B.n_heads,
                                            LLAMA_8B.n_kv_heads, seq, LLAMA_8B.head_dim, cp, 4)
    parts = backward - forward
    assert on_host["total"] - on_nccl["total"] == pytest.approx(
        scatter_time(parts, cp, host) - collective_time("reduce_scatter", parts, cp, nccl))
    assert scatter_time(parts, cp, host) > collective_time("all_to_all", leaving(parts, cp),
                                                           cp, host)
    # the ring sends its own hops on either backend
    assert cp_layer_times(LLAMA_8B, "ring", cp, 1, seq, 1, 4, host, 1.0, 2.0, 0.0) == \
        cp_layer_times(LLAMA_8B, "ring", cp, 1, seq, 1, 4, nccl, 1.0, 2.0, 0.0)
    # SP: a layer's reduce-scatters (two forward, two in backward) the same way
    from paraxis.plan.tp_layer import tp_layer_time
    assert tp_layer_time(1e6, 4, True, host) - tp_layer_time(1e6, 4, True, nccl) == \
        pytest.approx(4 * (scatter_time(1e6, 4, host) - scatter_time(1e6, 4, nccl)))


def _ring_backward_windows(ctx) -> list[list[str]]:
    """What the ring's backward has in flight while each of its steps computes, and what it
    posts after the last (the final list): "KV" hops and "dKdV" accumulators, on this
    rank."""
    import torch

    import paraxis.parallel.context.ring as ring
    from paraxis.parallel.context.chunks import local_part

    events: list[str] = []
    posted = ring._Pass

    class Recorded(posted):
        def __init__(self, tensor, group, phase):
            super().__init__(tensor, group, phase)
            # bf16 K/V below: the fp32 messages are the dK/dV accumulators
            self.name = "dKdV" if tensor.dtype == torch.float32 else "KV"
            events.append(f"post {self.name}")

        def wait(self):
            received = super().wait()
            events.append(f"wait {self.name}")
            return received

    compute = ring.backward_blocks

    def computed(*args, **kwargs):
        events.append("compute")
        return compute(*args, **kwargs)

    ring._Pass, ring.backward_blocks = Recorded, computed
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 64, 8, generator=generator) for _ in range(3))
    local = [local_part(t, ctx.rank, ctx.world_size, dim=2).bfloat16().requires_grad_()
             for t in (q, k, v)]
    out = ring.ring_attention(*local)
    events.clear()
    out.backward(torch.ones_like(out))
    in_flight: list[str] = []
    windows = []
    last = len(events) - events[::-1].index("compute")
    for event in events[:last]:
        if event == "compute":
            windows.append(sorted(in_flight))
        else:
            kind, name = event.split()
            if kind == "post":
                in_flight.append(name)
            else:
                in_flight.remove(name)
    return [*windows, sorted(e.split()[1] for e in events[last:] if e.startswith("post"))]


def test_the_ring_backward_is_priced_with_the_windows_the_runtime_hides_behind():
    """cp = 4 on gloo: what the ring's backward has in flight during each step's compute,
    priced step by step with the planner's own hops, is the planner's exposed backward."""
    from paraxis.dist.testing import run_on_ranks
    from paraxis.plan.comm import Link, collective_time
    from paraxis.plan.context import level_times
    from paraxis.spec.cp_balance import sent_bytes_per_rank

    cp = 4
    windows = run_on_ranks(cp, _ring_backward_windows)[0]
    assert len(windows) == cp + 1
    link = Link(bandwidth_Bps=25e9, latency_s=0.0, crosses_nodes=False)
    shape = (1, 8, 8, 4096 * cp, 128, cp, 2)
    forward_bytes, backward_bytes = sent_bytes_per_rank("ring", *shape)
    hop = {"KV": collective_time("send_recv", forward_bytes / (cp - 1), 2, link),
           "dKdV": collective_time("send_recv", (backward_bytes - forward_bytes) / (cp - 1), 2,
                                   link)}
    step = 1e-3  # a ring step's backward compute, shorter than either hop here
    exposed = sum(max(0.0, sum(hop[n] for n in w) - step) for w in windows[:-1]) \
        + sum(hop[n] for n in windows[-1])
    priced = level_times("ring", shape, link, 0.5 * step * cp, step * cp, 0.0)["backward"]
    assert priced == pytest.approx(exposed)
