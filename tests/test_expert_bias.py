"""Aux-loss-free load balancing (DeepSeek-V3): a per-expert routing bias.

`expert_bias` gives every MoE block a bias per expert, added to the router's
probabilities to choose each token's experts and never to weigh their outputs; after each
applied step it moves by `expert_bias_rate` against the expert's load over that step's
global batch (down where the load is above the mean, up where below). Checked here:

- routing: the bias picks the experts, the weights stay the unbiased probabilities,
  renormalised; the update is the sign rule on the step's counts;
- on ranks, tiny-moe with the bias trains like one device for 6 steps under dp4 x ep4
  (ZeRO-3), dp2 x tp2 (SP) x ep2 (ZeRO-1) and pp4 (one launch of 4 ranks): losses within
  1e-5 step by step and the same biases, read back from each run's checkpoint;
- the bias is training state: a checkpoint saves it, and one device resuming a dp4 x ep4
  checkpoint goes on exactly like one device's uninterrupted run;
- the rate may change when a run resumes (0 freezes the bias, as DeepSeek-V3 did last);
- a Mixtral export refuses a model with the bias (Mixtral has no such tensor), and bad
  rates are one-line errors.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from paraxis.dist.testing import RankContext, as_layout, run_on_ranks
from paraxis.files.checkpoint_manifest import CHECKSUM, checksum_of
from paraxis.model.checkpoint import read_full_state
from paraxis.model.checkpoint.convert import export_hf
from paraxis.model.transformer import MLP
from paraxis.parallel.experts.layer import MoE
from paraxis.spec.errors import ParaxisError
from paraxis.spec.model_config import PRESETS, ModelConfig
from paraxis.train.config import RunConfig
from paraxis.train.loop import run_training

RATE, STEPS, SAVE_AT = 0.01, 6, 3
LOSS_TOL = 1e-5
LAYOUTS = ["dp=4,ep=4,zero=3", "dp=2,tp=2,sp=true,ep=2,zero=1", "pp=4,microbatches=2"]
BIASES = [f"blocks.{i}.moe.expert_bias" for i in range(4)]


def _config(**changes: object) -> ModelConfig:
    return dataclasses.replace(PRESETS["tiny-moe"],
                               **{"expert_bias": True, "expert_bias_rate": RATE, **changes})


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("model") / "tiny-moe-bias.json"
    path.write_text(json.dumps(dataclasses.asdict(_config(name="tiny-moe-bias"))))
    return str(path)


def _run(model: str, layout: str, root: str, **options: object) -> list[float]:
    fields = dict(model=model, steps=STEPS, global_batch=8, seq_len=64, warmup=2,
                  device="cpu", quiet=True, layout=as_layout(layout), checkpoint_dir=root,
                  checkpoint_every=SAVE_AT)
    return [r["loss"] for r in run_training(RunConfig.from_flags(**{**fields, **options}))]


def _biases(root: str, step: int = STEPS) -> dict[str, torch.Tensor]:
    state = read_full_state(Path(root) / f"step-{step:08d}")[1]
    return {name: state[name] for name in BIASES}


# ------------------------------------------------------------------ one device, no ranks


def _layer(bias: list[float]) -> MoE:
    cfg = _config()
    torch.manual_seed(0)
    layer = MoE(cfg, lambda width: MLP(cfg, width))
    layer.expert_bias.copy_(torch.tensor(bias))
    return layer


def test_the_bias_picks_the_experts_and_leaves_their_weights_alone() -> None:
    tokens = torch.randn(32, 64)
    plain = _layer([0.0] * 8)
    weights, chosen, probs = plain.route(tokens)
    favoured = _layer([0.0, 0.0, 0.0, 0.0, 0.0, 2.0, 0.0, 0.0])  # larger than any probability
    biased_weights, biased_chosen, biased_probs = favoured.route(tokens)
    assert torch.equal(probs, biased_probs)  # the router's probabilities do not change
    assert (biased_chosen == 5).any(dim=-1).all()  # every token now goes to expert 5
    # its weights: the unbiased probabilities of the chosen experts, renormalised
    picked = probs.gather(-1, biased_chosen)
    assert torch.allclose(biased_weights, picked / picked.sum(-1, keepdim=True))
    assert not torch.equal(chosen, biased_chosen) and torch.allclose(
        weights.sum(-1), torch.ones(32))


def test_the_update_moves_each_bias_by_the_rate_against_its_load() -> None:
    layer = _layer([0.0] * 8)
    counts = torch.tensor([9, 1, 4, 4, 4, 4, 4, 2])  # mean 4
    layer.update_expert_bias(counts)
    want = RATE * torch.tensor([-1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0])
    assert torch.equal(layer.expert_bias, want)
    assert layer.expert_bias.dtype == torch.float32


def test_without_expert_bias_there_is_no_bias() -> None:
    cfg = PRESETS["tiny-moe"]
    layer = MoE(cfg, lambda width: MLP(cfg, width))
    assert layer.expert_bias is None and "expert_bias" not in layer.state_dict()


@pytest.mark.parametrize("rate", [-0.1, float("nan"), float("inf")])
def test_bad_rates_are_one_line_errors(rate: float) -> None:
    with pytest.raises(ParaxisError, match="expert_bias_rate must be >= 0 and finite") as error:
        _config(expert_bias_rate=rate)
    assert "\n" not in str(error.value)


def test_a_dense_model_refuses_a_bias_rate() -> None:
    with pytest.raises(ParaxisError, match="need a mixture of experts"):
        dataclasses.replace(PRESETS["tiny-llama"], expert_bias=True)


# --------------------------------------------------------------------------- on ranks


@pytest.fixture(scope="module")
def one_device(model_file: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One device's losses and biases, with one and with two microbatches (pp4's)."""
    runs = {}
    for microbatches in (1, 2):
        root = str(tmp_path_factory.mktemp(f"one-{microbatches}"))
        layout = "dp=1" if microbatches == 1 else "dp=1,microbatches=2"
        runs[microbatches] = (_run(model_file, layout, root), _biases(root), root)
    return runs


def _on_ranks(ctx: RankContext, model: str, root: str) -> list[float]:
    return _run(model, str(ctx.layout), f"{root}/{ctx.layout}")


@pytest.fixture(scope="module")
def layouts(model_file: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[list, Path]:
    """Every layout's losses (by rank), trained in one launch of 4 ranks."""
    root = tmp_path_factory.mktemp("layouts")
    return run_on_ranks(LAYOUTS, _on_ranks, model_file, str(root), timeout_s=400), root


def test_layouts_train_like_one_device_with_the_same_biases(one_device, layouts):
    results, root = layouts
    for layout, by_rank in zip(LAYOUTS, results, strict=True):
        losses = by_rank[0]
        want_losses, want_biases, _ = one_device[as_layout(layout).microbatches]
        worst = max(abs(a - b) for a, b in zip(losses, want_losses, strict=True))
        assert worst <= LOSS_TOL, f"{layout}: losses differ by {worst:.2e}"
        biases = _biases(str(root / str(as_layout(layout))))
        for name in BIASES:
            assert torch.equal(biases[name], want_biases[name]), f"{layout}: {name}"
    # the bias moved: every step moves every unevenly loaded expert's by the rate
    moved = torch.stack(list(one_device[1][1].values()))
    assert moved.abs().max() > 0 and torch.allclose(moved / RATE, (moved / RATE).round())


def test_one_device_resumes_a_sharded_checkpoint_exactly(model_file, one_device, layouts,
                                                         tmp_path):
    """The dp4 x ep4 ZeRO-3 run's step-3 checkpoint, resumed on one device, goes on like
    one device's uninterrupted run: same losses, same biases (the bias is in the
    checkpoint; without it the resumed run would route with zeros)."""
    saved = layouts[1] / str(as_layout(LAYOUTS[0])) / f"step-{SAVE_AT:08d}"
    assert _biases(str(saved.parent), SAVE_AT)[BIASES[0]].abs().max() > 0
    want_losses, want_biases, _ = one_device[1]
    resumed = _run(model_file, "dp=1", str(tmp_path / "resumed"), resume=str(saved))
    worst = max(abs(a - b) for a, b in zip(resumed, want_losses[SAVE_AT:], strict=True))
    assert worst <= LOSS_TOL
    biases = _biases(str(tmp_path / "resumed"))
    assert all(torch.equal(biases[name], want_biases[name]) for name in BIASES)


def test_mixtral_export_refuses_the_bias(one_device, tmp_path) -> None:
    root = one_device[1][2]
    with pytest.raises(ParaxisError, match="Mixtral's format has no routing bias") as error:
        export_hf(f"{root}/step-{STEPS:08d}", str(tmp_path / "hf"))
    assert "\n" not in str(error.value)
    assert not (tmp_path / "hf").exists()


def test_checkpoint_info_counts_parameters_not_the_bias(one_device, capsys) -> None:
    from paraxis.cli import main

    assert main(["checkpoint", "info", f"{one_device[1][2]}/step-{STEPS:08d}", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["parameters"] == _config().num_params()


def test_a_checkpoint_older_than_the_routing_fields_still_resumes(tmp_path) -> None:
    """A manifest written before `expert_bias`, `router_score` and the route groups
    existed holds the model their defaults describe: resuming and --init-from accept it."""
    root = tmp_path / "old"
    run_training(RunConfig.from_flags(model="tiny-moe", steps=2, global_batch=4, seq_len=32,
                                      device="cpu", quiet=True, checkpoint_dir=str(root),
                                      checkpoint_every=2))
    manifest = root / "step-00000002" / "manifest.json"
    doc = json.loads(manifest.read_text())
    for field in ("expert_bias", "expert_bias_rate", "router_score", "route_groups",
                  "route_group_limit"):
        del doc["model"][field]
    doc[CHECKSUM] = checksum_of(doc)  # as an older version wrote it
    manifest.write_text(json.dumps(doc))
    for how in (dict(resume=str(root / "step-00000002")),
                dict(init_from=str(root / "step-00000002"))):
        records = run_training(RunConfig.from_flags(
            model="tiny-moe", steps=3, global_batch=4, seq_len=32, device="cpu", quiet=True,
            **how))
        assert records and all(r["loss"] > 0 for r in records), how


def test_the_rate_may_change_when_a_run_resumes(model_file, one_device, tmp_path) -> None:
    """DeepSeek-V3 moved its biases at 0.001 and then froze them (0) for its last 500B
    tokens: one device's step-3 checkpoint resumed with the rate 0 keeps its biases."""
    frozen = tmp_path / "frozen.json"
    frozen.write_text(json.dumps(dataclasses.asdict(_config(name="tiny-moe-bias",
                                                            expert_bias_rate=0.0))))
    root = one_device[1][2]
    _run(str(frozen), "dp=1", str(tmp_path / "resumed"), resume=f"{root}/step-{SAVE_AT:08d}")
    kept, at_save = _biases(str(tmp_path / "resumed")), _biases(root, SAVE_AT)
    assert all(torch.equal(kept[name], at_save[name]) for name in BIASES)
    assert any(at_save[name].abs().max() > 0 for name in BIASES)


@pytest.mark.parametrize("value", [1, "yes", None])
def test_expert_bias_in_a_model_file_must_be_true_or_false(value: object) -> None:
    doc = {**dataclasses.asdict(_config()), "expert_bias": value}
    with pytest.raises(ParaxisError, match="expert_bias = .* must be true or false") as error:
        ModelConfig.from_dict(doc, source="m.json")
    assert "\n" not in str(error.value)
