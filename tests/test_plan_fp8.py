"""The planner's FP8 model (paraxis/plan/fp8.py): when FP8 pays, what it saves in memory and
in ZeRO's gathers, and where it is refused."""

import dataclasses
from pathlib import Path

import pytest

from paraxis.cli import main
from paraxis.plan.compute import layer_gemm_shapes
from paraxis.plan.cost import evaluate
from paraxis.plan.fp8 import (
    check_fp8,
    gather_bytes_per_param,
    kept_fp8_weight_bytes,
    layer_linears_seconds,
    linear_seconds,
    recasts,
    regather_bytes_per_param,
)
from paraxis.plan.hardware import GPUS, build_cluster
from paraxis.plan.rates import layer_rates, weight_gemm_seconds
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import PRESETS
from paraxis.spec.precision import (
    BF16,
    FP8,
    PRECISIONS,
    Precision,
    PrecisionPolicy,
    get_policy,
)
from paraxis.spec.precision import PRESETS as POLICY_PRESETS

H100 = build_cluster("h100-sxm-80gb", 1, 8)
BF16_PRICE, FP8_PRICE = PRECISIONS["bf16"], PRECISIONS["fp8"]
# The GPU bench's runs on one H100 (bench/gpu.py): GPT-2 124M at 16 x 1024 and the first 8
# layers of Llama 3 8B at 2 x 4096, measured with torchao's float8 (tensorwise) at 0.88x and
# 1.18x of bf16's tokens/s.
GPT2 = (PRESETS["gpt2-124m"], 16, 1024)
LLAMA_SLICE = (PRESETS["llama3-8b"].replace(name="llama3-8b/8", n_layers=8), 2, 4096)


def linears_ratio(cfg, tokens: int, precision: Precision = FP8_PRICE) -> float:
    """bf16 seconds of one layer's block linears (forward + backward) over FP8's."""
    rate, _, hbm = layer_rates(H100, 1)
    bf16 = 3 * weight_gemm_seconds(cfg, H100, 1, rate) * tokens
    return bf16 / sum(layer_linears_seconds(cfg, H100, precision, 1, tokens, hbm))


def step_ratio(run: tuple, cluster=H100) -> float:
    """FP8's tokens/s over bf16's, one GPU."""
    cfg, batch, seq = run
    bf16, fp8 = (evaluate(cfg, Layout(), cluster, seq, batch, p) for p in (BF16_PRICE,
                                                                            FP8_PRICE))
    return fp8.tokens_per_s / bf16.tokens_per_s


def test_fp8_pays_for_large_gemms_and_not_for_tiny_ones() -> None:
    # Llama 3 8B's linears at 8K tokens: the FP8 rate wins by far more than the casts cost
    assert linears_ratio(PRESETS["llama3-8b"], 8192) > 1.4
    # a 256-wide model at 512 tokens: the casts and amax kernels cost more than FP8 saves
    assert linears_ratio(PRESETS["small"], 512) < 1
    # GPT-2's 768-wide linears at one sequence: casts dominate too
    assert linears_ratio(PRESETS["gpt2-124m"], 1024) < 1


def test_fp8_gain_grows_with_the_gemm() -> None:
    ratios = [linears_ratio(PRESETS[name], 8192) for name in
              ("gpt2-124m", "gpt2-1.5b", "llama3-8b", "llama3-70b")]
    assert ratios == sorted(ratios)
    assert step_ratio(LLAMA_SLICE) > step_ratio(GPT2) + 0.1


def test_bench_runs_ratios_beside_the_measured() -> None:
    """The model's FP8 / bf16 step ratios for the GPU bench's two runs (measured 0.88x and
    1.18x): the slice gains, GPT-2 about breaks even (its GEMMs are small)."""
    assert 1.1 < step_ratio(LLAMA_SLICE) < 1.4
    assert 0.9 < step_ratio(GPT2) < 1.1


def test_docs_quote_the_bench_runs_ratios() -> None:
    text = (Path(__file__).resolve().parents[1] / "docs" / "planner.md").read_text()
    assert f"16 x 1024 {step_ratio(GPT2):.2f}x (measured 0.88x" in text
    assert f"2 x 4096\n{step_ratio(LLAMA_SLICE):.2f}x (measured 1.18x)" in text


def test_casts_follow_the_recipe() -> None:
    rate_args = (H100, 8192.0, 4096.0, 14336.0, 2.68e12)
    tensorwise = sum(linear_seconds(rate_args[0], FP8_PRICE, *rate_args[1:]))
    rowwise = sum(linear_seconds(rate_args[0], dataclasses.replace(
        FP8_PRICE, fp8_recipe="rowwise"), *rate_args[1:]))
    delayed = sum(linear_seconds(rate_args[0], dataclasses.replace(
        FP8_PRICE, fp8_recipe="delayed"), *rate_args[1:]))
    assert delayed < tensorwise < rowwise
    # a weight cast on a ZeRO-3 shard costs less than the whole weight's
    shard = sum(linear_seconds(rate_args[0], FP8_PRICE, *rate_args[1:], weight_share=1 / 8))
    assert shard < tensorwise


def test_fp8_memory_keeps_linear_inputs_in_fp8_and_states_as_bf16() -> None:
    cfg, batch, seq = LLAMA_SLICE
    bf16, fp8 = (evaluate(cfg, Layout(), H100, seq, batch, p).memory for p in (BF16_PRICE,
                                                                               FP8_PRICE))
    for state in ("params", "grads", "optimizer"):
        assert fp8[state] == bf16[state]
    assert fp8["activations"] < bf16["activations"]
    # one block's weights in FP8 twice (row- and column-major) while it computes
    assert fp8["buffers"] - bf16["buffers"] == pytest.approx(2 * cfg.layer_params(0))
    # full recomputation keeps only each block's input, a bf16 tensor: nothing to save (at
    # twice the batch: at the slice's own, the backward's start and the optimizer step,
    # where no activation is alive, hold within 2 MB of each other)
    full = Layout(recompute="full")
    bf16, fp8 = (evaluate(cfg, full, H100, seq, 2 * batch, p).memory for p in (BF16_PRICE,
                                                                               FP8_PRICE))
    assert fp8["activations"] == bf16["activations"] > 0


def test_fp8_weight_gather_halves_the_linears_gathers() -> None:
    cfg = PRESETS["llama3-8b"]
    gathered = dataclasses.replace(FP8_PRICE, fp8_weight_gather=True)
    assert gather_bytes_per_param(cfg, FP8_PRICE) == 2
    # the linears travel at 1 byte; embeddings, norms and the head at 2
    assert 1 < gather_bytes_per_param(cfg, gathered) < 1.2
    cluster = build_cluster("h100-sxm-80gb", 16, 8)
    layout = Layout(dp=16, zero=3)
    off, on = (evaluate(cfg, layout, cluster, 8192, 32, p) for p in (FP8_PRICE, gathered))
    assert on.time["dp_total"] < off.time["dp_total"]
    # autograd keeps every block's gathered FP8 weights to its backward (1 byte a
    # parameter, unsharded): beside them the gathered buffers are smaller
    kept = kept_fp8_weight_bytes(cfg, gathered, 1, cfg.n_layers, 0)
    assert kept == pytest.approx(sum(k * n for k, n in layer_gemm_shapes(cfg)) * cfg.n_layers)
    assert off.memory["buffers"] < on.memory["buffers"] < off.memory["buffers"] + kept
    # full recompute gathers the FP8 weights again for the backward's rerun, of every block
    # or, under the block method, of the blocks it checkpoints: 8 of Llama 3 8B's 32 here
    kept = regather_bytes_per_param(cfg, gathered, "none")
    again = regather_bytes_per_param(cfg, gathered, "full")
    assert kept < 1 and again == gather_bytes_per_param(cfg, gathered)
    assert regather_bytes_per_param(cfg, gathered, "full", 0.25) == pytest.approx(
        kept + 0.25 * (again - kept))
    none, block, full = (evaluate(cfg, layout.replace(**fields), cluster, 8192, 32, gathered)
                         for fields in ({}, {"recompute": "full", "recompute_method": "block",
                                             "recompute_layers": 8}, {"recompute": "full"}))
    assert none.time["dp_total"] < block.time["dp_total"] < full.time["dp_total"]
    assert block.time["dp_total"] - none.time["dp_total"] == pytest.approx(
        (full.time["dp_total"] - none.time["dp_total"]) / 4, rel=1e-6)


def test_fp8_policy_is_bf16s_states_with_fp8_gemms() -> None:
    assert (FP8.param_bytes, FP8.grad_bytes, FP8.optimizer_bytes) == (
        BF16.param_bytes, BF16.grad_bytes, BF16.optimizer_bytes)
    assert FP8.fp8_recipe == "tensorwise" and BF16.fp8_recipe is None
    assert "FP8 block GEMMs (tensorwise)" in FP8.describe()
    # both runtime presets price FP8 with their own scales
    assert PRECISIONS["fp8-rowwise"].fp8_recipe == "rowwise"
    assert PRECISIONS["bf16"].fp8_recipe is None
    assert FP8_PRICE.total_bytes == BF16_PRICE.total_bytes == 16
    with pytest.raises(ParaxisError, match="fp8_recipe 'blockwise' is unknown"):
        PrecisionPolicy("x", "bf16", "bf16", "bf16", "bf16", master_weights=True,
                        fp8_recipe="blockwise")
    # Transformer Engine's delayed scaling is the planner's alone: no runtime policy runs it
    with pytest.raises(ParaxisError, match="fp8_recipe 'delayed' is unknown"):
        PrecisionPolicy("x", "bf16", "bf16", "bf16", "bf16", master_weights=True,
                        fp8_recipe="delayed")
    with pytest.raises(ParaxisError, match="unknown"):
        check_fp8(GPUS["h100-sxm-80gb"], dataclasses.replace(FP8_PRICE, fp8_recipe="blockwise"))


def test_fp8_is_refused_on_gpus_without_fp8_tensor_cores() -> None:
    for name in ("a100-80gb", "a100-40gb", "v100-32gb"):
        with pytest.raises(ParaxisError, match=f"{name} has none"):
            check_fp8(GPUS[name], FP8_PRICE)
    for name in ("h100-sxm-80gb", "h100-pcie-80gb", "h200", "l40s"):
        check_fp8(GPUS[name], FP8_PRICE)  # FP8 tensor cores
        assert GPUS[name].fp8_peak_flops == pytest.approx(2 * GPUS[name].peak_flops, rel=0.02)
    cfg, batch, seq = GPT2
    with pytest.raises(ParaxisError, match="a100-80gb"):
        evaluate(cfg, Layout(), build_cluster("a100-80gb", 1, 8), seq, batch, FP8_PRICE)


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_fp8_end_to_end(capsys) -> None:
    code, out, _ = run_cli(capsys, "plan", "--model", "llama3-8b", "--gpus", "8", "--gpu",
                           "h100-sxm-80gb", "--precision", "fp8", "--global-batch", "64",
                           "--seq-len", "8192", "--top", "2")
    assert code == 0
    assert "FP8 (tensorwise scales)" in out and "ZeRO gathers bf16 weights" in out
    code, out, _ = run_cli(capsys, "plan", "--model", "llama3-8b", "--gpus", "8", "--gpu",
                           "h200", "--precision", "fp8", "--fp8-weight-gather",
                           "--global-batch", "64", "--seq-len", "8192",
                           "--layout", "dp=8,zero=3,microbatches=8")
    assert code == 0
    assert "FP8 (tensorwise scales)" in out and "ZeRO gathers FP8 weights" in out
    code, out, _ = run_cli(capsys, "plan", "--model", "llama3-8b", "--gpus", "8", "--gpu",
                           "h100-sxm-80gb", "--precision", "fp8-rowwise", "--global-batch",
                           "64", "--seq-len", "8192", "--top", "2")
    assert code == 0
    assert "FP8 (rowwise scales)" in out
    code, out, _ = run_cli(capsys, "plan", "--model", "llama3-8b", "--gpus", "8", "--gpu",
                           "h100-sxm-80gb", "--precision", "fp8", "--fp8-recipe", "delayed",
                           "--global-batch", "64", "--seq-len", "8192", "--top", "2")
    assert code == 0
    assert "FP8 (delayed scales)" in out


def test_plan_fp8_on_a100_is_one_line_exit_2(capsys) -> None:
    code, out, err = run_cli(capsys, "plan", "--model", "llama3-8b", "--gpus", "8", "--gpu",
                             "a100-80gb", "--precision", "fp8")
    assert code == 2 and not out
    assert len(err.strip().splitlines()) == 1 and "a100-80gb has none" in err


def test_fp8_flags_need_fp8(capsys) -> None:
    code, _, err = run_cli(capsys, "plan", "--model", "llama3-8b", "--gpus", "8", "--gpu",
                           "h100-sxm-80gb", "--fp8-weight-gather")
    assert code == 2 and "add --precision fp8" in err


def test_train_takes_only_the_recipes_the_runtime_runs() -> None:
    """`paraxis train --precision` takes the runtime's presets; the planner's delayed scaling
    is a pricing recipe (--fp8-recipe) that no preset names."""
    fp8 = {name for name, policy in POLICY_PRESETS.items() if policy.fp8_recipe is not None}
    assert fp8 == {"fp8", "fp8-rowwise"}
    assert get_policy("fp8-rowwise").fp8_recipe == "rowwise"
    with pytest.raises(ParaxisError, match="unknown"):
        get_policy("fp8-delayed")


def test_the_gather_flag_is_refused_where_train_refuses_it(capsys) -> None:
    """`paraxis train` gathers FP8 weights cast with one scale per GEMM, under ZeRO-3 only
    (spec.precision.fp8_gather_problem): the plan says so in one line, exit 2."""
    base = ("plan", "--model", "llama3-8b", "--gpus", "8", "--gpu", "h100-sxm-80gb",
            "--global-batch", "64", "--seq-len", "8192", "--fp8-weight-gather")
    for more, words in ((("--precision", "fp8-rowwise"), "rowwise recipe"),
                        (("--precision", "fp8", "--fp8-recipe", "delayed"), "delayed recipe"),
                        (("--precision", "fp8", "--zero", "1"), "zero=1"),
                        (("--precision", "fp8", "--layout", "dp=8,zero=2"), "zero=2")):
        code, out, err = run_cli(capsys, *base, *more)
        assert code == 2 and not out and len(err.strip().splitlines()) == 1, more
        assert words in err and "--fp8-weight-gather" in err, err


def test_the_search_gathers_fp8_weights_only_under_zero3() -> None:
    """Below ZeRO-3 the runtime keeps the weights whole and gathers nothing in FP8: the
    search prices those layouts as without the flag."""
    from paraxis.plan.search import Constraints, search

    cfg, cluster = PRESETS["llama3-8b"], build_cluster("h100-sxm-80gb", 16, 8)
    gathered = dataclasses.replace(FP8_PRICE, fp8_weight_gather=True)
    for zero in (1, 2):
        found = search(cfg, cluster, 8192, 32, Constraints(zero=zero), gathered)
        best = found.ranked[0]
        assert best.step_time_s == evaluate(cfg, best.layout, cluster, 8192, 32,
                                            FP8_PRICE).step_time_s
        # evaluate prices what it is given (the published ZeRO-1 runs that gather FP8
        # parameters after the step): faster here
        assert evaluate(cfg, best.layout, cluster, 8192, 32, gathered).step_time_s \
            < best.step_time_s


def test_the_search_skips_splits_the_fp8_gemms_cannot_run() -> None:
    """d_ff 208 splits over tp=2 into 104 columns, not a multiple of 16: FP8 refuses that
    layout in `paraxis train`, so the search does not rank it; bf16 does."""
    from paraxis.plan.search import search

    cfg = PRESETS["tiny-llama"].replace(name="odd", d_ff=208)
    cluster = build_cluster("h100-sxm-80gb", 2, 8)
    fp8, bf16 = (search(cfg, cluster, 128, 8, precision=p) for p in (FP8_PRICE, BF16_PRICE))
    assert {e.layout.tp for e in bf16.ranked} == {1, 2}
    assert {e.layout.tp for e in fp8.ranked} == {1}
    assert any("multiple of 16" in r.reason for r in fp8.rule_breakers)


def test_rowwise_keeps_16_bit_inputs_and_tensorwise_recasts_its_weights() -> None:
    """The rowwise recipe saves its 16-bit inputs (its backward casts them along the other
    dim): bf16's activations. Tensorwise casts each weight again in the backward, unless
    ZeRO-3 gathered it in FP8 and autograd kept that copy."""
    cfg, batch, seq = LLAMA_SLICE
    rowwise = dataclasses.replace(FP8_PRICE, fp8_recipe="rowwise")
    bf16, fp8_rowwise = (evaluate(cfg, Layout(), H100, seq, batch, p).memory["activations"]
                         for p in (BF16_PRICE, rowwise))
    assert fp8_rowwise == bf16
    hbm = 2.68e12
    again, kept = (layer_linears_seconds(cfg, H100, FP8_PRICE, 1, 8192, hbm, gathered=g)[1]
                   for g in (False, True))
    assert again - kept == pytest.approx(3 * sum(k * n for k, n in layer_gemm_shapes(cfg)) / hbm)
    assert recasts(FP8_PRICE) == 1 and recasts(FP8_PRICE, gathered=True) == 0
    assert recasts(rowwise) == recasts(dataclasses.replace(FP8_PRICE, fp8_recipe="delayed")) == 0

