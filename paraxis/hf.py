"""Hugging Face interop: Llama and GPT-2 checkpoints (config.json + safetensors) in and out.

    cfg, state = read_hf("path/to/hf-dir")     # a ModelConfig and the full single-device state
    write_hf("out-dir", cfg, state)            # a directory transformers' from_pretrained loads

`state` is keyed by `paraxis.model` parameter names (`tok_emb.weight`, `blocks.0.attn.q.weight`,
...), one entry per parameter as `named_parameters()` lists them, so GPT-2's tied LM head
appears once, as `tok_emb.weight`. Any layout takes it from there: a pipeline stage or TP
shard copies the entries it owns by name. Nothing here downloads, and only safetensors are
read: unpickling a `pytorch_model.bin` can execute code.

Conventions, checked against transformers' modeling_llama.py and modeling_gpt2.py:
- RoPE: both implementations rotate halves (channel i pairs with i + head_dim/2), and HF
  Llama checkpoints already carry the q/k row permutation that Meta's interleaved pairs need,
  so q and k rows are copied as they are.
- GPT-2's Conv1D stores weights as (in, out): transposed into nn.Linear's (out, in). Its fused
  `c_attn` stacks q, k, v along the output dimension, split here into three projections.
- GPT-2's `gelu_new` is the tanh approximation of GELU, the one `paraxis.model` uses.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from paraxis.errors import ParaxisError
from paraxis.hf_config import gpt2_json, llama_json, read_json, unsupported
from paraxis.model import Transformer

if TYPE_CHECKING:
    from safetensors import safe_open
from paraxis.model_config import ModelConfig, hf_model_config

SINGLE_FILE, INDEX_FILE = "model.safetensors", "model.safetensors.index.json"
# Per-block names: Hugging Face suffix -> paraxis suffix, copied as they are.
LLAMA_BLOCK = {
    "input_layernorm.weight": "norm1.weight",
    "self_attn.q_proj.weight": "attn.q.weight",
    "self_attn.k_proj.weight": "attn.k.weight",
    "self_attn.v_proj.weight": "attn.v.weight",
    "self_attn.o_proj.weight": "attn.o.weight",
    "post_attention_layernorm.weight": "norm2.weight",
    "mlp.gate_proj.weight": "mlp.gate.weight",
    "mlp.up_proj.weight": "mlp.up.weight",
    "mlp.down_proj.weight": "mlp.down.weight",
}
LLAMA_TOP = {"model.embed_tokens.weight": "tok_emb.weight", "model.norm.weight": "norm_f.weight",
             "lm_head.weight": "lm_head.weight"}
# GPT-2: HF suffix -> (paraxis suffix, Conv1D weight to transpose). c_attn is split apart.
GPT2_BLOCK = {
    "ln_1.weight": ("norm1.weight", False), "ln_1.bias": ("norm1.bias", False),
    "attn.c_proj.weight": ("attn.o.weight", True), "attn.c_proj.bias": ("attn.o.bias", False),
    "ln_2.weight": ("norm2.weight", False), "ln_2.bias": ("norm2.bias", False),
    "mlp.c_fc.weight": ("mlp.up.weight", True), "mlp.c_fc.bias": ("mlp.up.bias", False),
    "mlp.c_proj.weight": ("mlp.down.weight", True), "mlp.c_proj.bias": ("mlp.down.bias", False),
}
GPT2_TOP = {"wte.weight": "tok_emb.weight", "wpe.weight": "pos_emb.weight",
            "ln_f.weight": "norm_f.weight", "ln_f.bias": "norm_f.bias"}
# Buffers older transformers versions saved next to the weights: recomputed, never needed.
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq")


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """{paraxis parameter name: shape}, from a model built on the meta device (no memory)."""
    with torch.device("meta"):
        model = Transformer(cfg)
    return {name: tuple(p.shape) for name, p in model.named_parameters()}


# ------------------------------------------------------------------------------ reading


def read_hf(path: str | Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """A Hugging Face Llama or GPT-2 directory -> (ModelConfig, {paraxis name: tensor}).

    Tensors keep their stored dtype; every tensor is checked for presence and shape.
    """
    path = Path(path)
    cfg = hf_model_config(path)
    weights = _Weights(path)
    state = _from_llama(weights, cfg) if cfg.style == "llama" else _from_gpt2(weights, cfg)
    weights.check_all_used()
    return cfg, state


class _Weights:
    """The tensors of model.safetensors or of the shards an index names, read on demand."""

    def __init__(self, path: Path) -> None:
        if (path / INDEX_FILE).is_file():
            weight_map = read_json(path / INDEX_FILE).get("weight_map")
            if not isinstance(weight_map, dict):
                raise ParaxisError(f"{path / INDEX_FILE} has no weight_map object")
            self.where = {name: path / file for name, file in weight_map.items()}
            self.listing = path / INDEX_FILE
        elif (path / SINGLE_FILE).is_file():
            self.where = dict.fromkeys(_open(path / SINGLE_FILE).keys(), path / SINGLE_FILE)
            self.listing = path / SINGLE_FILE
        else:
            pickled = sorted(p.name for p in path.glob("pytorch_model*.bin"))
            if pickled:
                raise ParaxisError(f"{path / pickled[0]} is a pickle, which can run code when "
                                   "loaded; convert it to safetensors first (transformers: "
                                   "save_pretrained(dir, safe_serialization=True))")
            raise ParaxisError(f"{path} holds neither {SINGLE_FILE} nor {INDEX_FILE}; save the "
                               "model with safetensors")
        self.used: set[str] = set()
        self.open_files: dict[Path, object] = {}

    def take(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if name not in self.where:
            raise ParaxisError(f"{self.listing}: tensor {name!r} is missing; is the checkpoint "
                               "complete and does config.json describe it?")
        file = self.where[name]
        if file not in self.open_files:
            self.open_files[file] = _open(file)
        try:
            tensor = self.open_files[file].get_tensor(name)
        except Exception as error:  # noqa: BLE001 - safetensors raises its own error types
            raise ParaxisError(f"{file}: cannot read tensor {name!r}: {error}") from None
        if tuple(tensor.shape) != shape:
            raise ParaxisError(f"{file}: tensor {name!r} has shape {tuple(tensor.shape)}, but "
                               f"config.json implies {shape}")
        self.used.add(name)
        return tensor

    def has(self, name: str) -> bool:
        return name in self.where

    def check_all_used(self) -> None:
        left = sorted(n for n in set(self.where) - self.used if not n.endswith(IGNORED_SUFFIXES))
        if left:
            raise ParaxisError(f"{self.where[left[0]]}: tensor {left[0]!r} (and {len(left) - 1} "
                               "more) has no place in the model config.json describes")


def _open(file: Path) -> safe_open:
    """A memory-mapped safetensors handle (no pickle)."""
    from safetensors import safe_open

    if not file.is_file():
        raise ParaxisError(f"{file} does not exist; the index names it as a shard")
    try:
        return safe_open(file, framework="pt")
    except Exception as error:  # noqa: BLE001 - safetensors raises its own error types
        raise ParaxisError(f"{file} is not a readable safetensors file: {error}") from None


def _from_llama(weights: _Weights, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    shapes = expected_shapes(cfg)
    state = {ours: weights.take(theirs, shapes[ours]) for theirs, ours in LLAMA_TOP.items()}
    for i in range(cfg.n_layers):
        for theirs, ours in LLAMA_BLOCK.items():
            name = f"blocks.{i}.{ours}"
            state[name] = weights.take(f"model.layers.{i}.{theirs}", shapes[name])
    return {name: state[name] for name in shapes}


def _from_gpt2(weights: _Weights, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    shapes = expected_shapes(cfg)
    # Checkpoints saved from GPT2LMHeadModel prefix "transformer."; OpenAI's original do not.
    prefix = "transformer." if weights.has("transformer.wte.weight") else ""
    state = {ours: weights.take(prefix + theirs, shapes[ours]) for theirs, ours in
             GPT2_TOP.items()}
    for i in range(cfg.n_layers):
        block = f"{prefix}h.{i}."
        for theirs, (ours, conv) in GPT2_BLOCK.items():
            name = f"blocks.{i}.{ours}"
            shape = shapes[name][::-1] if conv else shapes[name]
            tensor = weights.take(block + theirs, shape)
            state[name] = tensor.t().contiguous() if conv else tensor
        d = cfg.d_model
        weight = weights.take(block + "attn.c_attn.weight", (d, 3 * d)).t()
        bias = weights.take(block + "attn.c_attn.bias", (3 * d,))
        for part, w, b in zip("qkv", weight.split(d), bias.split(d), strict=True):
            state[f"blocks.{i}.attn.{part}.weight"] = w.contiguous()
            state[f"blocks.{i}.attn.{part}.bias"] = b.clone()
    if weights.has("lm_head.weight"):  # some exports store the tied head: it must be the tie
        head = weights.take("lm_head.weight", shapes["tok_emb.weight"])
        if not torch.equal(head, state["tok_emb.weight"]):
            raise unsupported(weights.where["lm_head.weight"], "an LM head untied from wte")
    return {name: state[name] for name in shapes}  # the model's own order


# ------------------------------------------------------------------------------ writing


def write_hf(path: str | Path, cfg: ModelConfig, state: dict[str, torch.Tensor],
             overwrite: bool = False) -> Path:
    """Write config.json + model.safetensors that transformers loads to the same logits.

    The files are written into a temporary sibling directory and renamed into place, so a
    crash never leaves a half-written model. A non-empty `path` is refused unless `overwrite`.
    """
    from safetensors.torch import save_file

    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ParaxisError(f"{path} is a file; give a directory to write the model into")
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise ParaxisError(f"{path} exists and is not empty; choose a new directory or pass "
                           "overwrite=True")
    tensors = _to_hf(cfg, _checked_state(cfg, state))
    dtype = str(state["tok_emb.weight"].dtype).removeprefix("torch.")
    config = (llama_json if cfg.style == "llama" else gpt2_json)(cfg)
    config.update(dtype=dtype, torch_dtype=dtype)  # "torch_dtype" for transformers < 4.56
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        save_file(tensors, staging / SINGLE_FILE, metadata={"format": "pt"})
        if path.exists():
            old = staging.with_name(staging.name + ".old")
            path.rename(old)
            staging.rename(path)
            shutil.rmtree(old)
        else:
            staging.rename(path)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return path


def _checked_state(cfg: ModelConfig, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    shapes = expected_shapes(cfg)
    state = dict(state)
    head = state.get("lm_head.weight")
    if cfg.tied_embeddings and head is not None:  # state_dict() lists the tie twice
        if not torch.equal(head, state.get("tok_emb.weight", head)):
            raise ParaxisError("state: lm_head.weight differs from tok_emb.weight, but GPT-2 "
                               "ties them; export the tied model's parameters")
        del state["lm_head.weight"]
    missing = sorted(set(shapes) - set(state))
    extra = sorted(set(state) - set(shapes))
    if missing or extra:
        raise ParaxisError(f"state does not match model {cfg.name}: missing {missing[:3]}, "
                           f"unexpected {extra[:3]}; give the full single-device parameters")
    for name, shape in shapes.items():
        if tuple(state[name].shape) != shape:
            raise ParaxisError(f"state: {name} has shape {tuple(state[name].shape)}, model "
                               f"{cfg.name} needs {shape}; gather TP shards before exporting")
    return state


def _to_hf(cfg: ModelConfig, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    plain: Callable[[torch.Tensor], torch.Tensor] = lambda t: t.detach().contiguous()  # noqa: E731
    out: dict[str, torch.Tensor] = {}
    if cfg.style == "llama":
        for theirs, ours in LLAMA_TOP.items():
            out[theirs] = plain(state[ours])
        for i in range(cfg.n_layers):
            for theirs, ours in LLAMA_BLOCK.items():
                out[f"model.layers.{i}.{theirs}"] = plain(state[f"blocks.{i}.{ours}"])
        return out
    for theirs, ours in GPT2_TOP.items():
        out[f"transformer.{theirs}"] = plain(state[ours])
    for i in range(cfg.n_layers):
        block, ours = f"transformer.h.{i}.", f"blocks.{i}."
        for theirs, (name, conv) in GPT2_BLOCK.items():
            tensor = state[ours + name].detach()
            out[block + theirs] = (tensor.t() if conv else tensor).contiguous()
        parts = [state[f"{ours}attn.{p}.weight"].detach() for p in "qkv"]
        out[block + "attn.c_attn.weight"] = torch.cat(parts).t().contiguous()
        out[block + "attn.c_attn.bias"] = torch.cat([state[f"{ours}attn.{p}.bias"].detach()
                                                     for p in "qkv"])
    return out
