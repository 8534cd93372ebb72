"""--model as users give it: a downloaded folder named like a preset, Hugging Face configs
with unusual values, model files wrapped in a table, and mixtures of experts whose fields
describe no experts. Each is read as one model by every command, or refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from paraxis.cli import main
from paraxis.files.model_file import load_model_config, model_directory
from paraxis.spec.errors import ParaxisError
from paraxis.spec.model_config import PRESETS

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 256,
         "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 96, "max_position_embeddings": 64,
         "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu",
         "tie_word_embeddings": False}


def _hf(folder: Path, **changes: object) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({**LLAMA, **changes}))
    return folder


def test_a_folder_named_like_a_preset_is_read_by_every_command(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _hf(tmp_path / "tiny-llama")
    (tmp_path / "tiny").mkdir()  # a folder of something else: the preset is meant
    assert model_directory("tiny-llama") == Path("tiny-llama")
    assert load_model_config("tiny-llama").d_ff == 96 != PRESETS["tiny-llama"].d_ff
    assert model_directory("tiny") is None and load_model_config("tiny") == PRESETS["tiny"]
    assert main(["plan", "--model", "tiny-llama", "--gpus", "1", "--top", "1"]) == 0
    params = load_model_config("tiny-llama").num_params()
    assert f"tiny-llama ({params / 1e9:.3g}B params" in capsys.readouterr().out


@pytest.mark.parametrize(("changes", "message"), [
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4},
      "rope_scaling": {"rope_type": "linear", "factor": 4.0}},
     r"rope scaling 'linear' \(rope_scaling\)"),
    ({"architectures": [{"name": "LlamaForCausalLM"}]}, "architectures = .* must be a list"),
    ({"architectures": "LlamaForCausalLM"}, "architectures = .* must be a list"),
    ({"rope_theta": 10**400}, "rope_theta = .* must be a finite number"),
    ({"num_key_value_heads": 0}, "n_kv_heads=0 must be a positive integer"),
    ({"tie_word_embeddings": "false"}, "tie_word_embeddings = .* must be true or false"),
    ({"hidden_size": 10**12, "intermediate_size": 10**12}, "d_model=1e\\+12 is over"),
])
def test_configs_that_would_read_as_another_model_are_one_line(tmp_path, changes, message):
    with pytest.raises(ParaxisError, match=message) as error:
        load_model_config(str(_hf(tmp_path / "m", **changes)))
    assert "\n" not in str(error.value)


def test_a_gpt2_inner_width_of_0_is_not_the_default(tmp_path):
    folder = tmp_path / "g"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["GPT2LMHeadModel"], "vocab_size": 256, "n_embd": 64, "n_layer": 2,
        "n_head": 4, "n_positions": 64, "n_inner": 0}))
    with pytest.raises(ParaxisError, match="d_ff=0 must be a positive integer"):
        load_model_config(str(folder))


@pytest.mark.parametrize(("fields", "message"), [
    ({"first_dense_layers": 4}, r"first_dense_layers 4 must be within 0..n_layers-1"),
    ({"n_experts": 0, "top_k": 0, "d_ff_expert": 0, "first_dense_layers": 1},
     "first_dense_layers counts the blocks before the experts"),
    ({"n_experts": 0, "top_k": 0, "d_ff_expert": 0, "capacity_factor": -3.0},
     "capacity_factor, aux_loss_coef and z_loss_coef must be finite and >= 0"),
])
def test_expert_fields_that_describe_no_experts_are_refused(fields, message):
    with pytest.raises(ParaxisError, match=message):
        PRESETS["tiny-moe"].replace(**fields)


def test_an_unused_dense_width_does_not_bind_tp():
    from paraxis.spec.layout import Layout
    from paraxis.spec.model_splits import check_model

    every_block_routed = PRESETS["tiny-moe"].replace(d_ff=3)
    check_model(Layout(tp=2), every_block_routed)
    with pytest.raises(ParaxisError, match="MLP width 3 is not divisible by tp=2"):
        check_model(Layout(tp=2), every_block_routed.replace(first_dense_layers=1))


def test_model_files_that_would_be_half_read_say_so(tmp_path):
    beside = tmp_path / "beside.toml"
    fields = "\n".join(f"{k} = {json.dumps(v)}" for k, v in
                       PRESETS["tiny-llama"].to_dict().items())
    beside.write_text(f"n_layers = 48\n[model]\n{fields}\n")
    with pytest.raises(ParaxisError, match="has key.s. n_layers beside its .model. table"):
        load_model_config(str(beside))
    run = tmp_path / "config.toml"
    run.write_text('[model]\nname = "tiny-llama"\n\n[train]\nsteps = 3\n')
    with pytest.raises(ParaxisError, match="is a run file whose model is 'tiny-llama'; give "
                                           "--model tiny-llama"):
        load_model_config(str(run))
    folder = _hf(tmp_path / "hf")
    assert load_model_config(str(folder / "config.json")) == load_model_config(str(folder))
    with pytest.raises(ParaxisError, match="or a directory holding a model"):
        load_model_config("no-such-model")
