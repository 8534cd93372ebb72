"""Write paraxis parameters as a Hugging Face directory, one tensor at a time.

    write_hf("out-dir", cfg, model.state_dict())        # a Mapping of full tensors
    write_hf("out-dir", cfg, lambda name: make(name))  # or one full tensor on demand

The output is what transformers' `save_pretrained` writes: config.json and either one
model.safetensors or, when the tensors pass `max_shard_bytes`, shards
model-0000k-of-0000N.safetensors with model.safetensors.index.json naming the shard of each
tensor. A shard is written as soon as it is full and then dropped, so with a callable `state`
the process holds about one tensor beyond what it held before: a model no process can hold
whole can still be written. A mixture of experts is written as Mixtral, with the per-expert
keys `save_pretrained` writes (`hf_names`).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable, Mapping
from math import prod
from pathlib import Path

import torch
from safetensors.torch import save_file

from paraxis.files.hf_config import config_json
from paraxis.files.host import plain_mode, umask
from paraxis.model.hf.names import Source, expected_shapes, hf_tensors, their_index
from paraxis.spec.errors import ParaxisError
from paraxis.spec.model_config import ModelConfig

SINGLE_FILE, INDEX_FILE = "model.safetensors", "model.safetensors.index.json"
DEFAULT_SHARD_BYTES = 2 << 30  # for a Mapping; transformers' save_pretrained defaults to 5GB


def write_hf(path: str | Path, cfg: ModelConfig,
             state: Mapping[str, torch.Tensor] | Callable[[str], torch.Tensor],
             overwrite: bool = False, max_shard_bytes: int | None = None) -> Path:
    """Write a directory transformers' from_pretrained loads to the same logits.

    `state` gives the full single-device tensor of each paraxis parameter: a Mapping (as
    `state_dict()` or `named_parameters()` list them) or a callable `name -> tensor`, asked
    once per name in the model's order. A shard holds at most `max_shard_bytes` (a larger
    tensor gets a shard of its own); left out, that is 2 GiB for a Mapping, whose tensors are
    in memory anyway, and the largest tensor's bytes for a callable. The files are written
    into a temporary sibling directory and renamed into place, so a crash never leaves a
    half-written model. A non-empty `path` is refused unless `overwrite`.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ParaxisError(f"{path} is a file; give a directory to write the model into")
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise ParaxisError(f"{path} exists and is not empty; choose a new or empty directory")
    if Path.cwd().is_relative_to(path.resolve()):  # a folder in use cannot be renamed over
        raise ParaxisError(f"{path} is the working folder or holds it; give a new or empty "
                           "directory beside it")
    if max_shard_bytes is not None and max_shard_bytes <= 0:
        raise ParaxisError(f"max_shard_bytes is {max_shard_bytes}; give a positive size")
    config = config_json(cfg)  # refuses a model the format cannot hold before any writing
    if isinstance(state, Mapping):
        tensor_of = _checked_state(cfg, state).__getitem__
        max_shard_bytes = max_shard_bytes or DEFAULT_SHARD_BYTES
    elif callable(state):
        tensor_of = _checked_callable(cfg, state)
    else:
        raise ParaxisError(f"state is a {type(state).__name__}; give a Mapping of paraxis "
                           "names to tensors or a callable name -> tensor")
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    # mkdtemp makes it private (0700); the model gets the mode a mkdir would give it, or the
    # one of the empty directory it replaces
    staging.chmod(path.stat().st_mode & 0o7777 if path.is_dir() else 0o777 & ~umask())
    try:
        dtype = _write_shards(staging, cfg, tensor_of, max_shard_bytes)
        config.update(dtype=dtype, torch_dtype=dtype)  # "torch_dtype" for transformers < 4.56
        (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n")
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


def _write_shards(folder: Path, cfg: ModelConfig, tensor_of: Callable[[str], torch.Tensor],
                  max_shard_bytes: int | None) -> str:
    """Write every Hugging Face tensor into shards of `folder`, holding one shard at a time;
    returns the dtype of the first tensor, the one config.json names."""
    tensors = hf_tensors(cfg)
    largest = max(prod(shape) for shape, _ in tensors.values())
    shards = _Shards(folder)
    limit, itemsize, dtype = max_shard_bytes or 0, 0, ""
    for theirs, (shape, boxes) in tensors.items():
        # decided before the tensor is made, from its shape and the last dtype seen, so a
        # full shard is on disk and gone before the next tensor exists
        if shards.held + prod(shape) * itemsize > limit:
            shards.flush()
        tensor = _assemble(shape, boxes, tensor_of)
        dtype = dtype or str(tensor.dtype).removeprefix("torch.")
        itemsize = tensor.element_size()
        limit = max_shard_bytes or largest * itemsize
        if shards.held + tensor.nbytes > limit:  # a dtype other than the last one's
            shards.flush()
        shards.add(theirs, tensor)
    shards.finish()
    return dtype


class _Shards:
    """Safetensors files written as they fill, under save_pretrained's names."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.tensors: dict[str, torch.Tensor] = {}  # the shard being filled
        self.held = 0  # its bytes
        self.written: list[list[str]] = []  # the names in each file written so far
        self.total_bytes = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        self.tensors[name] = tensor
        self.held += tensor.nbytes
        self.total_bytes += tensor.nbytes

    def flush(self) -> None:
        if self.tensors:
            path = self._part(len(self.written))
            save_file(self.tensors, path, metadata={"format": "pt"})
            plain_mode(path)
            self.written.append(list(self.tensors))
            self.tensors, self.held = {}, 0

    def finish(self) -> None:
        """Flush the last shard and name the files: one model.safetensors, or k-of-N shards
        and the index transformers reads them by."""
        self.flush()
        count = len(self.written)
        if count == 1:
            self._part(0).rename(self.folder / SINGLE_FILE)
            return
        weight_map = {}
        for k, names in enumerate(self.written):
            file = f"model-{k + 1:05d}-of-{count:05d}.safetensors"
            self._part(k).rename(self.folder / file)
            weight_map.update(dict.fromkeys(names, file))
        index = {"metadata": {"total_size": self.total_bytes}, "weight_map": weight_map}
        (self.folder / INDEX_FILE).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")

    def _part(self, k: int) -> Path:  # shard k before the count is known
        return self.folder / f"part-{k}.safetensors"


def _assemble(shape: tuple[int, ...], boxes: dict[str, Source],
              tensor_of: Callable[[str], torch.Tensor]) -> torch.Tensor:
    """One Hugging Face tensor from the paraxis parameters whose boxes tile it, asking for
    each parameter once and dropping it as soon as it is copied in."""
    (ours, source), *others = boxes.items()
    if not others and source.offset == 0:  # the usual case: the parameter itself
        tensor = tensor_of(ours).detach()
        return (tensor.t() if source.transposed else tensor).contiguous()
    out = None
    for ours, source in boxes.items():
        tensor = tensor_of(ours).detach()
        if out is None:
            out = torch.empty(shape, dtype=tensor.dtype)
        whole = tuple(slice(0, size) for size in tensor.shape)
        out[their_index(source, whole)] = tensor.t() if source.transposed else tensor
    return out


def _checked_callable(cfg: ModelConfig, state: Callable[[str], torch.Tensor]
                      ) -> Callable[[str], torch.Tensor]:
    """`state`, with each tensor it gives checked against the model's shape."""
    shapes = expected_shapes(cfg)

    def tensor_of(name: str) -> torch.Tensor:
        tensor = state(name)
        if not isinstance(tensor, torch.Tensor):
            raise ParaxisError(f"state({name!r}) gave a {type(tensor).__name__}; the callable "
                               "must return the full tensor of that parameter")
        _check_shape(cfg, name, tensor, shapes[name])
        return tensor

    return tensor_of


def _checked_state(cfg: ModelConfig, state: Mapping[str, torch.Tensor]
                   ) -> dict[str, torch.Tensor]:
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
        _check_shape(cfg, name, state[name], shape)
    return state


def _check_shape(cfg: ModelConfig, name: str, tensor: torch.Tensor,
                 shape: tuple[int, ...]) -> None:
    if tuple(tensor.shape) != shape:
        raise ParaxisError(f"state: {name} has shape {tuple(tensor.shape)}, model "
                           f"{cfg.name} needs {shape}; gather TP shards before exporting")
