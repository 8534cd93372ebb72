"""Model-state memory: the seeds' worked examples and the ZeRO paper's Table 1."""

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from paraxis.plan.memory import (
    FP32_ADAM,
    MIXED_ADAM,
    layout_memory,
    model_state_bytes,
    stage_local_params,
    zero_table,
)
from paraxis.spec.errors import ParaxisError
from paraxis.spec.kernels import workspace_bytes
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import PRESETS
from paraxis.spec.precision import MASTER_UNITS_A_CALL

GB = 1e9


def total_gb(num_params: int, dp: int, zero: int) -> float:
    return sum(model_state_bytes(num_params, dp, zero).values()) / GB


@pytest.mark.parametrize("zero, expected_gb", [(0, 112), (1, 38.5), (2, 26.25), (3, 14)])
def test_seeds_7b_on_8_gpus(zero: int, expected_gb: float) -> None:
    assert total_gb(7 * 10**9, 8, zero) == pytest.approx(expected_gb, abs=1e-9)


def test_seeds_13b_on_16_gpus_zero3() -> None:
    assert total_gb(13 * 10**9, 16, 3) == pytest.approx(13.0, abs=1e-9)


def test_seeds_zero3_sends_one_and_a_half_times_zero1() -> None:
    """The seeds' "ZeRO-3 adds extra communication (1.5x vs ZeRO-1)", and the planner's step
    time on a latency-free link moves the same bytes (its collectives are these)."""
    from paraxis.plan.comm import Link, dp_sync_time

    traffic = [row["traffic"] for row in zero_table(7 * 10**9, 8)]
    assert traffic[0] == traffic[1] == traffic[2] == pytest.approx(2 * 14e9 * 7 / 8)
    assert traffic[3] / traffic[1] == pytest.approx(1.5)
    link = Link(bandwidth_Bps=1e10, latency_s=0.0, crosses_nodes=False)
    times = [dp_sync_time(7e9, 8, zero, link) for zero in range(4)]
    assert [t * 1e10 for t in times] == pytest.approx(traffic)


def test_seeds_16p_rule_components() -> None:
    states = model_state_bytes(7 * 10**9, 1, 0)
    assert states == {"params": 14e9, "grads": 14e9, "optimizer": 84e9}


# ZeRO (Rajbhandari et al. 2020) Table 1: per-device GB for P_os, P_os+g, P_os+g+p.
ZERO_TABLE_1 = {
    7.5e9: {1: (120, 120, 120), 4: (52.5, 41.3, 30), 16: (35.6, 21.6, 7.5),
            64: (31.4, 16.6, 1.88), 256: (30.4, 15.4, 0.47), 1024: (30.1, 15.1, 0.12)},
    128e9: {1: (2048, 2048, 2048), 4: (896, 704, 512), 16: (608, 368, 128),
            64: (536, 284, 32), 256: (518, 263, 8), 1024: (513, 257, 2)},
    1e12: {1: (16000, 16000, 16000), 4: (7000, 5500, 4000), 16: (4750, 2875, 1000),
           64: (4187, 2218, 250), 256: (4046, 2054, 62.5), 1024: (4011, 2013, 15.6)},
}


@pytest.mark.parametrize("num_params", list(ZERO_TABLE_1))
@pytest.mark.parametrize("dp", [1, 4, 16, 64, 256, 1024])
def test_zero_paper_table_1_within_2_percent(num_params: float, dp: int) -> None:
    for zero, published in zip((1, 2, 3), ZERO_TABLE_1[num_params][dp], strict=True):
        # 2% or the paper's own rounding to two decimals (it prints 0.12 for 120/1024 = 0.117)
        assert total_gb(int(num_params), dp, zero) == pytest.approx(published, rel=0.02,
                                                                     abs=0.005)


def test_fp32_adam_is_16_bytes_too_but_split_differently() -> None:
    states = model_state_bytes(10, 1, 0, FP32_ADAM)
    assert states == {"params": 40, "grads": 40, "optimizer": 80}
    assert MIXED_ADAM.total_bytes == FP32_ADAM.total_bytes == 16


def test_zero_table_rows() -> None:
    rows = zero_table(7 * 10**9, 8)
    assert [row["zero"] for row in rows] == [0, 1, 2, 3]
    assert [row["total"] / GB for row in rows] == pytest.approx([112, 38.5, 26.25, 14])


def test_memory_command_counts_whole_parameters(capsys) -> None:
    """--params 1.9 was titled 1.9 parameters (as "1.9e-09B") and priced as 1."""
    import json

    from paraxis.cli import main

    assert main(["memory", "--params", "1.9", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["params"] == 2
    for count, title in (("1.9", "2 parameters"), ("125e6", "125M parameters"),
                         ("7e9", "7B parameters")):
        assert main(["memory", "--params", count]) == 0
        assert f"{title} on 8 GPUs" in capsys.readouterr().out


@given(st.integers(1, 10**13), st.integers(1, 4096))
def test_memory_never_increases_with_a_higher_zero_stage(num_params: int, dp: int) -> None:
    totals = [total_gb(num_params, dp, zero) for zero in range(4)]
    pairs = zip(totals, totals[1:], strict=False)
    assert all(later <= earlier * (1 + 1e-12) for earlier, later in pairs)


@pytest.mark.parametrize("kwargs", [dict(num_params=-1, dp=1, zero=0),
                                    dict(num_params=1, dp=0, zero=0),
                                    dict(num_params=1, dp=1, zero=4)])
def test_bad_input_is_a_paraxis_error(kwargs: dict) -> None:
    with pytest.raises(ParaxisError):
        model_state_bytes(**kwargs)


@given(st.sampled_from(["gpt2-1.5b", "llama2-7b", "llama2-70b", "gpt3-175b"]),
       st.sampled_from([2, 4, 8, 64]), st.sampled_from([1, 2, 8]),
       st.sampled_from(["none", "selective", "full"]))
def test_layout_memory_never_increases_with_a_higher_zero_stage(name: str, dp: int, tp: int,
                                                                recompute: str) -> None:
    cfg = PRESETS[name]
    totals = [layout_memory(cfg, Layout(dp=dp, tp=tp, zero=zero, recompute=recompute), 2048,
                            1)["total"] for zero in range(4)]
    assert all(later <= earlier for earlier, later in zip(totals, totals[1:], strict=False))


def test_layout_memory_by_stage() -> None:
    cfg = PRESETS["llama2-70b"]
    one = layout_memory(cfg, Layout(dp=1, tp=8, pp=1), 4096, 1)
    four = layout_memory(cfg, Layout(dp=1, tp=8, pp=4, microbatches=8), 4096, 1)
    # a quarter of the blocks (plus the embedding) on the worst stage
    assert four["params"] == pytest.approx(
        2 * (20 * cfg.layer_params() + cfg.embedding_params()) / 8, rel=1e-6)
    # stage 0 holds pp = 4 microbatches of a quarter of the layers: the same as pp = 1's one
    # microbatch of every layer (Korthikanti et al. 2022 Sec. 4.2.3); pp = 1's one stage also
    # holds the loss: bf16 logits, their gradient written over them (2sbv/t), and one
    # chunk's fp32 workspace
    loss = 2 * 4096 * 32000 / 8 + workspace_bytes(4096, 4000)
    assert four["activations"] == pytest.approx(one["activations"] - loss, rel=1e-6)
    gpipe = layout_memory(cfg, Layout(dp=1, tp=8, pp=4, microbatches=8, schedule="gpipe"),
                          4096, 1)
    # GPipe holds all M = 8 on every stage; the last stage (LM head, logits) is then the
    # worst, each microbatch's logits held from the head's forward to its backward
    assert gpipe["stage"] == 3
    logits = 2 * 4096 * 32000 / 8
    assert gpipe["activations"] == pytest.approx(2 * four["activations"] + loss
                                                 + 7 * logits, rel=1e-6)


def test_the_planner_prices_the_runtimes_own_stagepartition_of():
    from paraxis.plan.memory import stage_params
    from paraxis.plan.stages import stage_layers
    from paraxis.spec.partition import partition_layers

    # gpt2-124m (12 blocks, a heavy head) over 5 stages: the FLOP-balanced split is uneven and
    # not the even split's [3, 3, 2, 2, 2].
    cfg = PRESETS["gpt2-124m"]
    for pp, virtual in ((5, 1), (3, 1), (2, 3)):
        runtime = partition_layers(cfg, pp, virtual, seq_len=1024)
        expected = [sum(len(runtime.blocks_of(s, c)) for c in range(virtual)) for s in range(pp)]
        assert stage_layers(cfg, pp, virtual, seq_len=1024) == expected
    counts = stage_layers(cfg, 5, seq_len=1024)
    assert counts != [3, 3, 2, 2, 2] and sum(counts) == 12
    assert stage_params(cfg, 5, seq_len=1024)[1] == counts[1] * cfg.layer_params()


def test_grouped_full_recompute_keeps_one_input_per_run_of_blocks() -> None:
    # the course's sqrt(L) rule on llama2-7b (32 blocks): a checkpoint per run of 6 blocks
    # keeps ceil(32 / 6) = 6 block inputs instead of 32, and rebuilds 6 blocks at once
    # (two microbatches: at the backward the gradients exist whole, so the activations'
    # moment is each layout's peak, not the optimizer step's)
    cfg = PRESETS["llama2-7b"]
    every = layout_memory(cfg, Layout(recompute="full", microbatches=2), 4096, 1)
    grouped = layout_memory(cfg, Layout(recompute="full", recompute_layers=6, microbatches=2),
                            4096, 1)
    head = layout_memory(cfg, Layout(recompute="full", recompute_layers=10**6,
                                     microbatches=2), 4096, 1)
    inputs = every["activations"] - head["activations"]  # 31 block inputs
    assert every["activations"] - grouped["activations"] == pytest.approx(inputs * 26 / 31)
    assert grouped["buffers"] == pytest.approx(6 * every["buffers"])
    with pytest.raises(ParaxisError, match="groups the blocks of full recompute"):
        Layout(recompute="selective", recompute_layers=2)


def test_the_block_method_is_priced_between_no_recompute_and_full() -> None:
    """recompute_method=block on llama2-7b (32 blocks) on 8 H100s: N blocks checkpointed
    keep their inputs and rerun their forwards, the others keep everything and do not, so
    activations fall and the step grows linearly in N, from no recompute to full at N = 32
    (the same estimate as uniform full recompute there); the rebuilt block adds nothing to
    the peak but at N = 32 (the first blocks are rebuilt last, after the others freed more);
    with interleaving, N counts in each chunk."""
    from paraxis.plan.cost import evaluate
    from paraxis.plan.hardware import build_cluster

    cfg, cluster = PRESETS["llama2-7b"], build_cluster("h100-sxm-80gb", 8, 8)
    runs = {n: evaluate(cfg, Layout.parse(
        f"dp=8,zero=1,recompute=full,recompute_method=block,recompute_layers={n}"), cluster,
        4096, 64) for n in (8, 16, 32)}
    none = evaluate(cfg, Layout(dp=8, zero=1), cluster, 4096, 64)
    full = evaluate(cfg, Layout(dp=8, zero=1, recompute="full"), cluster, 4096, 64)
    assert runs[32].step_time_s == pytest.approx(full.step_time_s)
    assert runs[32].memory == pytest.approx(full.memory)
    for n in (8, 16):
        share = n / 32
        assert runs[n].memory["activations"] == pytest.approx(none.memory["activations"] + share
                                                              * (full.memory["activations"]
                                                                 - none.memory["activations"]))
        assert runs[n].memory["buffers"] == pytest.approx(none.memory["buffers"])
        assert runs[n].step_time_s == pytest.approx(
            none.step_time_s + share * (full.step_time_s - none.step_time_s), rel=1e-3)
        assert none.hfu < runs[n].hfu < full.hfu
    pipelined = "dp=2,pp=4,zero=1,microbatches=8,schedule=interleaved,virtual_stages=2"
    chunked = evaluate(cfg, Layout.parse(pipelined + ",recompute=full,recompute_method=block,"
                                         "recompute_layers=2"), cluster, 4096, 64)
    bare, every = (evaluate(cfg, Layout.parse(pipelined + extra), cluster, 4096, 64)
                   for extra in ("", ",recompute=full"))
    # 2 of each chunk's 4 blocks
    assert chunked.memory["activations"] == pytest.approx(
        (bare.memory["activations"] + every.memory["activations"]) / 2, rel=0.02)
    assert bare.step_time_s < chunked.step_time_s < every.step_time_s


def test_the_block_method_counts_the_blocks_the_runtime_recomputes() -> None:
    """The blocks the planner prices as recomputed are those `Transformer.set_recompute`
    marks, chunk by chunk of the runtime's own partition: zb-v's chunks of one stage differ
    in size (Llama 3 8B on 4 stages: 4 and 2 blocks on the first, so 3 of each recomputes 5
    of 6), and the first blocks of an MoE model's chunk may be its dense ones (3 of
    deepseek-v3-style's). Where a chunk is recomputed whole, or a split backward keeps the
    chunk's graph for W, the rebuilt block is held at the peak (`layout_memory`)."""
    import torch

    from paraxis.model.transformer import Transformer
    from paraxis.plan.stages import partition_of, recomputed_kinds

    for name, text in (("llama3-8b", "pp=4,microbatches=8,schedule=zb-v"),
                       ("llama3-8b", "pp=2,microbatches=4,schedule=interleaved,virtual_stages=2"),
                       ("deepseek-v3-style", "pp=1")):
        cfg = PRESETS[name]
        layout = Layout.parse(text + ",recompute=full,recompute_method=block,recompute_layers=3")
        partition = partition_of(cfg, layout.pp, layout.virtual_stages, 4096, layout.placement)
        for stage, (dense, moe, whole) in enumerate(recomputed_kinds(cfg, layout, 4096)):
            marked, chunks = [], [partition.blocks_of(stage, c)
                                  for c in range(layout.virtual_stages)]
            for blocks in chunks:
                with torch.device("meta"):
                    part = Transformer(cfg, blocks=blocks, embed=False, head=False)
                part.set_recompute("full", 3, "block")
                marked += [i for i, b in zip(blocks, part.blocks, strict=True) if b.recompute]
            experts = sum(i >= cfg.first_dense_layers for i in marked) if cfg.is_moe else 0
            assert (dense, moe) == (len(marked) - experts, experts), (name, text, stage)
            assert whole == any(len(blocks) <= 3 for blocks in chunks)
    zb = Layout.parse("pp=2,microbatches=4,schedule=zb-h1,recompute=full,"
                      "recompute_method=block,recompute_layers=1")
    plain = zb.replace(schedule="1f1b")
    rebuilt = (layout_memory(PRESETS["llama2-7b"], zb, 4096, 1)["buffers"]
               - layout_memory(PRESETS["llama2-7b"], plain, 4096, 1)["buffers"])
    assert rebuilt > 1e8  # a Llama 2 7B block's activations at 4K tokens


def test_one_backward_holds_the_heads_gradient_at_its_peak_every_one_at_the_step() -> None:
    # One microbatch on one rank: the backward's start holds the activations and the LM
    # head's gradient alone; two microbatches hold every gradient beside the second's
    # activations; with activations this small the optimizer step is the peak, every
    # gradient there with the flat copies of the gradients of a call's units (the masters
    # step from them, a bucket's parameters each at most; a parameter larger than a bucket,
    # alone in its unit, needs none)
    cfg = PRESETS["llama3-8b"]
    one = layout_memory(cfg, Layout(), 4096, 2)
    two = layout_memory(cfg, Layout(microbatches=2), 4096, 2)
    head = cfg.vocab_size * cfg.d_model * 2  # bf16
    assert one["grads"] == head and two["grads"] == cfg.num_params() * 2
    assert one["activations"] == two["activations"] > 0
    assert one["total"] == pytest.approx(two["total"] - two["grads"] + head)
    small = layout_memory(cfg, Layout(recompute="full"), 128, 1)
    assert small["activations"] == 0 and small["grads"] == cfg.num_params() * 2
    calls = MASTER_UNITS_A_CALL * 25 * 2**20  # bf16: 2 bytes x a 25 MiB bucket's, a unit
    assert small["buffers"] == calls
    # CPU ranks step through torch's fused kernel: an fp32 copy of the largest unit's
    # gradient too, the LM head alone in its own
    cpu = layout_memory(cfg, Layout(recompute="full"), 128, 1, one_pass=False)
    assert cpu["buffers"] == calls + 4 * cfg.vocab_size * cfg.d_model
    # under ZeRO the copy is of this rank's shard: a model smaller than a bucket, a quarter
    from paraxis.plan.memory import master_step_buffers

    tiny = PRESETS["tiny"].num_params()
    assert master_step_buffers(PRESETS["tiny"], Layout(dp=4, zero=1), tiny, 0, MIXED_ADAM,
                               one_pass=False) == 4 * tiny / 4
    # an expert's matrix is a unit of its own, sharded over the ranks holding that expert:
    # Mixtral's 14336 x 4096 whole on each of ep = dp = 8 ranks, not an eighth of it
    mixtral = PRESETS["mixtral-8x7b"]
    local, experts = stage_local_params(mixtral, Layout(dp=8, ep=8, zero=1))[0]
    assert master_step_buffers(mixtral, Layout(dp=8, ep=8, zero=1), local, experts,
                               MIXED_ADAM, one_pass=False) == 4 * 14336 * 4096
    # fp32 parameters are their own masters: no copies
    fp32 = layout_memory(cfg, Layout(recompute="full"), 128, 1, precision=FP32_ADAM)
    assert fp32["buffers"] == 0
    # the reducer's persistent flat buffers hold every gradient throughout: any ZeRO stage,
    # even on one rank, or gradients in another dtype than the parameters
    from paraxis.spec.precision import PRECISIONS

    for layout, precision in ((Layout(zero=1), MIXED_ADAM), (Layout(zero=2), MIXED_ADAM),
                              (Layout(zero=3), MIXED_ADAM),
                              (Layout(), PRECISIONS["bf16-fp32grad"])):
        held = layout_memory(cfg, layout, 4096, 2, precision=precision)
        assert held["grads"] == cfg.num_params() * precision.grad_bytes, layout


@pytest.mark.parametrize("run, side", [
    ("h200-2026-11-27b/llama.json", "paraxis --compile"),
    ("h200-2026-11-27b/llama-fused.json", "paraxis --compile --fused-loss"),
    ("h200-2026-11-26b/gpt2.json", "paraxis --compile"),
    ("h200-2026-11-26b/gpt2-8.json", "paraxis --compile")])
def test_the_one_gpu_peaks_measured_on_an_h200_are_forecast_within_2_percent(run, side):
    """bench.gpu's compiled sides (one rank, one microbatch) against torch's
    max_memory_allocated on an H200 (docs/gpu/README.md): the forecast less its reserve
    (the CUDA context and the allocator's slack, which that count leaves out). These are
    the runs the two moments of `layout_memory` were worked out from, so this pins them in
    sample; the next GPU run's peaks are their first held-out check."""
    from bench import gpu

    recorded = json.loads((Path(__file__).parents[1] / "docs" / "gpu" / run).read_text())
    (measured,) = recorded["runs"]
    memory = gpu.planned(gpu.model(measured["model"]), measured["batch"], measured["seq"],
                         "h200")[side].memory
    peak = measured["sides"][side]["peak_memory_bytes"]
    assert (memory["total"] - memory["reserved"]) / peak == pytest.approx(1, abs=0.02)


def test_no_gradient_bucket_holds_more_than_the_stage_s_gradients() -> None:
    """A 25 MB bucket of a model whose gradients take 1 MB is that 1 MB: the tiny model at
    dp=2 was forecast with 52 MB of buffers where its run held under 1 (a review measured
    it); a large model's buckets are unchanged."""
    tiny = PRESETS["tiny"]
    memory = layout_memory(tiny, Layout(dp=2), 128, 2)
    assert memory["buffers"] <= 2 * memory["grads"]
    big = layout_memory(PRESETS["llama2-7b"], Layout(dp=8), 4096, 1)
    assert big["buffers"] == pytest.approx(2 * 25 * 2**20, rel=1e-6)
