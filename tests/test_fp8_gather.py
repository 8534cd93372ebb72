"""ZeRO-3 all-gathering the blocks' FP8 weights in FP8 (`--fp8-weight-gather`,
engine/data_parallel/fp8_gather.py): the same bits as gathering them in bf16 and casting
after, on every layout it runs with; half the bytes on the wire for those weights; refused in
one line where it cannot run."""

import dataclasses

import pytest
import torch

from paraxis.dist.testing import RankContext, run_on_ranks
from paraxis.engine.data_parallel import flat
from paraxis.kernels.fp8 import E4M3, quantize
from paraxis.parallelize import build_engine
from paraxis.plan.fp8 import kept_fp8_weight_bytes
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import PRESETS
from paraxis.spec.precision import PRECISIONS, fp8_gather_problem
from paraxis.spec.runtime_options import RuntimeOptions

TINY = PRESETS["tiny-llama"]  # stacked q/k/v and gate/up, grouped-query attention
GPT2 = PRESETS["tiny"]  # biases, LayerNorm, a GELU MLP
ROWS, SEQ, STEPS = 8, 32, 3


def _train(ctx: RankContext, model: str, gather: bool) -> tuple[list[float], int]:
    """Losses and norms of STEPS steps on this rank's share, and the bytes all-gathered."""
    cfg = PRESETS[model]
    engine = build_engine(cfg, ctx.layout, ctx.groups, "cpu", seed=0,
                          options=RuntimeOptions(precision="fp8", fp8_weight_gather=gather))
    flat.VOLUME["all_gather"] = 0
    out = []
    per_dp = ROWS // ctx.layout.dp
    rank = ctx.groups.dp_rank
    for step in range(STEPS):
        tokens = torch.randint(0, cfg.vocab_size, (ROWS, SEQ + 1),
                               generator=torch.Generator().manual_seed(step))
        x, y = tokens[rank * per_dp:(rank + 1) * per_dp, :-1], \
            tokens[rank * per_dp:(rank + 1) * per_dp, 1:]
        out.append(engine.forward_backward(x, y))
        out.append(engine.clip_grad_norm(1.0))
        engine.optimizer_step(1e-3)
        engine.zero_grad()
    return out, flat.VOLUME["all_gather"]


def _copies_match(ctx: RankContext, model: str) -> bool:
    """Each FP8 unit's gathered copy against the cast one device makes of the whole weight
    (gathered in bf16, stacked as its GEMM stacks it; its amax over the tp group, as
    `Fp8Matmul` reduces it): the same bits."""
    engine = build_engine(PRESETS[model], ctx.layout, ctx.groups, "cpu", seed=0,
                          options=RuntimeOptions(precision="fp8", fp8_weight_gather=True))
    engine = getattr(engine, "data_parallel", engine)  # a pipeline stage's
    gatherer, same = engine.gatherer, True
    for index, unit in enumerate(engine.units):
        if getattr(unit, "fp8", None) is None:
            continue
        whole = gatherer.full_flat(index)
        gatherer.gather(index)
        for gemm, (start, end) in zip(unit.fp8.gemms, unit.fp8.spans, strict=True):
            w8, scale = gemm[0].weight.fp8_cast
            weight = whole[start:end].view(-1, gemm[0].weight.shape[1])
            want8, want_scale = quantize(weight, E4M3, False, gemm[0].fp8.weight_groups)
            same &= bool(torch.equal(w8.view(torch.uint8), want8.view(torch.uint8))
                         and torch.equal(scale, want_scale))
        gatherer.free(index)
    return same


def _kept_copies(ctx: RankContext, model: str) -> tuple[int, int]:
    """Bytes of the gathered FP8 weights a forward's autograd keeps for its backward, and
    the bytes of padding their units carry (each padded to a multiple of dp)."""
    engine = build_engine(PRESETS[model], ctx.layout, ctx.groups, "cpu", seed=0,
                          options=RuntimeOptions(precision="fp8", fp8_weight_gather=True))
    gatherer, kept = engine.gatherer, {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if any(storage.data_ptr() == full8.untyped_storage().data_ptr()
               for full8, _ in gatherer._fp8.values()):
            kept[storage.data_ptr()] = storage.nbytes()
        return tensor

    x = torch.randint(0, PRESETS[model].vocab_size, (ROWS // ctx.layout.dp, SEQ),
                      generator=torch.Generator().manual_seed(0))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = engine.loss(x, x)
    engine.backward(loss)
    pads = sum(u.padded_numel - u.numel for u in engine.units if getattr(u, "fp8", None))
    return sum(kept.values()), pads


def _both(ctx: RankContext) -> dict[str, object]:
    model = "tiny" if ctx.layout.recompute == "full" else \
        "tiny-moe" if ctx.layout.ep > 1 else "tiny-llama"
    bf16, bf16_bytes = _train(ctx, model, gather=False)
    fp8, fp8_bytes = _train(ctx, model, gather=True)
    kept = _kept_copies(ctx, model) if ctx.layout.pp == 1 else None
    return {"bf16": bf16, "fp8": fp8, "bf16_bytes": bf16_bytes, "fp8_bytes": fp8_bytes,
            "copies": _copies_match(ctx, model), "kept": kept}


FULL = "dp=4,zero=3,recompute=full"
BLOCK = "dp=4,zero=3,recompute=full,recompute_method=block,recompute_layers=1"
LAYOUTS = ["dp=4,zero=3,microbatches=2", "dp=2,tp=2,sp=true,zero=3",
           "dp=2,cp=2,zero=3", FULL, BLOCK,
           "dp=2,pp=2,zero=3,microbatches=4,schedule=zb-h1",
           "dp=2,pp=2,zero=3,microbatches=2,zero3_reshard=step",
           "dp=2,ep=2,tp=2,etp=2,zero=3"]  # experts split over tp, gathered in bf16


def test_fp8_gathered_weights_are_the_casts_and_train_alike_with_fewer_bytes():
    """The gathered copies are the weights' own casts bit for bit, so the first step's loss
    is the same number; after it the two runs differ only by where the bf16 gradients' sums
    round (an FP8 unit is reduced apart from its block's norms, and gloo orders a sum by
    its buffer's size), within the tolerances every bf16 layout keeps (tests/test_fp8.py;
    measured: losses within 1e-6, norms 8.7e-4 after Adam's steps)."""
    results = run_on_ranks(LAYOUTS, _both, timeout_s=300)
    for text, by_rank in zip(LAYOUTS, results, strict=True):
        for result in by_rank:
            assert result["copies"], text
            assert result["fp8"][0] == result["bf16"][0], text
            assert result["fp8"][0::2] == pytest.approx(result["bf16"][0::2], rel=3e-4), text
            assert result["fp8"][1::2] == pytest.approx(result["bf16"][1::2], rel=1e-2), text
            # the blocks' linear weights are most of what ZeRO-3 gathers; each gathered
            # byte of theirs is one where bf16 moved two (the rest still moves bf16)
            assert result["fp8_bytes"] < 0.8 * result["bf16_bytes"], text
            if result["kept"] is not None:  # the copies autograd keeps, as the planner counts
                assert _kept_as_planned(text) - result["kept"][1] <= result["kept"][0] \
                    <= _kept_as_planned(text), (text, result["kept"])
    # full recompute gathers a block's FP8 weights again for the backward's rerun; the block
    # method reruns only the first of the 4 blocks, and gathers the other 3 once
    full, block = (results[LAYOUTS.index(text)][0] for text in (FULL, BLOCK))
    assert block["bf16_bytes"] == full["bf16_bytes"]
    assert block["fp8_bytes"] < full["fp8_bytes"]


def _kept_as_planned(text: str) -> float:
    """The planner's count of the gathered FP8 weights one forward keeps on a rank
    (`plan.fp8.kept_fp8_weight_bytes`, the blocks full recompute does not rerun)."""
    layout = Layout.parse(text)
    cfg = GPT2 if layout.recompute == "full" else PRESETS["tiny-moe"] if layout.ep > 1 else TINY
    rerun = 0 if layout.recompute != "full" else layout.recompute_layers \
        if layout.recompute_method == "block" else cfg.n_layers
    blocks = cfg.n_layers - rerun
    moe = min(blocks, cfg.n_moe_layers)
    precision = dataclasses.replace(PRECISIONS["fp8"], fp8_weight_gather=True)
    return kept_fp8_weight_bytes(cfg, precision, layout.tp, blocks - moe, moe)


def test_refused_in_one_line_where_it_cannot_run():
    assert fp8_gather_problem("fp8", 3) is None
    for precision, zero, words in (("bf16", 3, "no FP8 GEMMs"), ("fp8-rowwise", 3, "rowwise"),
                                   ("fp8", 2, "zero=2")):
        problem = fp8_gather_problem(precision, zero)
        assert problem is not None and words in problem and "\n" not in problem
    layout = Layout()
    with pytest.raises(ParaxisError, match="zero=0"):
        from paraxis.dist.groups import build_groups
        build_engine(TINY, layout, build_groups(layout), "cpu", seed=0,
                     options=RuntimeOptions(precision="fp8", fp8_weight_gather=True))


def test_the_cli_refuses_before_launching(tmp_path, capsys, monkeypatch):
    from paraxis.cli import main

    monkeypatch.chdir(tmp_path)
    code = main(["train", "--model", "tiny-llama", "--precision", "bf16", "--zero", "3",
                 "--dp", "2", "--nproc", "2", "--fp8-weight-gather", "--steps", "1",
                 "--quiet", "--device", "cpu"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--fp8-weight-gather" in err[0], err
    assert list(tmp_path.iterdir()) == []  # nothing written


def _resume(ctx: RankContext, root: str) -> dict[str, bool]:
    """A checkpoint of an FP8-gathering run holds single-device names and bf16 values: it
    loads into the same layout, gathering or not, and the resumed step is the same bits."""
    from paraxis.model.checkpoint import load_checkpoint, save_checkpoint

    def engine(gather: bool):
        return build_engine(TINY, ctx.layout, ctx.groups, "cpu", seed=0,
                            options=RuntimeOptions(precision="fp8", fp8_weight_gather=gather))

    def step(e, seed: int) -> float:
        rank, per = ctx.groups.dp_rank, ROWS // ctx.layout.dp
        tokens = torch.randint(0, TINY.vocab_size, (ROWS, SEQ + 1),
                               generator=torch.Generator().manual_seed(seed))
        x, y = tokens[rank * per:(rank + 1) * per, :-1], tokens[rank * per:(rank + 1) * per, 1:]
        loss = e.forward_backward(x, y)
        e.clip_grad_norm(1.0)
        e.optimizer_step(1e-2)
        e.zero_grad()
        return loss

    saved = engine(True)
    step(saved, 0)
    path = save_checkpoint(saved, root, 1, TINY.to_dict())
    theirs = saved.full_parameters()
    out = {}
    for gather in (True, False):
        loaded = engine(gather)
        load_checkpoint(loaded, path, TINY.to_dict())
        ours = loaded.full_parameters()
        out[f"loaded {gather}"] = set(ours) == set(theirs) and all(
            torch.equal(ours[n], theirs[n]) and ours[n].dtype == torch.bfloat16 for n in ours)
        if gather:
            out["resumed"] = step(loaded, 1) == step(saved, 1)
    return out


def test_a_checkpoint_resumes_the_same_bits_gathering_or_not(tmp_path):
    for result in run_on_ranks("dp=4,zero=3", _resume, str(tmp_path), timeout_s=300):
        assert all(result.values()), result


def test_the_stacked_weights_place_compiles_with_and_without_gradients():
    """The stacked FP8 GEMM's weight stand-in (`kernels.linear._StackedShape`, folded over
    q, k, v) has the stacked shape under torch.compile, evaluation (no_grad) included, and
    sends each weight its rows of the gradient."""
    import functools

    from paraxis.kernels.linear import _StackedShape

    q, k, v = (torch.nn.Parameter(torch.randn(rows, 8)) for rows in (16, 4, 4))

    def stacked() -> torch.Tensor:
        return functools.reduce(_StackedShape.apply, [q, k, v])

    compiled = torch.compile(stacked, backend="eager")
    with torch.no_grad():
        assert compiled().shape == (24, 8)
    out = compiled()
    assert out.shape == (24, 8)
    (out * torch.arange(24.0).unsqueeze(1)).sum().backward()
    assert torch.equal(v.grad[:, 0], torch.arange(20.0, 24.0))
    assert q.grad.shape == (16, 8) and k.grad.shape == (4, 8)


def test_a_report_of_a_run_prices_how_it_gathered_and_computed_its_loss(tmp_path):
    """`paraxis report --run` reads --fp8-weight-gather and --fused-loss from the run's
    config, as it reads its precision and layout."""
    import argparse

    from paraxis.commands.report import from_run_config
    from paraxis.plan.inputs import PlanInputs

    args = argparse.Namespace(model=None, params=None, layout=None, global_batch=None,
                              seq_len=None, precision=None)
    for flag, zero in (("fp8_weight_gather", 3), ("fused_loss", 2)):
        config = tmp_path / f"{flag}.toml"
        config.write_text(f'[model]\nname = "tiny-llama"\n[train]\nprecision = "fp8"\n'
                          f'{flag} = true\n[layout]\ndp = 2\nzero = {zero}\n')
        priced = from_run_config(PlanInputs(), args, config)
        assert getattr(priced, flag) and priced.precision == "fp8", flag
        other = {"fp8_weight_gather": "fused_loss", "fused_loss": "fp8_weight_gather"}[flag]
        assert not getattr(priced, other), flag


def test_a_hook_that_changes_the_stacking_after_setup_is_named():
    """ZeRO-3's FP8 gather casts q, k and v as one GEMM where `stackable` said so at setup;
    a module hook added since makes them run apart, and q once read the stacked copy as its
    own (a shape error deep in the GEMM; k and v would cast their released weights)."""
    from torch.nn.modules.module import register_module_forward_hook

    from paraxis.engine.data_parallel.fp8_gather import fp8_gemms
    from paraxis.kernels.fp8 import Fp8Gemm
    from paraxis.kernels.linear import STACKING_CHANGED, Fp8Linear
    from paraxis.model.transformer import Attention

    attention = Attention(PRESETS["tiny-llama"])
    gemm = Fp8Gemm("tensorwise")
    for name in "qkvo":
        setattr(attention, name, Fp8Linear.from_linear(getattr(attention, name), gemm))
    stacked = fp8_gemms(attention)[0]
    assert len(stacked) == 3  # q, k and v in one GEMM
    weight = torch.cat([layer.weight.detach() for layer in stacked])
    stacked[0].weight.fp8_cast = quantize(weight, E4M3, False)  # as `attach` gives it
    x = torch.randn(2, 8, PRESETS["tiny-llama"].d_model)
    assert attention(x).shape == x.shape
    hook = register_module_forward_hook(lambda module, args, out: None)
    try:
        with pytest.raises(ParaxisError, match="register hooks before") as error:
            attention(x)
        assert str(error.value) == STACKING_CHANGED
    finally:
        hook.remove()
