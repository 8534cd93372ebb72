"""Offline resharding, and weights to and from Hugging Face (`paraxis checkpoint`).

Any layout already loads any checkpoint at start-up (`load.py`); `convert` does the
reassembly once, in one process with no process group, and writes files cut the way the
target layout's ranks hold them: one file per (pipeline stage, TP rank), each tensor split as
the TP plan splits it (`tensor_parallel.apply.tp_split_dim`). Data-parallel replicas read
the same file, and ZeRO shards are cut from it at load time. The whole model passes through
memory once, tensor by tensor per stage.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import torch

from paraxis.dist.params import is_pp_duplicate
from paraxis.files.checkpoint_manifest import FORMAT, VERSION, sha256_of, step_dir_name
from paraxis.files.host import outermost_missing
from paraxis.model.checkpoint.entries import KINDS, Entry
from paraxis.model.checkpoint.load import CheckpointReader, read_full_state
from paraxis.model.checkpoint.save import FILE_BYTES, _write_tensors, commit, rank_file
from paraxis.model.hf import read_hf, write_hf
from paraxis.model.stage import stage_parts
from paraxis.model.transformer import single_device_buffers
from paraxis.parallel.tensor.apply import tp_plan, tp_split_dim
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import ModelConfig
from paraxis.spec.partition import partition_layers


def stage_state_shapes(cfg: ModelConfig, layout: Layout, stage: int,
                       seq_len: int | None = None
                       ) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, ...]]]:
    """Single-device names and shapes of the parameters pipeline stage `stage` owns (a tied
    head copy belongs to the first stage's embedding), and of its buffers (training state
    without optimizer moments: `model.single_device_buffers`)."""
    partition = partition_layers(cfg, layout.pp, layout.virtual_stages, seq_len=seq_len,
                                 placement=layout.placement)
    parts = stage_parts(cfg, partition, stage)  # meta: names and shapes, no memory
    return ({name: tuple(param.shape) for part in parts
             for name, param in part.named_parameters() if not is_pp_duplicate(param)},
            {name: tuple(buffer.shape) for part in parts
             for name, buffer in single_device_buffers(part)})


def convert(source: str | Path, destination: str | Path, layout: Layout,
            seq_len: int | None = None) -> Path:
    """Rewrite checkpoint `source` as `destination/step-N`, cut for `layout`."""
    reader = CheckpointReader(source)
    manifest = reader.manifest
    cfg = reader.model_config()
    kinds = tuple(k for k in KINDS if reader.names(k))
    base = {key: value for key, value in manifest.items()
            if key not in ("files", "pieces", "layout", "world_size")}
    config = reader.directory / "config.toml"
    try:
        config_text = config.read_text() if config.is_file() else ""
    except UnicodeDecodeError:
        raise ParaxisError(f"{config} is not UTF-8 text; the checkpoint is damaged, use an "
                           "earlier one (or remove its config.toml)") from None
    return write_for_layout(reader.full, kinds, cfg, layout, destination,
                            {**base, "converted_from": str(reader.directory)},
                            config_text, seq_len)


def import_hf(source: str | Path, destination: str | Path, layout: Layout | None = None
              ) -> Path:
    """A Hugging Face model directory as a paraxis checkpoint at step 0 (weights only)."""
    layout = layout or Layout()
    cfg, state = read_hf(source)
    base = {"step": 0, "optimizer_steps": 0, "has_optimizer": False, "model": cfg.to_dict(),
            "imported_from": str(source)}
    return write_for_layout(lambda kind, name: state[name], ("param",), cfg, layout,
                            destination, base)


def export_hf(source: str | Path, destination: str | Path) -> Path:
    """A paraxis checkpoint's weights as a Hugging Face model directory."""
    cfg, state = read_full_state(source)
    write_hf(destination, cfg, state)
    return Path(destination)


def write_for_layout(full_of: Callable[[str, str], torch.Tensor], kinds: tuple[str, ...],
                     cfg: ModelConfig, layout: Layout, destination: str | Path,
                     base: dict, config_toml: str = "", seq_len: int | None = None) -> Path:
    """Write full tensors (`full_of(kind, name)`) as `destination/step-N`, one file per
    (stage, TP rank) of `layout`; `base` holds the manifest's other facts (step, model...)."""
    layout = layout.validate(model=cfg)  # heads, vocab, MLP width divisible by tp
    destination = Path(destination)
    final = destination / step_dir_name(int(base["step"]))
    if final.exists():
        raise ParaxisError(f"{final} already exists; choose another destination")
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    made = outermost_missing(destination)  # removed again if the write fails
    tmp.mkdir(parents=True)
    try:
        files, pieces = _write_pieces(full_of, kinds, cfg, layout, tmp, seq_len)
    except BaseException:  # a source that fails to read: leave no trace of the attempt
        shutil.rmtree(tmp, ignore_errors=True)
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
        raise
    manifest = {**base, "format": FORMAT, "version": VERSION, "layout": str(layout),
                "world_size": layout.world_size, "files": files, "pieces": pieces}
    commit(tmp, final, manifest, config_toml)
    return final


def _write_pieces(full_of: Callable[[str, str], torch.Tensor], kinds: tuple[str, ...],
                  cfg: ModelConfig, layout: Layout, tmp: Path, seq_len: int | None
                  ) -> tuple[dict, list]:
    """Each (stage, TP rank) file of `layout` into `tmp`: its file facts and its pieces. A
    rank's pieces go into files of at most FILE_BYTES, as a training save writes them, so
    that the conversion holds at most one file's worth per TP rank."""
    plan = tp_plan(split_experts=layout.etp > 1)
    files, pieces = {}, []
    held: dict[int, dict[str, torch.Tensor]] = {}  # each rank's file being filled
    written: dict[int, int] = {}  # each rank's files written

    def write(rank: int) -> None:
        path = tmp / rank_file(rank, written.get(rank, 0))
        _write_tensors(held.pop(rank), path)
        files[path.name] = {"sha256": sha256_of(path), "bytes": path.stat().st_size}
        written[rank] = written.get(rank, 0) + 1

    for stage in range(layout.pp):
        params, buffers = stage_state_shapes(cfg, layout, stage, seq_len)
        is_param = dict.fromkeys(params, True) | dict.fromkeys(buffers, False)
        for name, param in is_param.items():
            dim = tp_split_dim(name, plan) if layout.tp > 1 and param else None
            count = layout.tp if dim is not None else 1
            shape = (params if param else buffers)[name]
            for kind in kinds if param else ("param",):
                full = full_of(kind, name)
                if tuple(full.shape) != shape:  # a manifest's model that its tensors are not
                    raise ParaxisError(f"{kind} {name} is {tuple(full.shape)} where the model "
                                       f"{cfg.name} has {shape}: the source's model and its "
                                       "tensors disagree; use an earlier checkpoint")
                for tp_rank, part in enumerate(full.chunk(count, dim=dim) if count > 1
                                               else [full]):
                    rank = layout.rank(tp_rank=tp_rank, pp_rank=stage)
                    piece = Entry(kind, name, part.contiguous(), tuple(full.shape), dim,
                                  tp_rank, count, 0, part.numel(), owner=True)
                    if rank in held and _nbytes(held[rank]) + piece.tensor.nbytes > FILE_BYTES:
                        write(rank)
                    held.setdefault(rank, {})[piece.key] = piece.tensor
                    pieces.append({**piece.describe(), "key": piece.key,
                                   "file": rank_file(rank, written.get(rank, 0))})
        for rank in list(held):
            write(rank)
    return files, pieces


def _nbytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.nbytes for t in tensors.values())
