"""Read a Hugging Face Llama, Mixtral or GPT-2 directory one region at a time.

    reader = HFReader("path/to/hf-dir")        # checks names and shapes from the headers only
    rows = reader.region("blocks.0.attn.q.weight", (slice(0, 32), slice(None)))
    cfg, state = read_hf("path/to/hf-dir")     # every full tensor, for one process

A rank that owns a TP slice or a ZeRO-3 shard reads only that region
(`safe_open(...).get_slice` on a memory map), never materializing the full tensor, so loading
a model costs each rank its share plus, for a moment, the file pages of one tensor: a range of
rows touches only the pages that hold it, a range of columns the pages of every row (a
stored row is contiguous). Only safetensors are read: unpickling a `pytorch_model.bin` can
execute code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from paraxis.files.hf_config import hf_model_config, read_json, unsupported
from paraxis.model.hf.names import (
    FUSED_ROUTER,
    GPT2_PREFIX,
    IGNORED_SUFFIXES,
    expected_shapes,
    hf_tensors,
    their_index,
)
from paraxis.spec.errors import ParaxisError
from paraxis.spec.model_config import ModelConfig

SINGLE_FILE, INDEX_FILE = "model.safetensors", "model.safetensors.index.json"
# safetensors dtype names of the weights paraxis imports (cast to the run's dtype on load)
FLOAT_DTYPES = ("F64", "F32", "BF16", "F16")


class HFReader:
    """A Hugging Face checkpoint seen as paraxis parameters, read region by region.

    Construction reads config.json and the safetensors headers (no tensor data) and refuses,
    in one line, a missing tensor, a shape config.json does not imply, or a tensor with no
    place in the model. GPT-2 files that store the tied LM head are checked once against the
    embedding (the only full tensors read here).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.cfg: ModelConfig = hf_model_config(self.path)
        self.shapes: dict[str, tuple[int, ...]] = expected_shapes(self.cfg)
        self.names: list[str] = list(self.shapes)  # the model's order
        self._files = _Files(self.path)
        prefix = GPT2_PREFIX if self._files.has(GPT2_PREFIX + "wte.weight") else ""
        # Mixtral's experts: per-expert keys (save_pretrained), or transformers' stacked ones
        fused = self._files.has(f"model.layers.{self.cfg.first_dense_layers}.{FUSED_ROUTER}")
        self._sources = {}
        for theirs, (shape, boxes) in hf_tensors(self.cfg, prefix, fused).items():
            self._files.check_shape(theirs, shape)
            self._sources.update(boxes)
        if self.cfg.style == "gpt2" and self._files.has("lm_head.weight"):
            # some exports store the tied head: it must be the tie
            self._files.check_shape("lm_head.weight", self.shapes["tok_emb.weight"])
            self._check_tied_head()
        self._files.check_all_used()

    def region(self, name: str, index: tuple[slice, ...]) -> torch.Tensor:
        """Exactly `full_tensor[index]` for paraxis parameter `name` (one slice of step 1 per
        dim; missing trailing dims are whole), without reading the rest of the tensor. The
        result owns its memory, allocated by torch, and keeps the stored dtype."""
        if name not in self.shapes:
            raise ParaxisError(f"{self.path}: the model has no parameter {name!r}; names are "
                               f"like {self.names[0]!r} (see HFReader.names)")
        index = _concrete(name, index, self.shapes[name])
        source = self._sources[name]
        return self._files.read(source.name, their_index(source, index), source.transposed)

    def full(self, name: str) -> torch.Tensor:
        """The whole parameter `name`: `region` over every dim."""
        return self.region(name, ())

    def _check_tied_head(self) -> None:
        head = self._files.read("lm_head.weight", ())
        embedding = self.full("tok_emb.weight")
        if not torch.equal(head, embedding):
            raise unsupported(self._files.where["lm_head.weight"], "an LM head untied from wte")


def read_hf(path: str | Path) -> tuple[ModelConfig, dict[str, torch.Tensor]]:
    """A Hugging Face Llama, Mixtral or GPT-2 directory -> (ModelConfig, {paraxis name:
    full tensor}), in the model's order; tensors keep their stored dtype. For one process: a
    rank that owns part of the model reads its regions with `HFReader`."""
    reader = HFReader(path)
    return reader.cfg, {name: reader.full(name) for name in reader.names}


def _concrete(name: str, index: tuple[slice, ...], shape: tuple[int, ...]
              ) -> tuple[slice, ...]:
    """`index` padded with whole dims, with concrete 0 <= start <= stop <= size."""
    if not isinstance(index, tuple) or len(index) > len(shape):
        raise ParaxisError(f"region of {name}: give a tuple of at most {len(shape)} slices, "
                           f"not {index!r}")
    concrete = []
    for dim, size in enumerate(shape):
        part = index[dim] if dim < len(index) else slice(None)
        if not isinstance(part, slice) or part.step not in (None, 1):
            raise ParaxisError(f"region of {name}: dim {dim} is {part!r}; give a slice of "
                               "step 1 (start:stop)")
        start, stop, _ = part.indices(size)
        concrete.append(slice(start, max(start, stop)))
    return tuple(concrete)


class _Files:
    """The tensors of model.safetensors or of the shards an index names, by their name.

    Every read opens its file afresh and closes it before returning: the pages a read
    touches leave the process with the mapping, so a rank loading region after region holds
    its regions, not the file pages it passed through."""

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
        self.stored_shapes: dict[str, tuple[int, ...]] = {}  # from the headers: no data read
        self.stored_dtypes: dict[str, str] = {}
        for file in sorted(set(self.where.values())):
            handle = _open(file)
            for name in sorted(n for n, f in self.where.items() if f == file):
                stored = _get_slice(handle, file, name)
                self.stored_shapes[name] = tuple(stored.get_shape())
                self.stored_dtypes[name] = stored.get_dtype()

    def has(self, name: str) -> bool:
        return name in self.where

    def check_shape(self, name: str, shape: tuple[int, ...]) -> None:
        """Refuse a missing tensor or one of another shape, from the file's header alone."""
        if name not in self.where:
            raise ParaxisError(f"{self.listing}: tensor {name!r} is missing; is the checkpoint "
                               "complete and does config.json describe it?")
        if self.stored_shapes[name] != shape:
            raise ParaxisError(f"{self.where[name]}: tensor {name!r} has shape "
                               f"{self.stored_shapes[name]}, but config.json implies {shape}")
        if self.stored_dtypes[name] not in FLOAT_DTYPES:  # weights cast to floats: truncated
            raise ParaxisError(f"{self.where[name]}: tensor {name!r} is stored as "
                               f"{self.stored_dtypes[name]}, not floating point; weights of a "
                               "quantized or integer checkpoint do not import, give its "
                               "float (F32, BF16, F16) weights")
        self.used.add(name)

    def read(self, name: str, index: tuple[int | slice, ...], transposed: bool = False
             ) -> torch.Tensor:
        """Region `index` (concrete slices, or an int that drops its dim; () for all) of
        tensor `name`, read alone, as a contiguous tensor of torch's allocator (the transpose
        of the region if asked)."""
        file = self.where[name]
        with _open(file) as handle:
            try:
                piece = _get_slice(handle, file, name)[index]
            except Exception as error:  # noqa: BLE001 - safetensors raises its own error types
                raise ParaxisError(f"{file}: cannot read tensor {name!r}: {error}") from None
            # copied before the file closes: the piece is a view of its memory map
            return (piece.t() if transposed else piece).clone(
                memory_format=torch.contiguous_format)

    def check_all_used(self) -> None:
        left = sorted(n for n in set(self.where) - self.used if not n.endswith(IGNORED_SUFFIXES))
        if left:
            raise ParaxisError(f"{self.where[left[0]]}: tensor {left[0]!r} (and {len(left) - 1} "
                               "more) has no place in the model config.json describes")


def _get_slice(handle: safe_open, file: Path, name: str) -> Any:  # safetensors' PySafeSlice
    try:
        return handle.get_slice(name)
    except Exception as error:  # noqa: BLE001 - safetensors raises its own error types
        raise ParaxisError(f"{file}: cannot read tensor {name!r}: {error}") from None


def _open(file: Path) -> safe_open:
    """A memory-mapped safetensors handle (no pickle): a region read touches only the pages
    that hold it. (safetensors 0.8's `backend="pread"` reads a whole tensor for any slice.)"""
    if not file.is_file():
        raise ParaxisError(f"{file} does not exist; the index names it as a shard")
    try:
        return safe_open(file, framework="pt")
    except Exception as error:  # noqa: BLE001 - safetensors raises its own error types
        raise ParaxisError(f"{file} is not a readable safetensors file: {error}") from None
