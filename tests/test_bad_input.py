"""The bad-input catalogue: each row is a real command with one thing wrong.

Every row must give exactly one line on stderr (`paraxis: error: ...`) naming the problem and
a fix, a non-zero exit code, no traceback, and leave every file in its folder as it was. Rows
marked SUB run `python -m paraxis` in a subprocess (what proves "no traceback, non-zero exit"
end to end): in each catalogue, at least one row of every command it runs that way, and the
rows whose error a launched rank finds; the rest call `paraxis.cli.main` in-process, the same
code without the start-up (most of it importing torch, ~1.5 s a row). The checkpoint rows
resume from copies of one real checkpoint, each damaged in one way.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from paraxis.cli import main

ROOT = Path(__file__).resolve().parents[1]
SUB = True  # run in a subprocess
TRAIN = ["train", "--steps", "1", "--quiet", "--seq-len", "32", "--global-batch", "4",
         "--device", "cpu"]

# (id, argv, what the message says, the fix it suggests, subprocess?)
GOOD = "ckpt/step-00000001"
ROWS: list[tuple[str, list[str], str, str, bool]] = [
    # --- checkpoints
    ("resume-missing", [*TRAIN, "--resume", "nowhere"], "checkpoint nowhere does not exist",
     "give a step-N directory", False),
    ("resume-truncated-shard", [*TRAIN, "--steps", "2", "--resume", "truncated"],
     "rank-00000.safetensors is corrupt or truncated", "use an earlier checkpoint", SUB),
    ("resume-corrupt-shard", [*TRAIN, "--steps", "2", "--resume", "corrupt"],
     "rank-00000.safetensors is corrupt or truncated", "use an earlier checkpoint", False),
    ("resume-newer-format", [*TRAIN, "--steps", "2", "--resume", "newer"],
     "format version 99, newer than this paraxis reads", "upgrade paraxis", False),
    ("resume-other-model", [*TRAIN, "--steps", "2", "--model", "tiny-llama", "--resume", GOOD],
     "holds a different model", "--model set to the checkpoint's model", False),
    ("resume-escaping-manifest", [*TRAIN, "--steps", "2", "--resume", "escaping"],
     "outside the checkpoint directory", "refusing to read it", False),
    ("resume-unfinished-save", [*TRAIN, "--steps", "2", "--resume", "ckpt/step-00000002.tmp"],
     "is a save that never finished", "give a complete step-N directory", False),
    ("resume-at-last-step", [*TRAIN, "--resume", GOOD], "is at step 1, not before --steps 1",
     "raise --steps", False),
    ("resume-and-init-from", [*TRAIN, "--resume", GOOD, "--init-from", GOOD], "not both",
     "give --resume", False),
    ("restarts-without-checkpoints", [*TRAIN, "--max-restarts", "2"],
     "--max-restarts needs --checkpoint-dir", "resumes from", False),
    ("convert-impossible-layout", ["checkpoint", "convert", GOOD, "out", "--layout", "tp=3"],
     "not divisible by tp=3", "choose tp among 1, 2, 4", SUB),
    ("info-not-a-checkpoint", ["checkpoint", "info", "a_folder"], "no complete checkpoint",
     "step-N", False),
    # --- the command line itself
    ("not-an-int", [*TRAIN, "--steps", "abc"], "invalid int value: 'abc'", "--help", SUB),
    ("unknown-command", ["trian"], "invalid choice: 'trian'", "choose from", SUB),
    ("unknown-flag", [*TRAIN, "--stepz", "3"], "unrecognized arguments: --stepz", "--help",
     False),
    ("zero-stage-5", [*TRAIN, "--zero", "5"], "invalid choice: 5", "choose from 0, 1, 2, 3",
     False),
    ("on-nan-ignore", [*TRAIN, "--on-nan", "ignore"], "invalid choice: 'ignore'",
     "choose from 'stop', 'skip'", False),
    ("missing-required", ["memory"], "the following arguments are required: --params",
     "--help", SUB),
    # --- out-of-range hyperparameters
    ("steps-0", [*TRAIN, "--steps", "0"], "--steps 0 must be at least 1", "at least 1", False),
    ("lr-negative", [*TRAIN, "--lr", "-1"], "--lr -1.0", "must be a positive number", False),
    ("lr-nan", [*TRAIN, "--lr", "nan"], "--lr nan", "must be a positive number", False),
    ("lr-overflows", [*TRAIN, "--lr", "1e38"], "overflows fp32", "typical values", False),
    ("grad-clip-negative", [*TRAIN, "--grad-clip", "-1"], "--grad-clip -1.0",
     "0 turns it off", False),
    ("warmup-negative", [*TRAIN, "--warmup", "-5"], "--warmup -5", "must be >= 0", False),
    ("adam-beta2-one", [*TRAIN, "--adam-beta2", "1"], "--adam-beta2 1.0", "must be in [0, 1)",
     False),
    ("experts-too-big", ["experts", "--model", "deepseek-v3-style"], "fp32 weights",
     "route a smaller model", False),
    ("states-exceed-memory", [*TRAIN, "--model", "llama2-70b"], "GB of model states per rank",
     "shard them over more ranks", False),
    ("accum-vs-microbatches", [*TRAIN, "--grad-accum", "2", "--microbatches", "4"],
     "--grad-accum 2 and --microbatches 4", "give one of them", False),
    ("adam-eps-zero", [*TRAIN, "--adam-eps", "0"], "--adam-eps 0.0", "small positive", False),
    ("seq-len-over-context", [*TRAIN, "--seq-len", "4096"], "over tiny's context",
     "use --seq-len 128 or less", False),
    ("global-batch-0", [*TRAIN, "--global-batch", "0"], "--global-batch 0",
     "must be at least 1", False),
    ("log-every-0", [*TRAIN, "--log-every", "0"], "--log-every 0", "must be at least 1",
     False),
    ("weight-decay-negative", [*TRAIN, "--weight-decay", "-1"], "--weight-decay -1.0",
     "0 turns it off", False),
    ("bucket-0", [*TRAIN, "--bucket-mb", "0"], "--bucket-mb 0.0", "DDP uses 25", False),
    # below a byte: once "bucket size 0 bytes must be positive", naming no flag, after the
    # ranks had started
    ("bucket-under-a-byte", [*TRAIN, "--bucket-mb", "1e-7"], "--bucket-mb 1e-07",
     "a byte", False),
    ("timeout-0", [*TRAIN, "--timeout-s", "0"], "--timeout-s 0.0",
     "positive number of seconds", False),
    ("precision-fp4", [*TRAIN, "--precision", "fp4"], "--precision fp4 is unknown",
     "use fp32, bf16, bf16-fp32grad, fp16", False),
    ("dtype-is-precision", [*TRAIN, "--dtype", "bf16"], "with --precision, not --dtype",
     "use --precision bf16", False),
    ("device-tpu", [*TRAIN, "--device", "tpu"], "unknown device 'tpu'",
     "use auto, cpu or cuda", False),
    ("nproc-0", [*TRAIN, "--nproc", "0"], "--nproc 0", "must be at least 1", False),
    ("nproc-2-dp-1", [*TRAIN, "--nproc", "2", "--dp", "1"], "--nproc 2 starts 2 ranks",
     "leave them out for dp=2", False),
    ("metrics-file-is-folder", [*TRAIN, "--metrics-file", "a_folder"], "is a folder",
     "give a file name inside it", False),
    ("metrics-file-unwritable", [*TRAIN, "--metrics-file", "a_file.txt/m.jsonl"],
     "cannot be written", "choose another path", False),
    ("memory-params-negative", ["memory", "--params", "-5"], "--params -5",
     "must be at least 1", SUB),
    ("plan-no-gpus", ["plan", "--model", "tiny", "--gpus", "0"], "--gpus 0",
     "need at least one GPU", SUB),
    ("memory-no-gpus", ["memory", "--params", "7e9", "--gpus", "0"], "--gpus 0",
     "give 1 to", SUB),
    ("ring-0-ranks", ["ring", "--ranks", "0"], "--ranks 0", "must be at least 1", SUB),
    ("demo-0-steps", ["demo", "--steps", "0"], "--steps 0", "must be at least 1", False),
    # --- unknown presets, model files
    ("unknown-model", [*TRAIN, "--model", "gpt5"], "unknown model 'gpt5'", "choose a preset",
     False),
    ("plan-unknown-model", ["plan", "--model", "gpt5"], "unknown model 'gpt5'",
     "choose a preset", SUB),
    ("plan-unknown-gpu", ["plan", "--model", "tiny", "--gpu", "h900"], "unknown GPU 'h900'",
     "choose one of", SUB),
    ("model-file-missing", [*TRAIN, "--model", "missing.json"], "does not exist",
     "give a preset name", False),
    ("model-file-not-json", [*TRAIN, "--model", "broken.json"], "is not valid json",
     "fix the file", False),
    ("model-heads-do-not-divide", [*TRAIN, "--model", "odd_heads.toml"],
     "d_model 60 is not divisible by n_heads 7", "choose n_heads dividing d_model", False),
    ("model-unknown-key", [*TRAIN, "--model", "extra_key.json"], "unknown key(s) n_expertz",
     "known keys are", False),
    ("model-rope-theta-negative", [*TRAIN, "--model", "rope.json"],
     "rope_theta=-1.0 must be a positive number", "the default is 10000.0", False),
    # --- run files (TOML configs)
    ("config-missing", [*TRAIN, "--config", "missing.toml"], "does not exist",
     "examples/ holds run files", False),
    ("config-not-toml", [*TRAIN, "--config", "broken.toml"], "is not valid TOML",
     "fix that line", SUB),
    ("config-unknown-section", [*TRAIN, "--config", "section.toml"],
     "unknown section [trian]", "known: model, data, train", False),
    ("config-unknown-key", [*TRAIN, "--config", "key.toml"], "unknown key 'stepz' in [train]",
     "known: steps", False),
    ("config-wrong-type", ["train", "--quiet", "--config", "types.toml"],
     "[train] steps = 'ten' must be of type int", "write e.g. steps = 100", False),
    ("config-ratio-out-of-range", [*TRAIN, "--config", "ratio.toml"],
     "ratio.toml: [optimizer] min_lr_ratio = 2.0",
     "must be between 0 and 1", False),
    ("config-unknown-layout-key", [*TRAIN, "--config", "layout_key.toml"],
     "unknown [layout] key(s) dpp", "known: dp", False),
    # --- impossible layouts, divisibility
    ("layout-needs-ranks", [*TRAIN, "--tp", "2"], "= 2 ranks but this is one process",
     "add --nproc 2", False),
    ("tp-does-not-divide-heads", [*TRAIN, "--nproc", "3", "--tp", "3"],
     "4 attention heads are not divisible by tp=3", "choose tp among 1, 2, 4", False),
    ("more-stages-than-layers", [*TRAIN, "--nproc", "8", "--pp", "8"],
     "4 layers cannot fill", "use pp*virtual_stages <= 4", False),
    ("world-mismatch", [*TRAIN, "--nproc", "2", "--dp", "4"], "the world has 2 ranks",
     "choose degrees whose product is 2", False),
    ("layout-unknown-key", [*TRAIN, "--layout", "dp=2,xx=3"], "cannot read layout item 'xx=3'",
     "write key=value", False),
    ("layout-not-int", [*TRAIN, "--layout", "dp=two"], "layout dp='two'",
     "must be an integer", False),
    ("schedule-unknown", [*TRAIN, "--schedule", "zigzag"], "unknown schedule 'zigzag'",
     "use one of gpipe, 1f1b, interleaved", False),
    ("recompute-unknown", [*TRAIN, "--recompute", "most"], "unknown recompute 'most'",
     "use one of none, selective, full", False),
    ("virtual-without-interleaved", [*TRAIN, "--virtual-stages", "2"],
     "needs schedule=interleaved", "set the schedule", False),
    ("sp-without-tp", [*TRAIN, "--sequence-parallel"], "needs tp > 1", "raise tp", False),
    ("zero3-reshard", [*TRAIN, "--layout", "dp=1,zero3_reshard=never"],
     "unknown zero3_reshard 'never'", "use one of forward, step", False),
    ("interleaved-microbatches", [*TRAIN, "--nproc", "2", "--layout",
     "pp=2,schedule=interleaved,virtual_stages=2,microbatches=3"],
     "microbatches (3) to be a multiple of pp (2)", "use microbatches=4", False),
    ("batch-not-divisible", [*TRAIN, "--global-batch", "10", "--grad-accum", "4"],
     "not divisible by dp*microbatches", "a multiple of 4", False),
    ("grad-accum-0", [*TRAIN, "--grad-accum", "0"], "--grad-accum 0", "must be at least 1",
     False),
    ("schedule-0-stages", ["schedule", "--stages", "0"], "stages=0",
     "must be a positive integer", SUB),
    # --- data files
    ("data-missing", [*TRAIN, "--data", "missing.bin"], "does not exist",
     "give an existing .bin token file", False),
    ("data-missing-nproc", [*TRAIN, "--nproc", "2", "--data", "missing.bin"],
     "does not exist", "give an existing .bin token file", SUB),
    ("data-empty-bin", [*TRAIN, "--data", "empty.bin"], "is empty",
     "give a token file that holds tokens", False),
    ("data-empty-text", [*TRAIN, "--data", "empty.txt"], "has 0 tokens",
     "give more data or a shorter --seq-len", False),
    ("data-odd-size", [*TRAIN, "--data", "odd.bin"], "has 3 bytes",
     "check --data-dtype", False),
    ("data-dtype-unknown", [*TRAIN, "--data", "tokens_u16.bin", "--data-dtype", "int7"],
     "token dtype 'int7' is unknown", "use one of uint8, uint16, uint32", False),
    ("data-wrong-dtype", [*TRAIN, "--data", "tokens_u16.bin", "--data-dtype", "uint32"],
     "holds token id", "check --data-dtype", False),
    ("data-ids-over-vocab", [*TRAIN, "--data", "big_ids.bin"], "holds token id 300",
     "check --data-dtype or --tokenizer", False),
    ("data-folder-without-text", [*TRAIN, "--data", "a_folder"], "holds no .txt/.md/.py",
     "put text files in it", False),
    ("data-too-short", [*TRAIN, "--data", "tiny.txt"], "too few for seq_len 32: it needs",
     "give more data or a shorter --seq-len", False),
]


def make_inputs(folder: Path) -> None:
    """The files the rows point at, each wrong in one way."""
    (folder / "a_folder").mkdir()
    (folder / "a_folder" / "notes.bin").write_bytes(b"\x00\x01")
    (folder / "a_file.txt").write_text("not a folder\n")
    (folder / "broken.json").write_text('{"name": "m", "style": "gpt2"')
    (folder / "odd_heads.toml").write_text(
        'name = "m"\nstyle = "gpt2"\nvocab_size = 256\nn_layers = 2\nd_model = 60\n'
        "n_heads = 7\nn_kv_heads = 7\nd_ff = 128\nmax_seq_len = 64\n")
    (folder / "extra_key.json").write_text(
        '{"name": "m", "style": "gpt2", "vocab_size": 256, "n_layers": 2, "d_model": 64, '
        '"n_heads": 4, "n_kv_heads": 4, "d_ff": 128, "max_seq_len": 64, "n_expertz": 8}')
    (folder / "rope.json").write_text(
        '{"name": "m", "style": "llama", "vocab_size": 256, "n_layers": 2, "d_model": 64, '
        '"n_heads": 4, "n_kv_heads": 4, "d_ff": 128, "max_seq_len": 64, "rope_theta": -1.0}')
    (folder / "broken.toml").write_text("[train\nsteps = 1\n")
    (folder / "section.toml").write_text("[trian]\nsteps = 1\n")
    (folder / "key.toml").write_text("[train]\nstepz = 1\n")
    (folder / "types.toml").write_text('[train]\nsteps = "ten"\n')
    (folder / "ratio.toml").write_text("[optimizer]\nmin_lr_ratio = 2.0\n")
    (folder / "layout_key.toml").write_text("[layout]\ndpp = 2\n")
    (folder / "empty.bin").write_bytes(b"")
    (folder / "empty.txt").write_bytes(b"")
    (folder / "odd.bin").write_bytes(b"abc")
    (folder / "tiny.txt").write_text("x")
    (np.arange(6000) % 200).astype(np.uint16).tofile(folder / "tokens_u16.bin")
    np.array([1, 2, 300] * 2000, dtype=np.uint16).tofile(folder / "big_ids.bin")
    make_checkpoints(folder)


def make_checkpoints(folder: Path) -> None:
    """One real checkpoint (tiny model, one step), and copies damaged one way each."""
    import json
    import shutil

    from paraxis.train.config import RunConfig
    from paraxis.train.loop import run_training

    run_training(RunConfig.from_flags(model="tiny", steps=1, global_batch=4, seq_len=32,
                                      quiet=True, device="cpu",
                                      checkpoint_dir=str(folder / "ckpt")))
    good = folder / GOOD
    shutil.copytree(good, folder / "ckpt" / "step-00000002.tmp")
    (folder / "ckpt" / "step-00000002.tmp" / "manifest.json").unlink()
    for name in ("truncated", "corrupt", "newer", "escaping"):
        shutil.copytree(good, folder / name / good.name)
    shard = "rank-00000.safetensors"
    data = (good / shard).read_bytes()
    (folder / "truncated" / good.name / shard).write_bytes(data[:len(data) // 2])
    flipped = bytearray(data)
    flipped[-3] ^= 0xFF
    (folder / "corrupt" / good.name / shard).write_bytes(bytes(flipped))
    for name, change in (("newer", {"version": 99}),
                         ("escaping", {"files": {"../../etc/passwd": {"sha256": "0",
                                                                      "bytes": 1}}})):
        path = folder / name / good.name / "manifest.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), **change}))


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file and folder under `folder`: (size, mtime in ns)."""
    out = {}
    for path in sorted(folder.rglob("*")):
        stat = path.stat()
        out[str(path.relative_to(folder))] = (stat.st_size if path.is_file() else -1,
                                              stat.st_mtime_ns)
    return out


def run_row(argv: list[str], folder: Path, subprocess_run: bool) -> tuple[int, str]:
    if subprocess_run:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        result = subprocess.run([sys.executable, "-m", "paraxis", *argv], cwd=folder, env=env,
                                capture_output=True, text=True, timeout=120)
        return result.returncode, result.stderr
    err = io.StringIO()
    with contextlib.chdir(folder), contextlib.redirect_stderr(err), \
            contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exit_:  # argparse's errors exit
            code = exit_.code
    return code, err.getvalue()


def test_the_catalogue_has_at_least_30_rows():
    assert len(ROWS) >= 30
    assert len({row[0] for row in ROWS}) == len(ROWS)
    assert sum(row[4] for row in ROWS) >= 12  # a representative share end to end


def catalogue(rows: list[tuple], make: Callable[[Path], None], name: str,
              **check: Any) -> tuple[Callable, Callable]:
    """A catalogue file's `inputs` fixture (its files, made once) and its test, a case for
    each row (name, argv, message, hint, in_subprocess): `check_row` with `check`."""
    launched: dict[tuple[str, ...], tuple[int, str, bool]] = {}

    @pytest.fixture(scope="module")
    def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
        folder = tmp_path_factory.mktemp(name)
        make(folder)
        return folder

    @pytest.mark.parametrize("argv,message,hint,in_subprocess",
                             [row[1:] for row in rows], ids=[row[0] for row in rows])
    def test_bad_input_is_one_line_with_a_hint(inputs, argv, message, hint, in_subprocess):
        if in_subprocess and not launched:
            launched.update(launch_all([row[1] for row in rows if row[4]], inputs))
        check_row(inputs, argv, message, hint, in_subprocess,
                  launched=launched.get(tuple(argv)) if in_subprocess else None, **check)

    return inputs, test_bad_input_is_one_line_with_a_hint


def launch_all(commands: list[list[str]], folder: Path
               ) -> dict[tuple[str, ...], tuple[int, str, bool]]:
    """Each command's (exit code, stderr, whether `folder` was unchanged after all of them),
    run as `python -m paraxis` two at a time: a process's start-up (importing torch) is most
    of its time and takes one core, so two cores run two."""
    before = snapshot(folder)
    # runs on several ranks (a launcher and its ranks each start up) take longest: first
    commands = sorted(commands, key=lambda argv: "--nproc" not in argv)
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda argv: run_row(argv, folder, True), commands))
    unchanged = snapshot(folder) == before
    return {tuple(argv): (code, stderr, unchanged)
            for argv, (code, stderr) in zip(commands, results, strict=True)}


inputs, test_bad_input_is_one_line_with_a_hint = catalogue(ROWS, make_inputs, "bad_inputs")


def check_row(folder: Path, argv: list[str], message: str, hint: str, in_subprocess: bool,
              exit_code: int | None = None,
              launched: tuple[int, str, bool] | None = None) -> None:
    """A catalogue row holds: one line `paraxis: error: ...` naming `message` and `hint`,
    exit code `exit_code` (None: any non-zero), no traceback, nothing on disk changed.
    `launched`: the row already run (`launch_all`), its exit code, stderr and whether the
    folder was unchanged after it and the rows run beside it."""
    before = snapshot(folder)
    if launched is None:
        code, stderr = run_row(argv, folder, in_subprocess)
    else:
        code, stderr, unchanged = launched
        assert unchanged, "a failed command (this row or one run beside it) changed files on disk"
    lines = stderr.strip().splitlines()
    if exit_code is None:
        assert code not in (0, None), stderr
    else:
        assert code == exit_code, stderr
    assert "Traceback" not in stderr
    assert len(lines) == 1 and lines[0].startswith("paraxis: error: "), stderr
    assert message in lines[0] and hint in lines[0], lines[0]
    assert snapshot(folder) == before, "a failed command changed files on disk"


def test_debug_shows_the_traceback(inputs):
    code, stderr = run_row(["--debug", *TRAIN, "--model", "gpt5"], inputs, SUB)
    assert code == 2
    assert "Traceback" in stderr and "paraxis: error: unknown model 'gpt5'" in stderr


def test_more_ranks_than_cores_is_a_one_line_warning(tmp_path):
    """Pinned to one core, a 2-rank run warns once and still trains."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    core = sorted(os.sched_getaffinity(0))[0]
    result = subprocess.run(
        [sys.executable, "-m", "paraxis", *TRAIN, "--nproc", "2", "--steps", "1"], cwd=tmp_path,
        env=env, capture_output=True, text=True, timeout=180,
        preexec_fn=lambda: os.sched_setaffinity(0, {core}))
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert lines == ["paraxis: warning: 2 ranks on 1 CPU core: they will share cores and every "
                     "step will be slower; for speed use --nproc 1"], result.stderr


def test_the_tp_advice_offers_only_degrees_that_run(inputs):
    # tiny-llama's 2 kv heads rule out tp=4 as well as tp=3: the advice says 1, 2, not 1, 2, 4
    code, stderr = run_row(["checkpoint", "convert", GOOD, "out", "--layout", "tp=3"], inputs,
                           False)
    assert code == 2 and stderr.strip().endswith("choose tp among 1, 2, 4")  # tiny: 4 kv heads
    code, stderr = run_row([*TRAIN, "--model", "tiny-llama", "--nproc", "3", "--tp", "3"], inputs,
                           False)
    assert code == 2 and stderr.strip().endswith("choose tp among 1, 2"), stderr
