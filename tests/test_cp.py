"""Context parallelism in the runtime: every layout with cp > 1 trains like one device.

Checked on a tiny Llama-style model (tiny-llama's shapes, its context raised
to 512 so that `--seq-len 512` is allowed) for 10 steps in fp32: the losses of every layout
below are within 1e-5 of one device's, step by step (so are the gradient norms, relatively,
and the held-out loss at the end), and so are the final weights (read from the checkpoint
each run writes, see WEIGHT_TOL), for

- cp=4 with the ring, the all-gather and the all-to-all attention (tiny-llama's 2 kv heads
  repeated to 4), cp2 x tp2 with sequence parallelism, cp2 x dp2 with ZeRO-3, cp2 x pp2, and
  two-level cp=4 (an all-to-all over 2 ranks, the ring or the all-gather across 2; one
  launch of 4 ranks);
- dp2 x cp2 x pp2 (ZeRO-1) and cp2 x tp2 (SP) x pp2 with the all-to-all attention (one
  launch of 8 ranks);
- `paraxis train --nproc 4 --cp 4 --seq-len 512`, the command line end to end.

Checkpoints cross cp degrees: the cp2 x dp2 run's step-5 checkpoint resumed at cp=4 and on
one device goes on like the single-device run. Bad layouts are one-line errors.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from paraxis.dist.testing import LayoutLike, RankContext, as_layout, run_on_ranks
from paraxis.model.checkpoint import read_full_state
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import PRESETS
from paraxis.train.config import RunConfig
from paraxis.train.loop import run_training

SEQ, STEPS = 512, 10
LOSS_TOL = 1e-5  # the acceptance: fp32 losses within 1e-5 over 10 steps
NORM_TOL = 1e-5  # relative: the global gradient norm of every step
# The final weights: AdamW moves a weight by lr * m / (sqrt(v) + eps) with eps = 1e-8, so
# where a gradient is rounding noise (an embedding row of a token seen once or twice) a
# relative difference of 1e-6 in it, what blockwise attention's other summation order gives,
# becomes a difference of up to ~lr in that weight. Measured when this test was written: at
# most 1.1e-4 (tok_emb.weight, cp2 x dp2; dp=4 alone gives 1.2e-5 there), 1.6e-8 on average.
WEIGHT_TOL, WEIGHT_MEAN_TOL = 3e-4, 1e-7
# (recompute rides along: selective reruns the cp attention itself in backward)
FOUR = ["cp=4", "cp=4,cp_attention=all_gather,recompute=selective", "cp=2,tp=2,sp=true",
        "cp=2,dp=2,zero=3", "cp=2,pp=2,microbatches=2,recompute=full",
        "cp=4,cp_attention=all_to_all", "cp=4,cp_a2a=2",
        "cp=4,cp_a2a=2,cp_attention=all_gather,recompute=selective"]
EIGHT = ["dp=2,cp=2,pp=2,zero=1,microbatches=2",
         "cp=2,tp=2,sp=true,pp=2,microbatches=2,cp_attention=all_to_all"]
SAVES = "cp=2,dp=2,zero=3"  # its step-5 checkpoint is resumed at cp=4 and on one device


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """tiny-llama's shapes with a context of SEQ tokens (the preset stops at 128)."""
    fields = dataclasses.asdict(PRESETS["tiny-llama"])
    fields.update(name="tiny-llama-512", max_seq_len=SEQ)
    path = tmp_path_factory.mktemp("model") / "tiny-llama-512.json"
    path.write_text(json.dumps(fields))
    return str(path)


def _cfg(model: str, layout: LayoutLike, **options: object) -> RunConfig:
    fields = dict(model=model, steps=STEPS, global_batch=4, seq_len=SEQ, warmup=2,
                  eval_every=STEPS, eval_batches=1, device="cpu", quiet=True,
                  layout=as_layout(layout))
    return RunConfig.from_flags(**{**fields, **options})


def _losses(records: list[dict]) -> list[tuple[float, float, float | None]]:
    """(loss, gradient norm, held-out loss or None) of every step."""
    return [(r["loss"], r["grad_norm"], r.get("val_loss")) for r in records]


def _weights(root: Path, step: int = STEPS) -> dict[str, torch.Tensor]:
    return read_full_state(root / f"step-{step:08d}")[1]


@pytest.fixture(scope="module")
def one_device(model: str, tmp_path_factory: pytest.TempPathFactory
               ) -> tuple[list[tuple], dict[str, torch.Tensor]]:
    """One device's losses and final weights: what every layout must reproduce."""
    root = tmp_path_factory.mktemp("one")
    records = run_training(_cfg(model, "dp=1", checkpoint_dir=str(root)))
    return _losses(records), _weights(root)


def _assert_matches(losses: list[tuple], weights: dict[str, torch.Tensor] | None,
                    expected: tuple[list, dict[str, torch.Tensor]], what: str) -> None:
    want_losses, want_weights = expected
    assert len(losses) == len(want_losses), what
    worst = max(abs(a[0] - b[0]) for a, b in zip(losses, want_losses, strict=True))
    assert worst <= LOSS_TOL, f"{what}: losses differ by {worst:.2e}"
    norms = max(abs(a[1] / b[1] - 1) for a, b in zip(losses, want_losses, strict=True))
    assert norms <= NORM_TOL, f"{what}: gradient norms differ by {norms:.2e} (relative)"
    assert losses[-1][2] is not None and want_losses[-1][2] is not None, what
    assert abs(losses[-1][2] - want_losses[-1][2]) <= LOSS_TOL, f"{what}: held-out loss"
    if weights is None:
        return
    assert sorted(weights) == sorted(want_weights), what
    diffs = torch.cat([(value - want_weights[name]).abs().flatten()
                       for name, value in weights.items()])
    assert float(diffs.max()) <= WEIGHT_TOL and float(diffs.mean()) <= WEIGHT_MEAN_TOL, (
        f"{what}: weights differ by {float(diffs.max()):.2e} at most, "
        f"{float(diffs.mean()):.2e} on average")


def _train(ctx: RankContext, model: str, root: str) -> tuple[list, list | None]:
    """This layout's 10 steps (checkpoints at 5 and 10); the SAVES layout also resumes its
    step-5 checkpoint at cp=4."""
    name = str(ctx.layout)
    losses = _losses(run_training(_cfg(model, ctx.layout, checkpoint_dir=f"{root}/{name}",
                                       checkpoint_every=5)))
    resumed = None
    if ctx.layout == as_layout(SAVES):
        resumed = _losses(run_training(_cfg(model, "cp=4", resume=f"{root}/{name}/step-00000005",
                                            checkpoint_dir=f"{root}/resumed-cp4")))
    return losses, resumed


@pytest.mark.parametrize("layouts", [FOUR, EIGHT], ids=["4-ranks", "8-ranks"])
def test_context_parallel_layouts_train_like_one_device(layouts, model, one_device, tmp_path):
    results = run_on_ranks(layouts, _train, model, str(tmp_path), timeout_s=400)
    for layout, by_rank in zip(layouts, results, strict=True):
        name = str(as_layout(layout))
        losses, resumed = by_rank[0]
        assert all(r[0] == losses for r in by_rank), f"{name}: ranks disagree on the loss"
        _assert_matches(losses, _weights(tmp_path / name), one_device, name)
        if resumed is not None:  # the cp=2 checkpoint at cp=4, then on one device
            want = (one_device[0][5:], one_device[1])
            _assert_matches(resumed, _weights(tmp_path / "resumed-cp4"), want,
                            "cp=2 checkpoint resumed at cp=4")
            single = run_training(_cfg(model, "dp=1", resume=str(
                tmp_path / name / "step-00000005"), checkpoint_dir=str(tmp_path / "resumed-1")))
            _assert_matches(_losses(single), _weights(tmp_path / "resumed-1"), want,
                            "cp=2 checkpoint resumed on one device")


def test_cli_cp4_matches_one_device(model, tmp_path):
    # the flags reach the runtime: 3 steps (the layouts above hold cp=4 to one device over
    # STEPS), against one device trained here with the same flags
    metrics, steps = tmp_path / "cp4.jsonl", 3
    command = [sys.executable, "-m", "paraxis", "train", "--nproc", "4", "--cp", "4",
               "--model", model, "--seq-len", str(SEQ), "--steps", str(steps),
               "--global-batch", "4", "--warmup", "2", "--eval-every", str(steps),
               "--eval-batches", "1", "--device", "cpu", "--quiet",
               "--metrics-file", str(metrics)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    single = run_training(_cfg(model, "dp=1", steps=steps, eval_every=steps))
    _assert_matches(_losses(records), None, (_losses(single), {}),
                    "paraxis train --nproc 4 --cp 4")


def _gpt2(ctx: RankContext) -> list[float]:
    return [r["loss"] for r in run_training(_cfg("tiny", ctx.layout, steps=3, seq_len=128))]


def test_learned_positions_and_tied_embeddings_follow_the_chunks():
    """GPT-2's learned positions (sharded over tp with SP) are read at the tokens' global
    positions, and its tied embedding spans pipeline stages under cp."""
    layouts = ["cp=2,tp=2,sp=true", "cp=2,pp=2,microbatches=2"]
    results = run_on_ranks(layouts, _gpt2, timeout_s=300)
    expected = [r["loss"] for r in run_training(_cfg("tiny", "dp=1", steps=3, seq_len=128))]
    for layout, by_rank in zip(layouts, results, strict=True):
        assert by_rank[0] == pytest.approx(expected, abs=LOSS_TOL), layout


# ------------------------------------------------------------------------ bad input


@pytest.mark.parametrize("fields,against,message", [
    (dict(cp=4), dict(seq_len=100), "seq_len 100 is not divisible by 8"),
    (dict(cp=2, tp=4, sequence_parallel=True), dict(seq_len=36),
     "divisible by cp.tp = 8"),
    (dict(cp=2, cp_attention="tree"), {}, "unknown cp_attention 'tree'"),
    (dict(cp=2, tp=2), dict(world_size=8), "dp*cp*tp*pp = 1*2*2*1 = 4"),
    (dict(cp=8, cp_attention="all_to_all"), dict(model=PRESETS["tiny-llama"]),
     "splits the attention heads over the cp ranks: 4 heads"),
    (dict(cp=3, cp_attention="all_to_all"), dict(model=PRESETS["small-llama"]),
     "8 heads .per TP rank. do not divide by cp=3"),
    # two-level cp
    (dict(cp=4, cp_a2a=3), {},
     "cp_a2a=3 must divide cp=4 and be smaller .cp_a2a=cp is cp_attention=all_to_all.; "
     "choose cp_a2a among 2"),
    (dict(cp=4, cp_a2a=4), {}, "cp_a2a=cp is cp_attention=all_to_all"),
    (dict(cp_a2a=2), {}, "cp=1 has none.: raise cp, or leave cp_a2a out"),
    (dict(cp=2, cp_a2a=3), {}, "cp_a2a=3 needs a cp of 4 or more"),
    (dict(cp=4, cp_a2a=2, cp_attention="all_to_all"), {}, "drop cp_a2a"),
    (dict(cp=8, cp_a2a=4, tp=2), dict(model=PRESETS["tiny-llama"]),
     "cp_a2a=4 splits the attention heads inside each group: 2 heads and 1 kv heads .per TP"),
])
def test_bad_context_parallel_layouts_are_one_line_errors(fields, against, message):
    with pytest.raises(ParaxisError, match=message.replace("*", r"\*")) as error:
        Layout(**fields).validate(**against)
    assert "\n" not in str(error.value)


def test_layout_text_round_trips_cp():
    layout = Layout.parse("dp=2,cp=2,tp=2,cp_attention=all_gather")
    assert (layout.cp, layout.cp_attention, layout.world_size) == (2, "all_gather", 8)
    assert str(layout) == "dp=2,tp=2,pp=1,cp=2,cp_attention=all_gather,zero=0"
    assert Layout.parse(str(layout)) == layout
    assert Layout.parse(str(Layout(cp=4))) == Layout(cp=4)
    two = Layout.parse("dp=2,cp=8,cp_a2a=2")
    assert str(two) == "dp=2,tp=1,pp=1,cp=8,cp_a2a=2,zero=0" and Layout.parse(str(two)) == two


def test_two_level_cp_groups_cut_each_cp_group_both_ways():
    layout = Layout(dp=2, cp=8, cp_a2a=2)  # cp is inside dp: ranks 0-7 and 8-15
    a2a, across = layout.groups("cp_a2a"), layout.groups("cp_across")
    assert a2a[:4] == [[0, 1], [2, 3], [4, 5], [6, 7]] and len(a2a) == 8
    assert across == [[0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 12, 14], [9, 11, 13, 15]]
    for group in across:  # a rank's index across is its all-to-all group's index
        assert [a2a.index(next(g for g in a2a if r in g)) % 4 for r in group] == [0, 1, 2, 3]


def test_cli_refuses_a_bad_sequence_split_in_one_line(model):
    result = subprocess.run(
        [sys.executable, "-m", "paraxis", "train", "--nproc", "4", "--cp", "4", "--model",
         model, "--seq-len", "100", "--steps", "1", "--device", "cpu"],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "not divisible by 8" in lines[0], result.stderr
