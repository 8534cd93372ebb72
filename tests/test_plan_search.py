"""The search: the seeds' scenarios, its invariants, constraints, and bad input."""

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraxis.plan.comm import axis_link
from paraxis.plan.cost import evaluate
from paraxis.plan.explain import explain
from paraxis.plan.hardware import build_cluster
from paraxis.plan.ranking import EQUAL_TIMES, group_numbers, rank, simpler_by
from paraxis.plan.search import Constraints, search
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import PRESETS, model_from_params
from validation.fit_gemm import peak_tp


def best_layout(cfg, gpus: int, global_batch: int, seq_len: int, gpu: str = "a100-80gb",
                overrides: dict | None = None, **constraints) -> tuple:
    cluster = build_cluster(gpu, gpus, 8, overrides)
    result = search(cfg, cluster, seq_len, global_batch, Constraints(**constraints))
    return result.ranked[0], cluster, result


def test_1b_on_8_nvlink_gpus_is_pure_dp() -> None:
    best, _, _ = best_layout(model_from_params(1e9), 8, 256, 2048)
    assert (best.layout.dp, best.layout.tp, best.layout.pp) == (8, 1, 1)


def test_30b_on_one_node_uses_tp_in_the_node_or_zero3() -> None:
    best, cluster, _ = best_layout(model_from_params(30e9), 8, 256, 2048)
    layout = best.layout
    tp_in_node = layout.tp > 1 and not axis_link(layout, "tp", cluster).crosses_nodes
    assert tp_in_node or layout.zero == 3


def test_200b_on_8_nodes_is_tp_inside_pp_across_dp_on_top() -> None:
    best, cluster, result = best_layout(model_from_params(200e9), 64, 256, 2048)
    layout = best.layout
    assert layout.tp >= 4 and not axis_link(layout, "tp", cluster).crosses_nodes
    assert layout.pp > 1 and axis_link(layout, "pp", cluster).crosses_nodes
    # The course's answer (TP = 8 in the node, PP across nodes, DP on top) is a near-tie:
    # priced with the runtime's own stage split (the head's stage takes fewer blocks), a
    # deeper pipeline at tp=4, dp=1 comes out 4% ahead (59.1 s vs 61.6 s per step).
    course = [r for r in result.ranked if r.layout.tp == 8 and r.layout.dp > 1
              and r.layout.pp > 1]
    assert course and course[0].step_time_s <= 1.05 * best.step_time_s


def test_13b_on_16_gpus_without_tp_and_pp_needs_zero3() -> None:
    # On 40 GB GPUs ZeRO-2 (2P + 14P/N = 37.4 GB of states) leaves no room for activations;
    # ZeRO-3's 16P/N = 13 GB does.
    best, _, result = best_layout(PRESETS["llama2-13b"], 16, 256, 4096, gpu="a100-40gb",
                                  max_tp=1, max_pp=1)
    assert (best.layout.dp, best.layout.tp, best.layout.pp, best.layout.zero) == (16, 1, 1, 3)
    assert best.memory["params"] + best.memory["grads"] + best.memory["optimizer"] == \
        pytest.approx(16 * PRESETS["llama2-13b"].num_params() / 16, rel=1e-6)
    assert {r.layout.zero for r in result.too_big} >= {0, 1, 2}


def test_70b_on_32_nodes_is_tp_inside_nodes_with_pp_and_dp() -> None:
    cfg = PRESETS["llama2-70b"]
    best, cluster, result = best_layout(cfg, 256, 1024, 4096)
    layout = best.layout
    assert layout.tp >= 4 and not axis_link(layout, "tp", cluster).crosses_nodes
    assert layout.pp > 1 and axis_link(layout, "pp", cluster).crosses_nodes and layout.dp > 1
    # The course's exact answer, TP = 8 with PP and DP, is a near-tie the model does not pick:
    # with plenty of DP, TP = 4 and a 2-stage pipeline fit, and per step TP = 8 moves 7/3 the
    # TP bytes of TP = 4 (each GPU does half the compute per microbatch but still all-gathers
    # and reduce-scatters (t-1)/t of the activations, and its GEMMs are half as wide): ~9%
    # slower, far less than leaving the node. Whether that is a tie within the model's
    # validated error is the defence's to say, so TP = 8 is not required here.
    course = [e for e in result.ranked if e.layout.tp == 8 and e.layout.pp > 1
              and e.layout.dp > 1]
    assert course and course[0].step_time_s <= 1.10 * best.step_time_s
    assert not any(axis_link(e.layout, "tp", cluster).crosses_nodes for e in result.ranked[:10])
    # the defence prices the rule of thumb it departs from
    lines = explain(cfg, cluster, best, result)
    assert any(line.startswith("Rejected TP=8 (the whole node") for line in lines)


@pytest.mark.parametrize("batch", [32, 128])
def test_tp_vs_pp_peaks_at_the_node_size(batch: int) -> None:
    # Narayanan et al. 2021 Sec. 5.4.1, Fig. 13: a 161B GPT (32 layers, 128 heads, h = 20480)
    # on 64 GPUs with no data parallelism peaks at tensor-parallel size = GPUs per node (8):
    # smaller t means a deep pipeline and its bubble, larger t all-reduces over InfiniBand.
    assert peak_tp(batch) == 8  # validation/fit_gemm.py keeps the fitted efficiency to this


def test_explanation_names_the_tree_and_rivals() -> None:
    best, cluster, result = best_layout(model_from_params(200e9), 64, 256, 2048)
    lines = explain(model_from_params(200e9), cluster, best, result)
    text = "\n".join(lines)
    assert "Fits on one GPU? no" in text and "inside one node over NVLink" in text
    assert sum(line.startswith("Rejected") for line in lines) >= 2


def test_constraints_are_respected() -> None:
    cfg = PRESETS["llama2-7b"]
    cluster = build_cluster("a100-80gb", 16, 8)
    result = search(cfg, cluster, 4096, 64, Constraints(max_tp=2, max_pp=1, zero=2))
    assert result.ranked
    assert all(e.layout.tp <= 2 and e.layout.pp == 1 and e.layout.zero == 2
               for e in result.ranked)


@settings(max_examples=12, deadline=None)
@given(st.sampled_from(["llama2-7b", "gpt2-1.5b", "llama2-13b"]), st.sampled_from([8, 16, 32]),
       st.sampled_from([32, 64, 128]), st.sampled_from(["a100-40gb", "a100-80gb", "h100-sxm-80gb"]))
def test_search_never_returns_rule_breakers_or_overflows(name: str, gpus: int, batch: int,
                                                        gpu: str) -> None:
    cfg = PRESETS[name]
    cluster = build_cluster(gpu, gpus, 8)
    result = search(cfg, cluster, 1024, batch)
    for estimate in result.ranked:
        estimate.layout.validate(gpus, cfg, batch, 1024)  # raises on a broken rule
        assert estimate.memory["total"] <= cluster.gpu.memory_bytes
        again = evaluate(cfg, estimate.layout, cluster, 1024, batch)
        assert again.memory["total"] == estimate.memory["total"]
    times = [e.step_time_s for e in result.ranked]
    assert all(t > 0 for t in times)


@pytest.mark.parametrize("call, message", [
    (lambda: build_cluster("a100-80gb", 0, 8), "at least one GPU"),
    (lambda: build_cluster("b300-ultra", 8, 8), "unknown GPU"),
    (lambda: search(PRESETS["llama2-7b"], build_cluster("a100-80gb", 24, 8), 4096, 48,
                    Constraints(tp=3)), "not divisible by tp=3"),
    (lambda: search(PRESETS["llama2-7b"], build_cluster("a100-80gb", 8, 8), 4096, 4,
                    Constraints(max_tp=1, max_pp=1)), "does not split over dp=8"),
    (lambda: Layout(dp=8).validate(8, PRESETS["llama2-7b"], 4), "not divisible by dp"),
])
def test_bad_input_is_one_line(call, message: str) -> None:
    with pytest.raises(ParaxisError) as error:
        call()
    assert message in str(error.value) and "\n" not in str(error.value)


def test_times_within_half_a_percent_rank_simplest_first_and_the_defence_says_so() -> None:
    # llama3-8b on 8 H100s without context parallelism (cp=2 is 1.5% faster still): pure DP
    # and a 2-stage pipeline price within 0.1% of each other, the pipeline a hair faster; the
    # ranking counts them as equal and puts pure DP first (with FA2's attention: the tie
    # this needs; cuDNN's faster core moves the pipeline 0.6% ahead)
    cfg = PRESETS["llama3-8b"]
    best, cluster, result = best_layout(cfg, 8, 1024, 8192, gpu="h100-sxm-80gb",
                                        overrides={"attention_impl": "fa2"}, cp=1)
    ranked = result.ranked
    # never is a later layout faster than an earlier one by more than the 0.5% counted equal
    fastest_after = [min(e.step_time_s for e in ranked[i:]) for i in range(len(ranked))]
    assert all(fastest_after[i] >= e.step_time_s / (1 + EQUAL_TIMES)
               for i, e in enumerate(ranked))
    faster = [e for e in ranked if e.step_time_s < best.step_time_s]
    group = group_numbers(ranked)
    assert faster and all(group[id(e)] == group[id(best)] == 0 for e in faster)
    assert best.layout.tp * best.layout.pp < min(e.layout.tp * e.layout.pp for e in faster)
    assert simpler_by(best, faster[0]).startswith("model-parallel ranks, tp x pp x cp: 1 vs")
    lines = explain(cfg, cluster, best, result)
    # the rejected rivals that are not slower (a negative figure) say why they lost
    not_slower = [line for line in lines if line.startswith("Rejected dp=")
                  and line.split(":")[1].strip().startswith("-")]
    assert not_slower and all("where the simpler layout goes first (model-parallel ranks" in line
                              for line in not_slower)


def test_the_ranking_groups_from_the_fastest_not_by_fixed_buckets() -> None:
    # two times 0.1% apart always count as equal (fixed 0.5% buckets split some such pairs)
    cfg = PRESETS["llama2-7b"]
    cluster = build_cluster("a100-80gb", 8, 8)
    simple = evaluate(cfg, Layout.parse("dp=8,tp=1,pp=1,microbatches=32"), cluster, 4096, 256)
    complex_ = evaluate(cfg, Layout.parse("dp=4,tp=2,pp=1,microbatches=16"), cluster, 4096,
                        256)

    def timed(estimate, seconds: float):
        return dataclasses.replace(estimate, time={**estimate.time, "step": seconds})

    t = simple.step_time_s
    for scale in (0.999, 1.0, 1.001, 1.004):
        fast = timed(complex_, t / scale)
        assert rank([fast, simple])[0] is simple  # within 0.5%: the simpler first
    slow, fast = timed(complex_, t * 1.006), timed(complex_, t / 1.006)
    assert rank([slow, simple])[0] is simple and rank([fast, simple])[0] is fast
    # groups start at the fastest not yet placed: 100, 100.4 | 100.6, 101
    a, b, c, d = (timed(complex_, 100.0), timed(simple, 100.4), timed(complex_, 100.6),
                  timed(simple, 101.0))
    assert rank([d, c, a, b]) == [b, a, d, c]
    # 100.4 and 100.6 are 0.2% apart but in two groups: the later one lost on time, and
    # the defence must not say it lost on simplicity
    group = group_numbers([d, c, a, b])
    assert group[id(a)] == group[id(b)] == 0 and group[id(c)] == group[id(d)] == 1


def test_every_micro_batch_size_that_divides_a_replicas_batch_is_tried() -> None:
    # 15 sequences over dp=3: 5 a replica, run as one microbatch of 5 (or 5 of 1), where
    # powers of 2 alone would have left only microbatches of 1
    cfg = PRESETS["llama2-7b"]
    result = search(cfg, build_cluster("a100-80gb", 3, 3), 1024, 15, Constraints(dp=3))
    assert {e.micro_batch for e in result.ranked} >= {1, 5}
    result = search(cfg, build_cluster("a100-80gb", 8, 8), 1024, 96, Constraints(dp=8))
    assert {e.micro_batch for e in result.ranked} >= {3, 6, 12}  # 12 a replica
    # beyond 16 too, wherever it fits: 64 sequences of tiny on one device
    result = search(PRESETS["tiny"], build_cluster("a100-80gb", 1, 1), 128, 64)
    assert {e.micro_batch for e in result.ranked} >= {1, 2, 4, 8, 16, 32, 64}
    # under a pipeline, sizes leaving fewer microbatches than stages too: 8 sequences on pp=4
    # in 8, 4, 2 or 1 microbatches
    result = search(PRESETS["tiny"], build_cluster("a100-80gb", 4, 4), 128, 8,
                    Constraints(pp=4, schedules=("1f1b",)))
    assert {e.micro_batch for e in result.ranked} == {1, 2, 4, 8}


def test_fewer_microbatches_than_stages_win_where_fixed_costs_outweigh_the_bubble() -> None:
    """A tiny model on a pipeline of 2: its step's fixed costs per microbatch (kernel
    launches, sends) outweigh the bubble one microbatch leaves, and the search, which once
    skipped such sizes whenever a smaller one fitted, finds it fastest."""
    cfg, cluster = PRESETS["tiny-llama"], build_cluster("h100-sxm-80gb", 16, 8)
    result = search(cfg, cluster, 128, 16, Constraints(pp=2, dp=8))
    best = result.ranked[0]
    assert best.layout.microbatches == 1
    every = [evaluate(cfg, best.layout.replace(microbatches=m), cluster, 128, 16)
             for m in (1, 2)]
    assert every[0].step_time_s < every[1].step_time_s


def test_grouped_full_recompute_is_tried_where_one_block_a_checkpoint_does_not_fit() -> None:
    """Llama 3 405B on 16 stages of 8 GPUs holds 16 microbatches in flight on its first
    stage: checkpoints of 2 blocks keep half the stored inputs for one more block rebuilt at
    once (57.6 -> 56.2 GB a GPU, the same step time). On GPUs of 57 GB only that fits, and
    the search finds it; a stated recompute_layers=1 is kept."""
    cfg = PRESETS["llama3-405b"]
    cluster = build_cluster("h100-sxm-80gb", 128, 8, {"memory_bytes": 57e9})
    fixed = dict(tp=8, pp=16, dp=1, zero=0, recompute=("full",), micro_batch=1,
                 schedules=("1f1b",))
    result = search(cfg, cluster, 8192, 64, Constraints(**fixed))
    assert result.ranked and result.ranked[0].layout.recompute_layers == 2
    ungrouped = search(cfg, cluster, 8192, 64, Constraints(**fixed, recompute_layers=1))
    assert not ungrouped.ranked
    assert {r.layout.recompute_layers for r in ungrouped.too_big} == {1}


def test_the_block_method_recomputes_the_fewest_blocks_that_fit() -> None:
    """Asked for the block method (`--layout recompute=full,recompute_method=block`), the
    search tries each layout with the fewest blocks of a chunk recomputed first
    (`settings.block_counts`) and keeps the first that fits: llama2-7b on 8 H100s at one
    sequence a microbatch recomputes 1 block of 32, 23% faster than every block, and at 8
    sequences the fewest that fit. Its floors are no recomputation's, under every block
    layout's price (a floor above it would have skipped layouts that win)."""
    from paraxis.plan.floor import step_lower_bound
    from paraxis.plan.settings import block_counts

    assert block_counts(32) == [1, 2, 3, 4, 5, 7, 9, 12, 16, 21, 28, 32]
    assert block_counts(1) == [1]
    cfg, cluster = PRESETS["llama2-7b"], build_cluster("h100-sxm-80gb", 8, 8)
    fixed = dict(dp=8, zero=1, recompute=("full",), sequence_parallel=(False,))
    block = search(cfg, cluster, 4096, 64, Constraints(**fixed, recompute_method="block"))
    uniform = search(cfg, cluster, 4096, 64, Constraints(**fixed))
    best = block.ranked[0]
    assert best.layout.recompute_method == "block" and best.micro_batch == 1
    assert best.layout.recompute_layers == 1
    assert best.step_time_s < 0.8 * uniform.ranked[0].step_time_s
    at_8 = next(e for e in block.ranked if e.micro_batch == 8)
    n = at_8.layout.recompute_layers
    fewer = block_counts(32)[block_counts(32).index(n) - 1]
    assert not evaluate(cfg, at_8.layout.replace(recompute_layers=fewer), cluster, 4096,
                        64).fits
    for estimate in block.ranked:
        assert step_lower_bound(cfg, estimate.layout, cluster, 4096, 64) <= \
            estimate.step_time_s
    # a chunk of the FLOP-balanced partition can hold more than the mean: on two stages of
    # two chunks Llama 3 8B's are 8, 9, 9 and 6 blocks, and where only 9 of them recomputed
    # fits, the search still finds it
    llama = PRESETS["llama3-8b"]
    nine = Layout(pp=2, virtual_stages=2, schedule="interleaved", microbatches=8, zero=1,
                  recompute="full", recompute_method="block", recompute_layers=9)
    eight = nine.replace(recompute_layers=8)
    tight = build_cluster("h100-sxm-80gb", 2, 8, {"memory_bytes": (
        evaluate(llama, nine, cluster, 4096, 8).memory["total"]
        + evaluate(llama, eight, cluster, 4096, 8).memory["total"]) / 2})
    found = search(llama, tight, 4096, 8, Constraints(
        pp=2, tp=1, dp=1, zero=1, schedules=("interleaved",), virtual_stages=(2,),
        recompute=("full",), recompute_method="block", micro_batch=1))
    assert found.ranked and found.ranked[0].layout.recompute_layers == 9
    assert any("Recomputed in the backward: the first block of each model chunk (the "
               "block method)" in line for line in explain(cfg, cluster, best, block))


def test_defence_of_a_pipeline_without_tp_says_the_model_is_split_not_replicated():
    """A layout with pp > 1 and tp = 1 splits the model into stages: the defence must not
    say it is replicated (nor, for ZeRO-3, that it is whole)."""
    cfg, cluster = PRESETS["llama2-7b"], build_cluster("a100-80gb", 16, 8)
    for text, says in (("dp=2,pp=8,zero=1,microbatches=16", "split into 8 pipeline stages"),
                       ("dp=16,zero=1,recompute=full", "whole weights on every GPU"),
                       ("dp=16,zero=3,recompute=full", "ZeRO-3 sharding weights")):
        best = evaluate(cfg, Layout.parse(text), cluster, 4096, 64)
        line = next(line for line in explain(cfg, cluster, best) if line.startswith("No TP"))
        assert says in line, line
        assert "replicated" not in line or "pp" not in text


def test_defence_states_the_overlaps_it_assumed_and_the_headroom_it_kept():
    cfg, cluster = PRESETS["llama2-7b"], build_cluster("a100-80gb", 16, 8)
    best = evaluate(cfg, Layout.parse("dp=4,tp=2,pp=2,zero=1,microbatches=8"), cluster,
                    4096, 64)
    line = next(line for line in explain(cfg, cluster, best) if "Headroom" in line)
    assert line.startswith("Assumed hidden: the gradient sync behind the backward (but for "
                           "its last bucket), TP's backward collectives behind the "
                           "weight-gradient GEMMs")
    assert ("exposed: the pipeline's sends, TP's forward collectives, ZeRO's parameter "
            "all-gather after the step") in line
    # a runtime that pipelines TP collectives with GEMMs (tp_comm_overlap "all", SP) and
    # gathers ZeRO's parameters behind the next forward says so
    overlapped = build_cluster("a100-80gb", 16, 8, {"tp_comm_overlap": "all",
                                                    "param_gather_overlap": True})
    sp = evaluate(cfg, Layout.parse("dp=4,tp=2,pp=2,zero=1,microbatches=8,"
                                    "sequence_parallel=true"), overlapped, 4096, 64)
    said = next(line for line in explain(cfg, overlapped, sp) if "Headroom" in line)
    assert "every TP collective behind the GEMM beside it" in said
    assert "ZeRO's parameter all-gather behind the next step's forward" in said
    assert "TP's forward collectives" not in said
    free = best.memory_limit_bytes - best.memory["total"]
    assert f"{free / 1e9:.1f} GB ({free / best.memory_limit_bytes:.1%}) of the GPU left free" \
        in line
    assert "forecast's own error" not in line  # plenty left
    # a fit tighter than the memory forecast's error on measured peaks says so
    tight = build_cluster("a100-80gb", 16, 8, {"memory_bytes": best.memory["total"] + 0.5e9})
    squeezed = evaluate(cfg, best.layout, tight, 4096, 64)
    said = next(line for line in explain(cfg, tight, squeezed) if "Headroom" in line)
    assert f"0.5 GB ({0.5e9 / squeezed.memory_limit_bytes:.1%}) of the GPU left free, less " \
           "than the memory forecast's own error (1.4% of measured peaks)" in said
    # ...and the memory to plan with for a margin of twice that error
    gb = int(squeezed.memory_limit_bytes * (1 - 2 * 0.014) / 1e9)
    assert f"plan with --memory-gb {gb} for layouts that leave a margin" in said
    from paraxis.plan.cost import Overlap

    nothing = explain(cfg, cluster, best, overlap=Overlap(dp=False, tp=False, pp=False,
                                                          zero3_prefetch=False, cp=False))
    assert any(line.startswith("Assumed exposed: the gradient sync, TP's backward") for
               line in nothing)
    # ZeRO-3's sync is its prefetched gathers and reduce-scatters: `--exposed zero3` exposes
    # them, and says so; `--exposed dp` (ZeRO 0-2's buckets) changes neither price nor text
    zero3 = Layout.parse("dp=16,zero=3,microbatches=4")
    for off, exposed in ((Overlap(zero3_prefetch=False), True), (Overlap(dp=False), False)):
        priced = evaluate(cfg, zero3, cluster, 4096, 64, overlap=off)
        said = next(line for line in explain(cfg, cluster, priced, overlap=off)
                    if "Headroom" in line)
        assert ("exposed: ZeRO-3's gathers and reduce-scatters" in said) == exposed, said
        assert ("gradient sync" in said) is False, said
        assert (priced.step_time_s > evaluate(cfg, zero3, cluster, 4096, 64).step_time_s
                ) == exposed


@pytest.mark.parametrize("name,gpus,seq,batch", [("llama2-13b", 64, 4096, 512),
                                                 ("mixtral-8x7b", 64, 4096, 256)])
def test_a_setting_too_big_at_one_microbatch_size_is_too_big_at_every_larger_one(
        name: str, gpus: int, seq: int, batch: int) -> None:
    """The search prices a setting (schedule, depth, SP, recompute) again at a larger
    microbatch only while it fits: a larger microbatch holds more activations. Each setting
    it left too big, priced at every larger size, is too big there too (a pipeline's
    ZeRO-2, which keeps no whole gradients at one microbatch a step, at every larger size
    but that one)."""
    cfg = PRESETS[name]
    cluster = build_cluster("h100-sxm-80gb", gpus, 8)
    result = search(cfg, cluster, seq, batch)
    assert result.ranked and result.too_big
    checked = 0
    for rejection in result.too_big[::max(1, len(result.too_big) // 150)]:
        layout = rejection.layout
        dips = layout.zero == 2 and layout.pp > 1 and not cfg.tied_embeddings
        microbatches = layout.microbatches // 2
        while microbatches >= (2 if dips else 1) and layout.microbatches % microbatches == 0:
            try:  # a size the rules allow (an interleaved schedule's count of microbatches)
                larger = layout.replace(microbatches=microbatches).validate(gpus, cfg, batch,
                                                                            seq)
            except ParaxisError:
                break
            assert not evaluate(cfg, larger, cluster, seq, batch).fits, larger
            checked += 1
            microbatches //= 2
    assert checked > 20


def test_a_pipelines_zero2_fits_at_one_microbatch_a_step_where_more_overflow() -> None:
    """Under a pipeline, ZeRO-2 that reduces once a step holds the stage's whole gradients
    beside its shards over two or more microbatches, not over one: the search, which stops
    at the first microbatch size where nothing fits, still prices one microbatch a step."""
    cluster = build_cluster("a100-40gb", 16, 8, {"memory_bytes": 55e9})
    result = search(PRESETS["llama2-13b"], cluster, 4096, 16, Constraints(
        zero=2, pp=4, tp=1, recompute=("none",), schedules=("1f1b",)))
    assert [str(e.layout) for e in result.ranked] == [
        "dp=4,tp=1,pp=4,zero=2,microbatches=1,schedule=1f1b"]
    assert {r.layout.microbatches for r in result.too_big} >= {4}
