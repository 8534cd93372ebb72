"""apply_tensor_parallel on pipeline-stage modules, and its one-line errors on bad shapes.

A stage has the model's attribute names but only some parts: blocks (a ModuleList or a
ModuleDict keyed by global layer index), tok_emb/pos_emb on the first stage, norm_f/lm_head/
loss_fn on the last. Two TP'd stages chained must give the single-device loss and gradients.
"""

import copy

import pytest
import torch
import torch.distributed as dist
from torch import nn

from paraxis.dist.testing import RankContext, flag_args, run_on_ranks, train_records
from paraxis.model.transformer import build_model
from paraxis.parallel.tensor import apply_tensor_parallel, full_state
from paraxis.parallel.tensor.partial import sum_partial_grads
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import PRESETS, ModelConfig


class FirstStage(nn.Module):
    def __init__(self, model: nn.Module, layers: list[int]) -> None:
        super().__init__()
        self.cfg = model.cfg
        self.tok_emb = model.tok_emb
        if hasattr(model, "pos_emb"):
            self.pos_emb = model.pos_emb
        self.blocks = nn.ModuleList(model.blocks[i] for i in layers)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok_emb(idx)
        if hasattr(self, "pos_emb"):
            x = x + self.pos_emb(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return x


class LastStage(nn.Module):
    def __init__(self, model: nn.Module, layers: list[int]) -> None:
        super().__init__()
        self.blocks = nn.ModuleDict({str(i): model.blocks[i] for i in layers})
        self.norm_f = model.norm_f
        self.lm_head = copy.deepcopy(model.lm_head)  # GPT-2: the last stage's copy of the tie
        self.lm_head.weight.pp_duplicate = True
        self.loss_fn = model.loss_fn

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        for block in self.blocks.values():
            x = block(x)
        return self.loss_fn(self.lm_head(self.norm_f(x)), targets)


def two_stages(ctx: RankContext, model_name: str, sequence_parallel: bool) -> None:
    cfg = PRESETS[model_name]
    group = dist.group.WORLD
    idx = torch.randint(0, cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(1))
    reference = build_model(cfg, seed=2)
    reference_loss = reference(idx, idx)
    reference_loss.backward()

    whole = build_model(cfg, seed=2)
    first, last = FirstStage(whole, [0, 1]), LastStage(whole, [2, 3])
    apply_tensor_parallel(first, group, sequence_parallel)
    apply_tensor_parallel(last, group, sequence_parallel)
    assert isinstance(last.blocks, nn.ModuleDict) and "tok_emb" not in dict(last.named_children())
    assert last.lm_head.weight.pp_duplicate and last.lm_head.weight.tp_sharded  # roles kept
    hidden = first(idx)
    expected_seq = 16 // dist.get_world_size() if sequence_parallel else 16
    assert hidden.shape == (2, expected_seq, cfg.d_model)  # SP: stages pass sequence shards
    boundary = hidden.detach().requires_grad_()  # what a pipeline send/recv would cut
    loss = last(boundary, idx)
    loss.backward()
    hidden.backward(boundary.grad)
    for stage in (first, last):  # SP's partial gradients, summed as the engine does a step
        sum_partial_grads([(p, p.grad) for p in stage.parameters()], group)
    torch.testing.assert_close(loss, reference_loss, rtol=1e-5, atol=0)
    grads = {}
    for name, grad in full_state(first, group, grads=True).items():
        if name.startswith("blocks."):  # the first stage's ModuleList counts from 0
            _, index, rest = name.split(".", 2)
            name = f"blocks.{[0, 1][int(index)]}.{rest}"
        grads[name] = grad
    for name, grad in full_state(last, group, grads=True).items():
        # GPT-2's tied weight: the pipeline sums the two stages' gradients of its copies.
        grads[name] = grads.pop("tok_emb.weight") + grad if (
            name == "lm_head.weight" and cfg.tied_embeddings) else grad
    if cfg.tied_embeddings:
        grads["tok_emb.weight"] = grads.pop("lm_head.weight")
    expected = dict(reference.named_parameters())
    assert grads.keys() == expected.keys()
    for name, param in expected.items():
        torch.testing.assert_close(grads[name], param.grad, rtol=1e-5,
                                   atol=1e-5 * float(param.grad.abs().max()) + 1e-9,
                                   msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("model_name", ["tiny", "tiny-llama"])
@pytest.mark.parametrize("sequence_parallel", [False, True], ids=["plain", "sp"])
def test_pipeline_stages_split_like_the_whole_model(model_name, sequence_parallel):
    run_on_ranks("tp=2", two_stages, model_name, sequence_parallel)


@pytest.mark.parametrize("cfg,tp,message", [
    (ModelConfig("h3", "gpt2", 256, 1, 48, 3, 3, 96, 32), 2, "3 attention heads are not "
     "divisible by tp=2"),
    (PRESETS["tiny-llama"], 4, "2 kv heads are not divisible by tp=4"),
    (ModelConfig("v255", "gpt2", 255, 1, 64, 4, 4, 256, 32), 2, "vocab size 255 is not "
     "divisible by tp=2; pad the vocabulary"),
])
def test_shapes_tp_cannot_split_are_one_line_errors(cfg, tp, message):
    with pytest.raises(ParaxisError, match=message) as error:
        Layout(tp=tp).validate(model=cfg)
    assert "\n" not in str(error.value)


def apply_to(ctx: RankContext, cfg: ModelConfig) -> str:
    try:
        apply_tensor_parallel(build_model(cfg), dist.group.WORLD)
    except ParaxisError as error:
        return str(error)
    return "no error"


def test_apply_refuses_an_odd_vocabulary_on_every_rank():
    cfg = ModelConfig("v255", "gpt2", 255, 1, 64, 4, 4, 256, 32)
    messages = run_on_ranks("tp=2", apply_to, cfg)
    assert all("vocab size 255 is not divisible by tp=2" in m for m in messages), messages


def test_cli_trains_with_tp_and_sequence_parallel_like_one_device(tmp_path):
    # `paraxis train --nproc 2` as a user runs it, against one device trained here
    from paraxis.train.config import RunConfig
    from paraxis.train.loop import run_training

    flags = dict(model="tiny-llama", steps=3, global_batch=4, seq_len=32, device="cpu")
    runs = {"one": run_training(RunConfig.from_flags(**flags, quiet=True)),
            "tp": train_records([*flag_args(flags), "--quiet", "--tp", "2",
                                 "--sequence-parallel"],
                                tmp_path / "tp.jsonl", nproc=2, timeout_s=120)}
    assert len(runs["one"]) == len(runs["tp"]) == 3
    for one, tp in zip(runs["one"], runs["tp"], strict=True):
        assert tp["loss"] == pytest.approx(one["loss"], rel=1e-5)
        assert tp["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)

