"""The search's branch and bound (plan/prune.py): a layout's floor never exceeds its price,
and skipping on it changes nothing the answer shows, against the same search exhaustive."""

import dataclasses
import re

import pytest

from paraxis.plan.cost import evaluate
from paraxis.plan.experts import DEFAULT_IMBALANCE
from paraxis.plan.explain import explain
from paraxis.plan.floor import Floors, floor_recompute, step_lower_bound, variants_floor
from paraxis.plan.hardware import build_cluster
from paraxis.plan.prune import TOO_BIG_SHOWN, families
from paraxis.plan.ranking import EQUAL_TIMES
from paraxis.plan.rates import DEFAULT_OVERLAP
from paraxis.plan.search import Constraints, search
from paraxis.plan.settings import every_variant
from paraxis.plan.uncertainty import error_band, ties
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import PRESETS
from paraxis.spec.precision import MIXED_ADAM, PRECISIONS
from tools.probes.search_fuzz import facts, leading_shapes

# (model, GPUs, GPU, global batch, sequence, constraints): dense and MoE, context parallel,
# a zero-bubble schedule, and small microbatches whose kernels the host launches slower than
# the GPU runs them (selective recomputation then hides in the host's time)
CASES = [
    ("gpt2-124m", 8, "h100-sxm-80gb", 16, 1024, {"recompute": ("selective",)}),
    ("llama3-8b", 8, "h100-sxm-80gb", 16, 1024, {"recompute": ("full",)}),
    ("llama3-8b", 64, "h100-sxm-80gb", 256, 8192, {}),
    ("llama2-70b", 128, "a100-80gb", 512, 4096, {}),
    ("mixtral-8x7b", 64, "h100-sxm-80gb", 128, 8192, {}),
    ("llama2-7b", 32, "a100-80gb", 128, 2048, {"schedules": ("1f1b", "zb-h1")}),
    # paraxis's own kernels, whose optimizer step grows with the microbatches
    ("llama2-7b", 32, "h100-sxm-80gb-eager", 256, 4096, {}),
    ("mixtral-8x7b", 64, "h100-sxm-80gb-compiled", 256, 4096, {}),
    # a size skipped on its floor, the next one holding fewer microbatches than stages
    ("llama2-13b", 64, "h100-sxm-80gb", 32, 16384, {"schedules": ("1f1b", "zb-h1")}),
]


def _cluster(gpu: str, gpus: int):
    """A GPU preset, or one with paraxis's kernels ("<preset>-eager", "<preset>-compiled")."""
    for kernels in ("eager", "compiled"):
        if gpu.endswith("-" + kernels):
            return build_cluster(gpu.removesuffix("-" + kernels), gpus, 8, {"kernels": kernels})
    return build_cluster(gpu, gpus, 8)


def _searches(name, gpus, gpu, batch, seq, constraints):
    cfg, cluster = PRESETS[name], _cluster(gpu, gpus)
    c = Constraints(**constraints)
    return (cfg, cluster, search(cfg, cluster, seq, batch, c, exhaustive=True),
            search(cfg, cluster, seq, batch, c, workers=1))


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_skipping_on_the_floor_changes_nothing_the_answer_shows(case) -> None:
    cfg, cluster, whole, pruned = _searches(*case)
    assert pruned.skipped > 0 and pruned.considered < whole.considered
    _shows_the_same(cfg, cluster, case, whole, pruned)
    # split over processes, each skipping on its own bound (`workers.py`)
    name, gpus, gpu, batch, seq, constraints = case
    split = search(cfg, cluster, seq, batch, Constraints(**constraints), workers=2)
    _shows_the_same(cfg, cluster, case, whole, split)


def _shows_the_same(cfg, cluster, case, whole, pruned) -> None:
    # the fastest, the six kept, the ties of the error band
    assert [facts(e) for e in pruned.ranked[:6]] == [facts(e) for e in whole.ranked[:6]]
    band = error_band(cluster)
    assert ([facts(e) for e in ties(pruned.ranked[0], pruned.ranked, band)]
            == [facts(e) for e in ties(whole.ranked[0], whole.ranked, band)])
    # the fastest shapes' fastest layouts (the nearest rivals of other shapes)
    assert leading_shapes(pruned) == leading_shapes(whole)
    # every layout it kept is priced as the exhaustive search priced it, but for cp variants
    # re-priced at another shape's fastest ring layout (cp_variants.py), priced as alone
    whole_by_text = {str(e.layout): facts(e) for e in whole.ranked}
    for e in pruned.ranked:
        if str(e.layout) in whole_by_text:
            assert whole_by_text[str(e.layout)] == facts(e)
        else:
            assert e.layout.cp_attention != "ring" or e.layout.cp_a2a > 1
            alone = evaluate(cfg, e.layout, cluster, case[4], case[3])
            assert alone.step_time_s == pytest.approx(e.step_time_s, rel=1e-12)
    # the fastest too big ("faster, but too big", the JSON's rejected examples)
    assert ([str(r.layout) for r in pruned.too_big[:TOO_BIG_SHOWN]]
            == [str(r.layout) for r in whole.too_big[:TOO_BIG_SHOWN]])
    # each family's leader: the same, one the ranking counts as equal to it, or faster (a
    # cp variant re-priced at another shape's fastest ring layout, cp_variants.py)
    for name, member in families(cluster.gpus_per_node):
        a = next((e for e in whole.ranked if member(e.layout)), None)
        b = next((e for e in pruned.ranked if member(e.layout)), None)
        assert (a is None) == (b is None), name
        if a is not None:
            assert b.step_time_s <= a.step_time_s * (1 + EQUAL_TIMES), name
    # the defence of the pick reads the same, but for a family's leader where another of
    # the family lies within the ranking's 0.5% of it (checked above)
    lines, exhaustive = (explain(cfg, cluster, r.ranked[0], r) for r in (pruned, whole))
    assert len(lines) == len(exhaustive)
    for line, other in zip(lines, exhaustive, strict=True):
        family = line.startswith(("Best layout", "Rejected TP=", "No layout"))
        assert line == other or family, line


def test_a_recomputation_skipped_on_its_floor_may_still_fit() -> None:
    """At one microbatch per step Llama 3 70B (FP8, 16K tokens, 16 H200s) fits ZeRO-3 on
    dp=4 x cp=4 only with full recomputation, slower than all the answer shows: skipped on
    its floor, it does not make the size "too big", so the larger sizes, which fit faster
    and are among the ties, are still tried."""
    cfg, cluster = PRESETS["llama3-70b"], build_cluster("h200", 16, 8)
    whole, pruned = (search(cfg, cluster, 16384, 128, precision=PRECISIONS["fp8"],
                            exhaustive=exhaustive) for exhaustive in (True, False))
    band = error_band(cluster)
    tied = [[facts(e) for e in ties(r.ranked[0], r.ranked, band)] for r in (pruned, whole)]
    assert "dp=4,tp=1,pp=1,cp=4,zero=3,microbatches=4,recompute=full" in [
        layout for layout, _, _ in tied[1]]
    assert tied[0] == tied[1]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_the_floor_is_below_every_price(case) -> None:
    name, gpus, gpu, batch, seq, constraints = case
    cfg, cluster = PRESETS[name], _cluster(gpu, gpus)
    whole = search(cfg, cluster, seq, batch, Constraints(**constraints), exhaustive=True)
    priced = whole.ranked + [r.estimate for r in whole.too_big if r.estimate is not None]
    memo: dict = {}
    floors = Floors(cfg, cluster, seq, batch, MIXED_ADAM, DEFAULT_OVERLAP, DEFAULT_IMBALANCE,
                    {})
    for estimate in priced[::max(1, len(priced) // 400)]:
        layout = estimate.layout
        floor = step_lower_bound(cfg, layout, cluster, seq, batch, memo=memo)
        assert 0 < floor <= estimate.step_time_s * (1 + 1e-12), layout
        # the floor of every setting of a microbatch size, under each of them
        micro = batch // (layout.dp * layout.microbatches)
        coarse = floors.coarse(layout, layout, micro, layout.microbatches,
                               (layout.sequence_parallel,),
                               [(layout.schedule, layout.virtual_stages)])
        assert 0 < coarse <= floor * (1 + 1e-12), layout
        # the floor of a size and every larger one, from one microbatch of all the
        # replica's sequences: under this layout's price at its own size and at every
        # smaller one (more microbatches; a larger microbatch costs no more per sequence)
        every = every_variant(layout.pp, Constraints(**constraints), cfg.n_layers)
        per_replica = batch // layout.dp
        for count in range(layout.microbatches, per_replica + 1, layout.microbatches):
            if per_replica % count == 0:
                tail = floors.tail(layout, layout, count, (layout.sequence_parallel,),
                                   every, floor_recompute(layout))
                assert 0 < tail <= estimate.step_time_s * (1 + 1e-12), (layout, count)


@pytest.mark.parametrize("name, gpus, batch, seq, kernels", [
    ("llama2-7b", 32, 256, 4096, "eager"),
    ("llama3-8b", 16, 128, 8192, "compiled"),
])
def test_the_search_floors_shared_across_microbatch_counts_stay_under_every_price(
        name, gpus, batch, seq, kernels) -> None:
    """`Floors.of` shares a setting's optimizer step across its microbatch counts, visited
    as the search visits them (the most first); paraxis's kernels' step grows with them."""
    cfg, cluster = PRESETS[name], build_cluster("h100-sxm-80gb", gpus, 8, {"kernels": kernels})
    whole = search(cfg, cluster, seq, batch, exhaustive=True)
    priced = whole.ranked + [r.estimate for r in whole.too_big if r.estimate is not None]
    floors = Floors(cfg, cluster, seq, batch, MIXED_ADAM, DEFAULT_OVERLAP, DEFAULT_IMBALANCE,
                    {})
    shapes: dict = {}
    for estimate in sorted(priced, key=lambda e: -e.layout.microbatches):
        layout = estimate.layout
        shape = shapes.setdefault((layout.dp, layout.tp, layout.pp, layout.cp, layout.ep,
                                   layout.etp), Layout(dp=layout.dp, tp=layout.tp,
                                                       pp=layout.pp, cp=layout.cp,
                                                       ep=layout.ep, etp=layout.etp))
        base = shape.replace(zero=layout.zero, zero3_reshard=layout.zero3_reshard,
                             dp_shard=layout.dp_shard)
        floor = floors.of(shape, base, layout.microbatches, layout.schedule,
                          layout.virtual_stages, layout.sequence_parallel,
                          floor_recompute(layout))
        assert floor <= estimate.step_time_s * (1 + 1e-12), layout


def test_cpu_ranks_skip_too() -> None:
    cfg = dataclasses.replace(PRESETS["llama2-7b"], n_layers=8, name="llama2-7b-8l")
    cluster = build_cluster("a100-80gb", 8, 8).replace(cores_per_node=2)
    whole = search(cfg, cluster, 1024, 32, exhaustive=True)
    pruned = search(cfg, cluster, 1024, 32)
    assert [facts(e) for e in pruned.ranked[:6]] == [facts(e) for e in whole.ranked[:6]]


def test_zero3_alone_under_a_pipeline_searches_a_mixture_of_experts() -> None:
    """--zero 3 with pp > 1 leaves no ZeRO stage below 3 to bound the experts' states by."""
    cfg, cluster = PRESETS["mixtral-8x7b"], build_cluster("h100-sxm-80gb", 64, 8)
    result = search(cfg, cluster, 4096, 128, Constraints(zero=3, pp=2))
    assert result.ranked and all(e.layout.zero == 3 for e in result.ranked)


def test_two_level_cp_is_priced_as_itself_in_a_search() -> None:
    """The cp variants re-priced per shape share the search's memo: a two-level layout's
    layer times are its own, not the one-level layout's of the same variant."""
    cfg, cluster = PRESETS["llama3-8b"], build_cluster("h100-sxm-80gb", 16, 8)
    result = search(cfg, cluster, 65536, 16, Constraints(cp=8))
    two_level = [e for e in result.ranked if e.layout.cp_a2a > 1]
    assert two_level
    for estimate in two_level[:5]:
        alone = evaluate(cfg, estimate.layout, cluster, 65536, 16)
        assert alone.step_time_s == estimate.step_time_s


# searches whose layouts share per-block times they must not: a rerun that stops early
# (paraxis's eager kernels: a checkpoint group's last block only), FP8 weights cast on
# ZeRO-3's shards, a mixture of experts, CPU ranks
ALONE_CASES = [
    ("llama2-7b", 64, "h100-sxm-80gb", {"kernels": "eager"}, 512, 16384, "bf16"),
    ("llama2-7b", 32, "h100-sxm-80gb", {}, 256, 16384, "fp8"),
    ("mixtral-8x7b", 64, "h100-sxm-80gb", {"kernels": "eager"}, 256, 8192, "bf16"),
    ("llama2-7b-8l", 8, "cpu", {}, 32, 1024, "fp32"),
]


@pytest.mark.parametrize("case", ALONE_CASES, ids=[f"{c[0]}-{c[2]}-{c[6]}" for c in ALONE_CASES])
def test_every_layout_a_search_prices_costs_what_it_costs_alone(case) -> None:
    """A search shares per-block and pipeline times between its layouts (`evaluate`'s
    memo): each layout it priced, priced again alone, takes the same time and memory."""
    name, gpus, gpu, network, batch, seq, precision_name = case
    if gpu == "cpu":
        cfg = dataclasses.replace(PRESETS["llama2-7b"], n_layers=8, name=name)
        cluster = build_cluster("a100-80gb", gpus, 8).replace(cores_per_node=2)
    else:
        cfg, cluster = PRESETS[name], build_cluster(gpu, gpus, 8, network)
    precision = PRECISIONS[precision_name]
    whole = search(cfg, cluster, seq, batch, precision=precision, exhaustive=True)
    priced = whole.ranked + [r.estimate for r in whole.too_big if r.estimate is not None]
    assert len(priced) > 100
    for estimate in priced[::max(1, len(priced) // 300)]:
        alone = evaluate(cfg, estimate.layout, cluster, seq, batch, precision)
        assert alone.step_time_s == estimate.step_time_s, estimate.layout
        assert alone.memory == estimate.memory, estimate.layout


@pytest.mark.parametrize("name, gpus, gpu, batch, seq", [
    ("llama3-8b", 16, "h100-sxm-80gb", 16, 65536),
    ("mixtral-8x7b", 64, "a100-80gb", 64, 32768),
    ("llama2-7b", 32, "a100-80gb", 32, 32768),
])
def test_every_cp_variant_is_above_the_floor_its_siblings_give(name, gpus, gpu, batch,
                                                                seq) -> None:
    """`variants_floor` of a priced layout is under every other cp variant of it (the
    search prices a shape's variants only where that floor does not hide them)."""
    cfg, cluster = PRESETS[name], build_cluster(gpu, gpus, 8)
    whole = search(cfg, cluster, seq, batch, exhaustive=True)
    priced = whole.ranked + [r.estimate for r in whole.too_big if r.estimate is not None]
    siblings: dict = {}
    for estimate in priced:
        if estimate.layout.cp > 1:
            key = estimate.layout.replace(cp_attention="ring", cp_a2a=1)
            siblings.setdefault(key, []).append(estimate)
    pairs = 0
    memo: dict = {}
    for group in siblings.values():
        for estimate in group[:3]:
            floor = variants_floor(cfg, estimate, cluster, seq, batch, MIXED_ADAM,
                                   DEFAULT_OVERLAP, DEFAULT_IMBALANCE, memo)
            assert floor >= step_lower_bound(cfg, estimate.layout, cluster, seq, batch,
                                             memo=memo) * (1 - 1e-12)
            for other in group:
                assert other.step_time_s >= floor * (1 - 1e-12), (estimate.layout,
                                                                   other.layout)
                pairs += other is not estimate
    assert pairs > 100


def test_a_heavier_recomputation_priced_faster_keeps_the_floor_below_it() -> None:
    """Recomputing can make another stage the busiest, one that communicates less (an MoE
    model's dense stage): the priced step then falls, and the floor must too."""
    cfg = PRESETS["tiny-moe-shared"]
    cluster = build_cluster("h100-sxm-80gb", 16, 8).replace(cores_per_node=16)
    precision = PRECISIONS["fp8"]
    for recompute in ("none", "full"):
        layout = Layout(dp=4, pp=4, ep=4, microbatches=2, recompute=recompute)
        price = evaluate(cfg, layout, cluster, 128, 8, precision).step_time_s
        assert step_lower_bound(cfg, layout, cluster, 128, 8, precision) <= price
    whole = search(cfg, cluster, 128, 8, Constraints(recompute=("full",)), precision,
                   exhaustive=True)
    pruned = search(cfg, cluster, 128, 8, Constraints(recompute=("full",)), precision)
    assert [facts(e) for e in pruned.ranked[:6]] == [facts(e) for e in whole.ranked[:6]]


@pytest.mark.parametrize("model, gpus, gpu, batch, seq, constraints", [
    ("llama2-7b", 32, "a100-80gb", 128, 2048, Constraints(schedules=("1f1b", "zb-v"))),
    ("llama2-7b", 32, "a100-80gb", 128, 2048, Constraints(schedules=("interleaved",),
                                                          virtual_stages=(4,))),
    ("gpt2-124m", 64, "h100-sxm-80gb", 512, 1024,
     Constraints(schedules=("1f1b", "zb-v", "interleaved"))),
])
def test_settings_that_break_a_rule_are_refused_not_raised(model, gpus, gpu, batch, seq,
                                                           constraints) -> None:
    """More model chunks than layers, or chunks of unequal layers: the exhaustive search
    records a rule breaker; the floors of such settings must not raise, nor skip them
    unsaid (the answer names each rule broken: `plan/document.py`, the report)."""
    cfg, cluster = PRESETS[model], build_cluster(gpu, gpus, 8)
    whole = search(cfg, cluster, seq, batch, constraints, exhaustive=True)
    pruned = search(cfg, cluster, seq, batch, constraints)
    assert facts(pruned.ranked[0]) == facts(whole.ranked[0])
    assert pruned.rule_breakers
    def rules(result) -> set[str]:
        return {re.sub(r"\d+", "N", r.reason) for r in result.rule_breakers}
    assert rules(pruned) == rules(whole)


def test_zb_v_floors_fold_the_model_twice() -> None:
    """zb-v always runs two model chunks a stage: a floor taken at one chunk misplaces the
    blocks (with dense and MoE blocks, overstating the least any stage communicates) and
    skips layouts the answer shows."""
    cfg = dataclasses.replace(PRESETS["mixtral-8x7b"], name="moe-dense4", n_layers=24,
                              vocab_size=512000, top_k=1, d_ff_expert=2048,
                              first_dense_layers=4)
    cluster = build_cluster("h100-sxm-80gb", 16, 1)
    c = Constraints(schedules=("1f1b", "zb-v"))
    whole = search(cfg, cluster, 8192, 1024, c, exhaustive=True)
    pruned = search(cfg, cluster, 8192, 1024, c)
    assert [facts(e) for e in pruned.ranked[:6]] == [facts(e) for e in whole.ranked[:6]]
    assert leading_shapes(pruned) == leading_shapes(whole)
    band = error_band(cluster)
    assert ([facts(e) for e in ties(pruned.ranked[0], pruned.ranked, band)]
            == [facts(e) for e in ties(whole.ranked[0], whole.ranked, band)])
