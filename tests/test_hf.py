"""Hugging Face interop: import Llama / GPT-2 into paraxis (one device and tp=2 x pp=2) with
transformers' logits, export back exactly, and one-line errors on bad directories.

The checkpoints are tiny random models made by transformers itself (tests/conftest.py).
"""

import json
import shutil

import pytest
import torch
import torch.distributed as dist

from paraxis.dist.testing import RankContext, run_on_ranks
from paraxis.model.hf import read_hf, write_hf
from paraxis.model.inference import model_from_state
from paraxis.model.transformer import build_model, single_device_parameters
from paraxis.parallel.tensor import apply_tensor_parallel
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import PRESETS
from paraxis.spec.partition import partition_layers

pytest.importorskip("transformers")

IDX = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(3))


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a - b).abs().max())


def test_config_carries_what_the_model_needs(hf_llama, hf_gpt2):
    llama, _ = read_hf(hf_llama)
    assert (llama.style, llama.n_heads, llama.n_kv_heads, llama.d_ff) == ("llama", 4, 2, 96)
    assert (llama.rope_theta, llama.norm_eps, llama.max_seq_len) == (50000.0, 1e-5, 64)
    gpt2, state = read_hf(hf_gpt2)
    assert (gpt2.style, gpt2.d_ff, gpt2.norm_eps) == ("gpt2", 256, 1e-5)
    assert "lm_head.weight" not in state  # tied: listed once, as the embedding


def test_import_matches_transformers_on_one_device(hf_dir, hf_logits):
    cfg, state = read_hf(hf_dir)
    model = model_from_state(cfg, state)
    with torch.no_grad():
        ours = model(IDX)
    assert max_diff(ours, hf_logits(hf_dir, IDX)) <= 1e-5


def stage_logits(ctx: RankContext, hf_dir: str, idx: torch.Tensor) -> torch.Tensor | None:
    """tp=2 x pp=2: each rank builds its stage, copies the imported weights in by name,
    splits them for TP, and runs its half; the last stage gathers the vocab-parallel logits."""
    cfg, state = read_hf(hf_dir)
    groups = ctx.groups
    split = partition_layers(cfg, 2)
    stage = build_model(cfg, seed=9, blocks=split.blocks_of(groups.pp_rank),
                        embed=split.has_embedding(groups.pp_rank),
                        head=split.has_head(groups.pp_rank))
    with torch.no_grad():
        # GPT-2's last stage holds its own copy of the tied embedding: named tok_emb.weight
        for name, param in single_device_parameters(stage):
            param.copy_(state[name])
    apply_tensor_parallel(stage, groups)
    stage.eval()
    with torch.no_grad():
        if groups.is_first_stage:
            dist.send(stage(idx).contiguous(), groups.next_stage_rank)
            return None
        hidden = torch.empty(*idx.shape, cfg.d_model)
        dist.recv(hidden, groups.prev_stage_rank)
        shard = stage(hidden)
        assert shard.shape[-1] == cfg.vocab_size // 2  # vocab-parallel: half the logits each
        pieces = [torch.empty_like(shard) for _ in range(2)]
        dist.all_gather(pieces, shard, group=groups.tp_group)
        return torch.cat(pieces, dim=-1)


def test_import_at_tp2_pp2_matches_transformers(hf_dir, hf_logits):
    expected = hf_logits(hf_dir, IDX)
    results = run_on_ranks(Layout(tp=2, pp=2), stage_logits, hf_dir, IDX)
    assert results[0] is None and results[1] is None  # ranks 0, 1: the first stage
    for logits in results[2:]:  # ranks 2, 3: the last stage, both TP ranks
        assert max_diff(logits, expected) <= 1e-5


def test_export_round_trips_exactly_and_transformers_loads_it(hf_dir, hf_logits, tmp_path):
    cfg, state = read_hf(hf_dir)
    out = write_hf(tmp_path / "exported", cfg, state)
    cfg_again, state_again = read_hf(out)
    assert cfg_again == cfg.replace(name="exported")
    assert state_again.keys() == state.keys()
    for name, tensor in state.items():
        assert torch.equal(state_again[name], tensor), name
    assert max_diff(hf_logits(str(out), IDX), hf_logits(hf_dir, IDX)) <= 1e-5


@pytest.mark.parametrize("preset", ["tiny", "tiny-llama"])
def test_a_paraxis_model_exports_to_the_same_logits(preset, hf_logits, tmp_path):
    cfg = PRESETS[preset]
    model = build_model(cfg, seed=4).eval()
    # state_dict() lists GPT-2's tied head twice; export accepts that form too
    out = write_hf(tmp_path / preset, cfg, model.state_dict())
    idx = torch.randint(0, cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert max_diff(hf_logits(str(out), idx), model(idx)) <= 1e-5


def test_sharded_checkpoint_reads_like_one_file(hf_llama, tmp_path):
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(hf_llama).save_pretrained(tmp_path,
                                                                   max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("model-*.safetensors"))) > 1
    _, sharded = read_hf(tmp_path)
    _, single = read_hf(hf_llama)
    assert sharded.keys() == single.keys()
    assert all(torch.equal(sharded[name], single[name]) for name in single)


def test_export_refuses_a_non_empty_directory_unless_told(hf_gpt2, tmp_path):
    cfg, state = read_hf(hf_gpt2)
    target = tmp_path / "out"
    target.mkdir()
    (target / "notes.txt").write_text("keep me")
    with pytest.raises(ParaxisError, match="exists and is not empty"):
        write_hf(target, cfg, state)
    assert (target / "notes.txt").read_text() == "keep me"
    write_hf(target, cfg, state, overwrite=True)
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "model.safetensors"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no staging directory left
    bad = dict(state)
    bad["blocks.0.attn.q.weight"] = bad["blocks.0.attn.q.weight"][:32]  # a TP shard
    with pytest.raises(ParaxisError, match="gather TP shards"):
        write_hf(tmp_path / "other", cfg, bad)


def _copy(src: str, dst) -> str:  # noqa: ANN001
    shutil.copytree(src, dst)
    return str(dst)


def _edit_config(path: str, **changes: object) -> None:
    config_path = f"{path}/config.json"
    with open(config_path) as f:
        doc = json.load(f)
    doc.update(changes)
    with open(config_path, "w") as f:
        json.dump(doc, f)


def _drop_tensor(path: str, name: str) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(f"{path}/model.safetensors")
    del tensors[name]
    save_file(tensors, f"{path}/model.safetensors", metadata={"format": "pt"})


@pytest.mark.parametrize("break_it,message", [
    (lambda d: shutil.rmtree(d), "is not a directory"),
    (lambda d: __import__("os").remove(f"{d}/config.json"), "config.json does not exist"),
    (lambda d: _edit_config(d, architectures=["MistralForCausalLM"]),
     "architecture 'MistralForCausalLM' is not supported"),
    (lambda d: _edit_config(d, rope_scaling={"rope_type": "linear", "factor": 2.0},
                            rope_parameters=None), "rope scaling 'linear'"),
    (lambda d: _edit_config(d, hidden_act="gelu"), "hidden_act 'gelu'"),
    (lambda d: _edit_config(d, attention_bias=True), "attention_bias=true is not supported"),
    (lambda d: _edit_config(d, vocab_size=512), "model.safetensors: tensor "
     "'model.embed_tokens.weight' has shape (256, 64), but config.json implies (512, 64)"),
    (lambda d: _edit_config(d, num_hidden_layers=1), "model.safetensors: tensor "
     "'model.layers.1."),
    (lambda d: _drop_tensor(d, "model.layers.1.mlp.up_proj.weight"),
     "model.safetensors: tensor 'model.layers.1.mlp.up_proj.weight' is missing"),
    (lambda d: (__import__("os").rename(f"{d}/model.safetensors", f"{d}/pytorch_model.bin")),
     "pytorch_model.bin is a pickle, which can run code when loaded; convert it to "
     "safetensors"),
], ids=["no-dir", "no-config", "architecture", "rope-scaling", "activation", "bias",
        "shape", "extra-tensor", "missing-tensor", "pickle"])
def test_bad_llama_directories_are_one_line_errors(hf_llama, tmp_path, break_it, message):
    path = _copy(hf_llama, tmp_path / "model")
    break_it(path)
    with pytest.raises(ParaxisError) as error:
        read_hf(path)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("changes,message", [
    ({"activation_function": "gelu"}, "activation_function 'gelu'"),
    ({"tie_word_embeddings": False}, "tie_word_embeddings=false"),
    ({"n_head": 3}, "d_model 64 is not divisible by n_heads 3"),
], ids=["exact-gelu", "untied", "heads"])
def test_gpt2_configs_paraxis_cannot_express_are_refused(hf_gpt2, tmp_path, changes, message):
    path = _copy(hf_gpt2, tmp_path / "model")
    _edit_config(path, **changes)
    with pytest.raises(ParaxisError) as error:
        read_hf(path)
    assert message in str(error.value) and "config.json" in str(error.value)
    assert "\n" not in str(error.value)
