"""Checkpoints: exact resume, resharding across layouts, crash safety, bad files.

The resharding test is Megatron's strongest: save at one layout, load at another, save
again, and compare both checkpoints as plain full tensors, bit for bit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from paraxis.cli import main
from paraxis.dist.testing import LayoutLike, RankContext, as_layout, run_on_ranks
from paraxis.files.host import umask
from paraxis.model.checkpoint import complete_checkpoints, load_checkpoint, read_full_state
from paraxis.model.checkpoint.convert import convert
from paraxis.model.checkpoint.entries import KINDS
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import Layout
from paraxis.spec.runtime_options import RuntimeOptions
from paraxis.train.config import RunConfig
from paraxis.train.loop import run_training

ROOT = Path(__file__).resolve().parents[1]


def _cfg(layout: LayoutLike, steps: int, **options) -> RunConfig:
    return RunConfig.from_flags(model="tiny", steps=steps, global_batch=8, seq_len=32, lr=3e-3,
                                warmup=2, quiet=True, layout=as_layout(layout), **options)


def _losses(records: list[dict]) -> list[float]:
    return [r["loss"] for r in records]


def _full(directory: Path) -> dict[str, torch.Tensor]:
    return read_full_state(directory, kinds=KINDS)[1]


def _assert_same_tensors(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        assert torch.equal(a[name], b[name]), name


# ----------------------------------------------------------------------- exact resume


def _straight_and_resumed(ctx: RankContext, root: str) -> tuple[list, list]:
    layout = ctx.layout
    straight = run_training(_cfg(layout, 10, checkpoint_dir=f"{root}/straight"))
    run_training(_cfg(layout, 10, checkpoint_dir=f"{root}/split", exit_after=5))
    resumed = run_training(_cfg(layout, 10, checkpoint_dir=f"{root}/split",
                                resume=f"{root}/split"))
    return straight, resumed


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["dp=2,pp=2,zero=1,microbatches=2", "dp=2,tp=2,zero=3"])
def test_resume_is_bit_identical(tmp_path, layout):
    straight, resumed = run_on_ranks(layout, _straight_and_resumed, str(tmp_path),
                                     timeout_s=170)[0]
    assert _losses(resumed) == _losses(straight)[5:]
    _assert_same_tensors(_full(tmp_path / "straight" / "step-00000010"),
                         _full(tmp_path / "split" / "step-00000010"))


def test_fp16_loss_scale_survives_a_resume(tmp_path):
    # A resumed fp16 run must go on with the scale the run had reached (and its count
    # towards the next doubling), not restart from 2**16.
    from paraxis.engine.data_parallel import DataParallelEngine
    from paraxis.model.checkpoint import save_checkpoint
    from paraxis.model.transformer import build_model
    from paraxis.spec.model_config import PRESETS
    from paraxis.spec.precision import autocast_policy

    def engine() -> DataParallelEngine:
        return DataParallelEngine(build_model(PRESETS["tiny"], seed=0), Layout(), None,
                                  options=RuntimeOptions(precision=autocast_policy("fp16")))

    saved = engine()
    for overflow in (True, True, False, False, False):
        saved.loss_scaler.update(overflow)
    assert saved.loss_scaler.state_dict() == {"scale": 2.0**14, "clean_steps": 3}
    path = save_checkpoint(saved, tmp_path, 5, PRESETS["tiny"].to_dict())
    loaded = engine()
    load_checkpoint(loaded, path, PRESETS["tiny"].to_dict())
    assert loaded.loss_scaler.state_dict() == {"scale": 2.0**14, "clean_steps": 3}
    assert loaded.loss_scaler.last_scale == 2.0**14  # the first resumed step unscales by it


# ------------------------------------------------------------------------ resharding


def _reshard_body(ctx: RankContext, root: str) -> tuple[list, list]:
    import torch.distributed as dist

    from paraxis.files.model_file import load_model_config
    from paraxis.model.checkpoint import save_checkpoint
    from paraxis.parallelize import build_engine

    source = f"{root}/a/step-00000003"
    run_training(_cfg("dp=2,tp=2,pp=2,zero=1", 5, checkpoint_dir=f"{root}/a", exit_after=3))
    original = run_training(_cfg("dp=2,tp=2,pp=2,zero=1", 5, resume=source))
    # Load at another layout and save again, untouched.
    cfg = _cfg("dp=1,tp=4,pp=2", 5)
    model_cfg = load_model_config(cfg.model.name)
    groups = ctx.with_layout(cfg.layout).groups
    engine = build_engine(model_cfg, cfg.layout, groups, torch.device("cpu"), seed=cfg.train.seed,
                          seq_len=32)
    load_checkpoint(engine, source, model_cfg.to_dict(), dist.get_rank())
    save_checkpoint(engine, f"{root}/b", 3, model_cfg.to_dict())
    resharded = run_training(_cfg("dp=1,tp=4,pp=2", 5, resume=source))
    return original, resharded


@pytest.mark.slow
def test_reshard_across_layouts_and_to_one_device(tmp_path):
    original, resharded = run_on_ranks(8, _reshard_body, str(tmp_path), timeout_s=170)[0]
    source = tmp_path / "a" / "step-00000003"
    _assert_same_tensors(_full(source), _full(tmp_path / "b" / "step-00000003"))

    # Single device: load, save again, compare; then train on from the same checkpoint.
    _load_and_save(source, tmp_path / "c")
    _assert_same_tensors(_full(source), _full(tmp_path / "c" / "step-00000003"))
    single = run_training(_cfg("dp=1", 5, resume=str(source)))

    # Offline conversion: the same tensors, cut for the target; training on from it is
    # bit-identical to training on from the source.
    for layout in ("dp=1,tp=4,pp=2", "dp=1"):
        converted = convert(source, tmp_path / layout, Layout.parse(layout))
        _assert_same_tensors(_full(source), _full(converted))
    files = json.loads((tmp_path / "dp=1,tp=4,pp=2" / "step-00000003" / "manifest.json"
                        ).read_text())["files"]
    assert len(files) == 8
    from_converted = run_training(_cfg("dp=1", 5, resume=str(tmp_path / "dp=1")))
    assert _losses(from_converted) == _losses(single)
    for records in (resharded, single):
        assert [r["step"] for r in records] == [3, 4]
        torch.testing.assert_close(torch.tensor(_losses(records)),
                                   torch.tensor(_losses(original)), rtol=1e-5, atol=0)


def _load_and_save(source: Path, destination: Path, layout: str = "dp=1") -> None:
    from paraxis.dist.groups import build_groups
    from paraxis.files.model_file import load_model_config
    from paraxis.model.checkpoint import save_checkpoint
    from paraxis.parallelize import build_engine

    cfg = _cfg(layout, 5)
    model_cfg = load_model_config(cfg.model.name)
    groups = build_groups(cfg.layout)
    engine = build_engine(model_cfg, cfg.layout, groups, torch.device("cpu"), seed=cfg.train.seed,
                          seq_len=32)
    manifest = load_checkpoint(engine, source, model_cfg.to_dict())
    save_checkpoint(engine, destination, manifest["step"], model_cfg.to_dict())


# ------------------------------------------------------------------------ crash safety


@pytest.mark.slow
def test_a_rank_dying_mid_save_leaves_the_previous_checkpoint_latest(tmp_path):
    root = tmp_path / "ckpt"
    command = [sys.executable, "-m", "paraxis", "train", "--nproc", "2", "--dp", "2",
               "--zero", "1", "--model", "tiny", "--steps", "6", "--global-batch", "4",
               "--seq-len", "32", "--checkpoint-dir", str(root), "--checkpoint-every", "2",
               "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PARAXIS_TEST_DIE_DURING_SAVE": "4:1"}
    died = subprocess.run(command, env=env, capture_output=True, text=True, timeout=170)
    assert died.returncode != 0
    assert [step for step, _ in complete_checkpoints(root)] == [2]
    assert (root / "step-00000004.tmp").is_dir()  # rank 0's shard is there, uncommitted
    read_full_state(root)  # the latest (step 2) loads
    env.pop("PARAXIS_TEST_DIE_DURING_SAVE")
    resumed = subprocess.run([*command, "--resume", "auto"], env=env, capture_output=True,
                             text=True, timeout=170)
    assert resumed.returncode == 0, resumed.stderr
    assert [step for step, _ in complete_checkpoints(root)] == [2, 4, 6]
    assert not (root / "step-00000004.tmp").exists()


# -------------------------------------------------------------------- bad checkpoints


@pytest.fixture
def saved(tmp_path) -> Path:
    _train_one_device(tmp_path / "run", steps=2)
    return tmp_path / "run" / "step-00000002"


def _train_one_device(root: Path, steps: int, keep: int = 3, every: int = 0) -> list[dict]:
    return run_training(_cfg("dp=1", steps, checkpoint_dir=str(root), keep=keep,
                             checkpoint_every=every))


def _load_into_fresh(directory: Path, model: str = "tiny") -> None:
    from paraxis.engine.contract import LocalEngine
    from paraxis.files.model_file import load_model_config
    from paraxis.model.transformer import build_model

    cfg = load_model_config(model)
    load_checkpoint(LocalEngine(build_model(cfg), Layout()), directory, cfg.to_dict())


def test_keep_retains_the_newest_checkpoints(tmp_path):
    _train_one_device(tmp_path / "run", steps=4, keep=2, every=1)
    assert [step for step, _ in complete_checkpoints(tmp_path / "run")] == [3, 4]


def test_truncated_shard_is_named(saved):
    shard = saved / "rank-00000.safetensors"
    shard.write_bytes(shard.read_bytes()[:1000])
    with pytest.raises(ParaxisError, match="rank-00000.safetensors is corrupt or truncated"):
        _load_into_fresh(saved)


def test_corrupt_shard_is_named(saved):
    shard = saved / "rank-00000.safetensors"
    data = bytearray(shard.read_bytes())
    data[-5] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(ParaxisError, match="rank-00000.safetensors is corrupt"):
        read_full_state(saved)


def test_checkpoint_of_another_model_is_refused(saved):
    with pytest.raises(ParaxisError, match="different model"):
        _load_into_fresh(saved, model="tiny-llama")


def _edit_manifest(directory: Path, **changes) -> None:
    path = directory / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest.update(changes)
    path.write_text(json.dumps(manifest))


def test_newer_format_is_refused(saved):
    _edit_manifest(saved, version=99)
    with pytest.raises(ParaxisError, match="newer than this paraxis reads"):
        read_full_state(saved)


def test_manifest_cannot_point_outside_the_checkpoint(saved):
    manifest = json.loads((saved / "manifest.json").read_text())
    files = manifest["files"]
    files["../../etc/passwd"] = files.pop("rank-00000.safetensors")
    _edit_manifest(saved, files=files)
    with pytest.raises(ParaxisError, match="outside the checkpoint directory"):
        read_full_state(saved)


def test_directory_without_manifest_is_not_a_checkpoint(saved):
    (saved / "manifest.json").unlink()
    with pytest.raises(ParaxisError, match="no manifest.json"):
        read_full_state(saved)
    with pytest.raises(ParaxisError, match="no complete checkpoint"):
        read_full_state(saved.parent)


# ------------------------------------------------------------ the plan, read offline


def _split_dims_match_the_runtime(ctx: RankContext, model_name: str) -> None:
    import torch.distributed as dist

    from paraxis.files.model_file import load_model_config
    from paraxis.model.transformer import build_model
    from paraxis.parallel.tensor.apply import apply_tensor_parallel, tp_split_dim

    model = apply_tensor_parallel(build_model(load_model_config(model_name)), dist.group.WORLD)
    for name, param in model.named_parameters():
        expected = param.tp_shard_dim if getattr(param, "tp_sharded", False) else None
        assert tp_split_dim(name) == expected, name


@pytest.mark.parametrize("model", ["tiny", "tiny-llama"])
def test_offline_split_dims_are_the_runtimes(model):
    run_on_ranks("tp=2", _split_dims_match_the_runtime, model)


# --------------------------------------------------------------------- command line


def _cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "paraxis", *argv], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)


def test_checkpoint_command_info_and_convert(saved, tmp_path):
    info = _cli("checkpoint", "info", str(saved.parent), "--json")
    assert info.returncode == 0, info.stderr
    assert json.loads(info.stdout)["step"] == 2
    done = _cli("checkpoint", "convert", str(saved), str(tmp_path / "tp2"), "--layout", "tp=2")
    assert done.returncode == 0, done.stderr
    _assert_same_tensors(_full(saved), _full(tmp_path / "tp2"))


def _resume_both(ctx: RankContext, source: str, converted: str) -> tuple[list, list]:
    return (_losses(run_training(_cfg("dp=2", 4, resume=source))),
            _losses(run_training(_cfg("dp=2", 4, resume=converted))))


def test_a_conversion_resumes_at_its_own_data_parallel_layout(saved, tmp_path):
    # convert writes one file per (stage, TP rank): the other dp ranks have no file of their
    # own (nor RNG state) to restore, and must still resume, as from the source
    converted = convert(saved, tmp_path / "dp2", Layout.parse("dp=2"))
    from_source, from_conversion = run_on_ranks("dp=2", _resume_both, str(saved),
                                                str(converted))[0]
    assert from_conversion == from_source


def test_convert_splits_a_ranks_pieces_into_files_as_a_save_does(saved, tmp_path,
                                                                 monkeypatch):
    """A training save writes a rank's pieces into files of at most FILE_BYTES; so does
    convert, holding one such file per TP rank at a time, and the pieces read back whole."""
    from paraxis.model.checkpoint import convert as module

    monkeypatch.setattr(module, "FILE_BYTES", 64 * 1024)
    converted = convert(saved, tmp_path / "tp2", Layout.parse("tp=2"))
    files = json.loads((converted / "manifest.json").read_text())["files"]
    assert {"rank-00000-1.safetensors", "rank-00001-1.safetensors"} <= set(files), files
    assert all(f["bytes"] <= 64 * 1024 + 16 * 1024 for f in files.values())  # + a header
    _assert_same_tensors(_full(saved), _full(converted))
    assert all((converted / name).stat().st_mode & 0o777 == 0o666 & ~umask()
               for name in files), "weights readable as any file the user writes"


def test_a_checkpoint_converts_to_the_zb_v_split_and_back(tmp_path):
    # zb-v places chunks in a V (stage 0 holds the embedding and the head, and a tied
    # model's two copies): conversion cuts the same tensors for it, and back to one device.
    run_training(_cfg("dp=1", 3, checkpoint_dir=str(tmp_path / "a"), checkpoint_every=3))
    source = tmp_path / "a" / "step-00000003"
    v_split = convert(source, tmp_path / "v", Layout.parse("pp=2,schedule=zb-v,microbatches=2"))
    _assert_same_tensors(_full(source), _full(v_split))
    back = convert(v_split, tmp_path / "one", Layout.parse("dp=1"))
    _assert_same_tensors(_full(source), _full(back))


def test_convert_refuses_a_manifest_whose_model_its_tensors_are_not(tmp_path):
    """A manifest edited to another width, its checksum made again: convert wrote a
    checkpoint of the stated model from tensors of the other, which generate then refused."""
    from paraxis.files.checkpoint_manifest import CHECKSUM, with_checksum

    run_training(_cfg("dp=1", 1, checkpoint_dir=str(tmp_path / "a")))
    source = tmp_path / "a" / "step-00000001"
    manifest = json.loads((source / "manifest.json").read_text())
    manifest.pop(CHECKSUM)
    manifest["model"]["d_model"] *= 2
    (source / "manifest.json").write_text(json.dumps(with_checksum(manifest)))
    with pytest.raises(ParaxisError, match=r"is \(256, 64\) where the model tiny has "
                                           r"\(256, 128\): the source's model and its tensors"):
        convert(source, tmp_path / "out", Layout.parse("dp=1"))
    assert not (tmp_path / "out").exists()


def _tp_pieces(directory: Path, name: str) -> list[tuple[int, int, list[int]]]:
    """(tp_dim, tp_count, shape) of each parameter piece of `name` in a checkpoint."""
    pieces = json.loads((directory / "manifest.json").read_text())["pieces"]
    return sorted({(p["tp_dim"], p["tp_count"], tuple(p["shape"])) for p in pieces
                   if p["kind"] == "param" and p["name"] == name})


def test_a_moe_checkpoint_converts_to_split_experts_and_back(tmp_path):
    # etp=2 cuts every routed expert's matrices over tp as the dense MLP's (up and gate by
    # rows, down by columns), etp=1 under tp keeps them whole: conversion between the two
    # and back to one device moves the same tensors
    run_training(RunConfig.from_flags(model="tiny-moe", steps=1, global_batch=4, seq_len=32,
                                      quiet=True, checkpoint_dir=str(tmp_path / "a")))
    source = tmp_path / "a" / "step-00000001"
    split = convert(source, tmp_path / "split", Layout.parse("tp=2,etp=2"))
    whole = convert(split, tmp_path / "whole", Layout.parse("tp=2"))
    back = convert(whole, tmp_path / "one", Layout.parse("dp=1"))
    for converted in (split, whole, back):
        _assert_same_tensors(_full(source), _full(converted))
    up, down = "blocks.1.moe.experts.3.up.weight", "blocks.1.moe.experts.3.down.weight"
    (_, _, (rows, cols)), = _tp_pieces(source, up)
    assert _tp_pieces(split, up) == [(0, 2, (rows, cols))]  # the full shape, cut on dim 0
    assert _tp_pieces(split, down)[0][:2] == (1, 2)
    assert _tp_pieces(whole, up) == [(None, 1, (rows, cols))]


def test_a_requeued_run_that_had_finished_exits_0(tmp_path, capsys):
    # a stop signal that comes as the run ends leaves a final checkpoint at --steps; the
    # scheduler's requeue (--resume auto) finds the run complete: exit 0, one line, nothing
    # trained or written
    _train_one_device(tmp_path / "run", steps=2)
    before = sorted(p.name for p in (tmp_path / "run").iterdir())
    argv = ["train", "--model", "tiny", "--steps", "2", "--seq-len", "32", "--global-batch",
            "8", "--quiet", "--device", "cpu", "--checkpoint-dir", str(tmp_path / "run"),
            "--resume", "auto"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "is at step 2 of --steps 2: the run is complete, nothing to train" in err
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == before
    # the same folder asked for by another run (another batch) is not that run's end
    assert main([*argv[:8], "4", *argv[9:]]) == 2
    assert "is complete, but for another run: --global-batch 4 (checkpoint: 8)" in \
        capsys.readouterr().err
