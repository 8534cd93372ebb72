"""Hugging Face files without a full copy in memory: `HFReader.region` reads a box of one
parameter (GPT-2's transposed, fused q/k/v included), and `write_hf` writes sharded files one
tensor at a time from a callable, holding about one tensor beyond what making it costs.

The checkpoints are tiny random models made by transformers itself (tests/conftest.py).
"""

import json
from math import prod
from pathlib import Path

import pytest
import torch

from paraxis.dist.tensor_memory import TensorBytes
from paraxis.model.hf import HFReader, expected_shapes, read_hf, write_hf
from paraxis.model.init_weights import initial_value
from paraxis.model.transformer import build_model
from paraxis.spec.errors import ParaxisError
from paraxis.spec.model_config import PRESETS

pytest.importorskip("transformers")

IDX = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(3))
REGIONS = [  # rows, columns, a box, one slice for the first dim only, negative, empty
    (slice(0, 8), slice(None)), (slice(None), slice(16, 40)), (slice(5, 37), slice(3, 11)),
    (slice(24, 48),), (slice(-8, None), slice(-20, -4)), (slice(6, 6), slice(None)),
]


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a - b).abs().max())


def test_regions_are_slices_of_the_full_tensors(hf_dir):
    reader = HFReader(hf_dir)
    cfg, state = read_hf(hf_dir)
    assert reader.cfg == cfg and reader.names == list(state)
    for name in reader.names:
        assert reader.shapes[name] == tuple(state[name].shape)
        assert torch.equal(reader.full(name), state[name]), name
        for index in REGIONS:
            index = index[:state[name].dim()]
            region = reader.region(name, index)
            assert region.is_contiguous() and torch.equal(region, state[name][index]), name


def test_gpt2_q_k_v_regions_are_ranges_of_the_fused_conv1d(hf_gpt2):
    """Checked against the file itself: q/k/v are column ranges of c_attn's (in, out) weight
    and ranges of its bias; our rows are its columns."""
    from safetensors.torch import load_file

    stored = load_file(f"{hf_gpt2}/model.safetensors")
    reader, d = HFReader(hf_gpt2), 64
    for i in range(2):
        weight = stored[f"transformer.h.{i}.attn.c_attn.weight"]
        bias = stored[f"transformer.h.{i}.attn.c_attn.bias"]
        for slot, part in enumerate("qkv"):
            name = f"blocks.{i}.attn.{part}"
            rows, cols = slice(8, 24), slice(40, 64)  # a TP shard's rows, a box's columns
            start = slot * d
            assert torch.equal(reader.region(f"{name}.weight", (rows, cols)),
                               weight[cols, start + 8:start + 24].t())
            assert torch.equal(reader.region(f"{name}.bias", (rows,)),
                               bias[start + 8:start + 24])


class Recorder:
    """A safetensors slice that notes each region asked of it."""

    def __init__(self, name: str, whole: object, asked: list) -> None:
        self.name, self.whole, self.asked = name, whole, asked

    def __getitem__(self, index: tuple[slice, ...]) -> torch.Tensor:
        self.asked.append((self.name, index))
        return self.whole[index]


def test_a_region_asks_safetensors_for_that_region_alone(hf_gpt2, monkeypatch):
    import paraxis.model.hf.read

    reader = HFReader(hf_gpt2)  # shapes come from the headers: no region asked yet
    asked: list = []
    get_slice = paraxis.model.hf.read._get_slice
    monkeypatch.setattr(paraxis.model.hf.read, "_get_slice", lambda handle, file, name: Recorder(
        name, get_slice(handle, file, name), asked))
    reader.region("blocks.1.attn.k.weight", (slice(8, 16),))
    reader.region("tok_emb.weight", (slice(0, 4), slice(2, 6)))
    assert asked == [("transformer.h.1.attn.c_attn.weight", (slice(0, 64), slice(72, 80))),
                     ("transformer.wte.weight", (slice(0, 4), slice(2, 6)))]


def test_sharded_write_loads_back_in_paraxis_and_transformers(hf_dir, hf_logits, tmp_path):
    cfg, state = read_hf(hf_dir)
    limit = 20_000  # bytes: a block's tensors span several shards
    outputs = {"mapping": write_hf(tmp_path / "mapping", cfg, state, max_shard_bytes=limit),
               "callable": write_hf(tmp_path / "callable", cfg, state.__getitem__,
                                    max_shard_bytes=limit)}
    for out in outputs.values():
        assert not (out / "model.safetensors").exists()
        index = json.loads((out / "model.safetensors.index.json").read_text())
        files = sorted(p.name for p in out.glob("model-*.safetensors"))
        assert len(files) > 3 and files[-1] == f"model-{len(files):05d}-of-{len(files):05d}" \
            ".safetensors"
        assert sorted(set(index["weight_map"].values())) == files
        sizes = _tensor_bytes(out, files)
        assert index["metadata"]["total_size"] == sum(sum(s.values()) for s in sizes.values())
        for file, tensors in sizes.items():  # full shards, and a lone tensor only when large
            assert sum(tensors.values()) <= limit or len(tensors) == 1, file
            assert all(index["weight_map"][name] == file for name in tensors)
        cfg_again, state_again = read_hf(out)
        assert cfg_again == cfg.replace(name=out.name)
        assert all(torch.equal(state_again[name], state[name]) for name in state)
        assert max_diff(hf_logits(str(out), IDX), hf_logits(hf_dir, IDX)) <= 1e-5


def _tensor_bytes(out: Path, files: list[str]) -> dict[str, dict[str, int]]:
    from safetensors import safe_open

    sizes = {}
    for file in files:
        with safe_open(out / file, framework="pt") as handle:
            sizes[file] = {name: handle.get_tensor(name).nbytes for name in handle.keys()}
    return sizes


@pytest.mark.parametrize("preset", ["tiny", "tiny-llama"])
def test_a_callable_write_holds_one_tensor_beyond_making_it(preset, tmp_path):
    """Tensors drawn one at a time with the model's own init: the write's peak of counted
    tensor bytes is about two of the largest tensor (the shard being written, capped at the
    largest tensor's bytes, and the tensor being made; init_parameter draws into the tensor
    itself), far below the whole model."""
    cfg = PRESETS[preset].replace(n_layers=6)
    shapes = expected_shapes(cfg)

    def make(name: str) -> torch.Tensor:
        return initial_value(name, shapes[name], cfg, seed=5)

    largest = max(shapes, key=lambda name: prod(shapes[name]))
    largest_bytes = prod(shapes[largest]) * 4
    with TensorBytes() as making:
        make(largest)
    with TensorBytes() as writing:
        out = write_hf(tmp_path / preset, cfg, make)
    model_bytes = sum(prod(shape) for shape in shapes.values()) * 4
    assert model_bytes > 15 * largest_bytes  # holding the model whole could not pass below
    assert making.peak >= largest_bytes
    assert writing.peak <= making.peak + largest_bytes + largest_bytes // 4, (
        writing.peak, making.peak)
    assert len(list(out.glob("model-*.safetensors"))) > 10
    _, state = read_hf(out)
    model = build_model(cfg, seed=5)
    assert all(torch.equal(state[name], param) for name, param in model.named_parameters())


def test_bad_regions_and_writes_are_one_line_errors(hf_gpt2, tmp_path):
    reader = HFReader(hf_gpt2)
    for name, index, message in [
        ("blocks.0.attn.qkv.weight", (), "has no parameter 'blocks.0.attn.qkv.weight'"),
        ("tok_emb.weight", (slice(0, 8, 2),), "give a slice of step 1"),
        ("tok_emb.weight", (3,), "dim 0 is 3"),
        ("tok_emb.weight", (slice(None),) * 3, "at most 2 slices"),
    ]:
        with pytest.raises(ParaxisError, match=message) as error:
            reader.region(name, index)
        assert "\n" not in str(error.value)
    cfg, state = read_hf(hf_gpt2)
    for bad, kwargs, message in [
        (lambda name: state[name][:4], {}, "gather TP shards"),
        (lambda name: state[name].tolist(), {}, "gave a list"),
        (42, {}, "state is a int"),
        (state, {"max_shard_bytes": 0}, "give a positive size"),
    ]:
        with pytest.raises(ParaxisError, match=message):
            write_hf(tmp_path / "out", cfg, bad, **kwargs)
    assert list(tmp_path.iterdir()) == []  # no staging directory left behind


def test_a_written_model_has_the_mode_of_a_new_directory(hf_gpt2, tmp_path, monkeypatch):
    """Written through a private temporary directory, the model once stayed 0700: unreadable
    to the group sharing it. It gets what mkdir gives, or the mode of the empty directory
    it replaces; the working folder itself is refused (it cannot be renamed over)."""
    cfg, state = read_hf(hf_gpt2)
    (tmp_path / "made").mkdir()
    assert (write_hf(tmp_path / "new", cfg, state).stat().st_mode
            == (tmp_path / "made").stat().st_mode)
    (tmp_path / "open").mkdir(mode=0o775)
    (tmp_path / "open").chmod(0o775)
    assert write_hf(tmp_path / "open", cfg, state).stat().st_mode & 0o777 == 0o775
    (tmp_path / "here").mkdir()
    monkeypatch.chdir(tmp_path / "here")
    with pytest.raises(ParaxisError, match="is the working folder or holds it"):
        write_hf(".", cfg, state)
    assert list((tmp_path / "here").iterdir()) == []


@pytest.mark.parametrize("shift,loads", [(0.0, True), (1.0, False)], ids=["tied", "untied"])
def test_a_stored_gpt2_head_must_be_the_tie(hf_gpt2, tmp_path, shift, loads):
    import shutil

    from safetensors.torch import load_file, save_file

    path = shutil.copytree(hf_gpt2, tmp_path / "model")
    tensors = load_file(path / "model.safetensors")
    tensors["lm_head.weight"] = tensors["transformer.wte.weight"] + shift
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    if loads:
        _, state = read_hf(path)
        assert torch.equal(state["tok_emb.weight"], tensors["transformer.wte.weight"])
        return
    with pytest.raises(ParaxisError, match="an LM head untied from wte"):
        HFReader(path)
