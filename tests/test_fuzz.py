"""Fuzzing the front door: hundreds of generated bad inputs (flags, run files, model files,
manifests, token files) thrown at `paraxis train/plan/memory/checkpoint/generate` through
`paraxis.cli.main`, and a share of them as real subprocesses. Each must end in exactly one
line `paraxis: error: ...`, exit code 2, no traceback, and leave the folder as it was.

Every input is built to be wrong in one known way (a value out of range, a wrong type, a
damaged field), so exit code 2 is the only right answer; the generator is seeded, and a
failure names the input (rerun with that seed to see it again).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from paraxis.data.corpus import TokenData
from paraxis.train.config import RunConfig
from paraxis.train.loop import run_training
from tests.test_bad_input import run_row, snapshot

ROOT = Path(__file__).resolve().parents[1]
SEED = 25
TRAIN = ["train", "--steps", "2", "--quiet", "--seq-len", "32", "--global-batch", "4",
         "--device", "cpu"]
GOOD_CKPT = "ckpt/step-00000001"
NAN, INF = "nan", "inf"
# The folder is compared with its first state after every BATCH inputs, not after each: a
# change (a file written, or created and removed again: its folder's mtime moves) still
# shows, and the message lists the batch (rerun it one by one to see which). Snapshots of a
# few hundred files after each of 500+ inputs cost a third of the test.
BATCH = 25

# Flags of `paraxis train` and values each must refuse.
TRAIN_BAD = {
    "--steps": ["0", "-1", "x", "1.5", ""], "--global-batch": ["0", "-4", "two"],
    "--seq-len": ["0", "-1", "100000"], "--lr": ["0", "-1", NAN, INF, "1e39"],
    "--grad-clip": ["-1", NAN, INF], "--warmup": ["-1", "x"], "--weight-decay": ["-0.1", NAN],
    "--seed": ["-1", "-99", "0.5"], "--timeout-s": ["0", "-1", INF, NAN],
    "--bucket-mb": ["0", "-1", NAN], "--log-every": ["0", "-1"], "--eval-batches": ["0"],
    "--eval-every": ["-1"], "--checkpoint-every": ["-1"], "--keep": ["-1"],
    "--exit-after": ["0", "1"], "--peak-tflops": ["0", "-5", INF, NAN], "--nproc": ["0", "-2"],
    "--max-restarts": ["-1", "1"], "--zero": ["5", "-1"], "--tp": ["3", "0"], "--pp": ["0", "7"],
    "--microbatches": ["0", "-2"], "--precision": ["fp4", "FP32", ""], "--device": ["tpu", ""],
    "--on-nan": ["ignore"], "--schedule": ["zigzag"], "--recompute": ["most"],
    "--layout": ["dp=1,dp=1", "dp=two", "xx=3", "pp=1,schedule=interleaved", "dp=0", "=",
                 "tp=2,tp=2"], "--virtual-stages": ["2", "0"],
    "--data": ["missing.bin", "nowhere/"],
    "--data-dtype": ["int7", "float32"], "--model": ["gpt5", "missing.json", ""],
    "--resume": ["nowhere", "a_file.txt"], "--init-from": ["nowhere"],
    "--metrics-file": ["a_folder", "a_file.txt/m.jsonl"],
    "--checkpoint-dir": ["a_file.txt", "a_file.txt/ck"], "--tensorboard": ["a_file.txt/tb"],
    "--config": ["missing.toml", "a_file.txt"], "--grad-accum": ["0", "-1"],
}
# Valid flags mixed in, so that a bad value is found whatever surrounds it.
TRAIN_GOOD = [["--lr", "0.001"], ["--warmup", "0"], ["--seed", "3"], ["--zero", "1"],
              ["--log-every", "1"], ["--eval-every", "0"], ["--timeout-s", "60"],
              ["--model", "tiny-llama"], ["--precision", "bf16"], ["--grad-clip", "0.5"]]
PLAN_BAD = {
    "--gpus": ["0", "-8"], "--gpus-per-node": ["0", "-4"], "--seq-len": ["0", "-1", "100000"],
    "--memory-gb": ["0", "-1", NAN, INF], "--network-gbps": ["0", "-1", NAN],
    "--nvlink-gbps": ["-1", INF], "--global-batch": ["0", "-16"], "--top": ["0"],
    "--model": ["gpt5", "missing.json"], "--gpu": ["h900"], "--precision": ["fp4"],
}
MEMORY_BAD = {"--params": ["0", "-1", INF, NAN, "1e30", "x"], "--gpus": ["0", "-1"]}

# Model files: a good description, then one thing wrong.
MODEL = {"name": "m", "style": "llama", "vocab_size": 256, "n_layers": 2, "d_model": 64,
         "n_heads": 4, "n_kv_heads": 2, "d_ff": 128, "max_seq_len": 64}
MODEL_BAD_VALUES = {"vocab_size": [0, -1, True, "256", 2.5, None], "n_layers": [True, 0, "2"],
                    "d_model": [60, 0, 63.0, "64"], "n_heads": [3, 0, False],
                    "n_kv_heads": [3, 5, "2"], "d_ff": [0, -128, [128]],
                    "max_seq_len": [0, "64"], "norm_eps": ["1e-5", None, True, [1]],
                    "rope_theta": ["1e4", False], "style": ["bert", 2, None],
                    "name": [7, None], "n_expertz": [8], "n_experts": [-1, "8"],
                    "top_k": [2]}
# Run files: a section and key, and a value of the wrong type or outside its range.
RUN_FILE_BAD = [("train", "steps", '"ten"'), ("train", "steps", "1.5"),
                ("train", "steps", "true"), ("train", "compile", '"yes"'),
                ("train", "seq_len", "[32]"), ("optimizer", "lr", '"0.1"'),
                ("optimizer", "min_lr_ratio", "2.0"), ("train", "stepz", "3"),
                ("trian", "steps", "3"), ("layout", "dpp", "2"), ("layout", "zero", "7"),
                ("logging", "quiet", "1"), ("checkpoint", "keep", "-1"),
                ("train", "timeout_s", "0"), ("model", "name", "5"),
                ("train", "seed", "-3"), ("optimizer", "grad_clip", "nan")]
RUN_FILE_BROKEN = ["[train\nsteps = 1\n", "steps = = 1\n", '[train]\nsteps = "1\n',
                   "[train]\nsteps = 1\nsteps = 2\n", "\x00\x01", "[[train]]\nsteps = 1\n"]


def _manifest_damages() -> list[tuple[str, object]]:
    """(what, how): each changes one field of a good manifest."""
    def piece(**change: object) -> object:
        return lambda m: m["pieces"][0].update(change)

    def drop(key: str) -> object:
        return lambda m: m.pop(key)

    return [("no-step", drop("step")), ("no-files", drop("files")),
            ("no-pieces", drop("pieces")), ("no-model", drop("model")),
            ("no-layout", drop("layout")), ("no-world", drop("world_size")),
            ("step-negative", lambda m: m.update(step=-3)),
            ("step-string", lambda m: m.update(step="10")),
            ("world-0", lambda m: m.update(world_size=0)),
            ("version-99", lambda m: m.update(version=99)),
            ("format", lambda m: m.update(format="other")),
            ("files-list", lambda m: m.update(files=[])),
            ("pieces-dict", lambda m: m.update(pieces={})),
            ("tp-index", piece(tp_index=5)), ("tp-index-neg", piece(tp_index=-1)),
            ("tp-count-0", piece(tp_count=0)), ("tp-dim", piece(tp_count=2, tp_dim=7)),
            ("shape-0", piece(shape=[0, 64])), ("shape-str", piece(shape="256x64")),
            ("smaller", piece(shape=[128, 64])), ("lo-neg", piece(lo=-5)),
            ("hi-big", piece(hi=10**9)), ("lo-after-hi", piece(lo=100, hi=10)),
            ("file-unlisted", piece(file="rank-00009.safetensors")),
            ("no-kind", lambda m: m["pieces"][0].pop("kind")),
            ("key-int", piece(key=3)), ("escape", lambda m: m["files"].update(
                {"../x": {"sha256": "0", "bytes": 1}})),
            ("bytes-wrong", lambda m: next(iter(m["files"].values())).update(bytes=1)),
            ("sha-wrong", lambda m: next(iter(m["files"].values())).update(sha256="0" * 64)),
            ("model-list", lambda m: m.update(model=[1])),
            ("model-bool-layers", lambda m: m["model"].update(n_layers=True)),
            ("manifest-list", None), ("manifest-not-json", None)]


def make_inputs(folder: Path) -> list[str]:
    """The files the inputs point at; returns the damaged checkpoints' names."""
    (folder / "a_folder").mkdir()
    (folder / "a_file.txt").write_text("not a folder\n")
    run_training(RunConfig.from_flags(model="tiny", steps=1, global_batch=4, seq_len=32,
                                      quiet=True, device="cpu",
                                      checkpoint_dir=str(folder / "ckpt")))
    good = folder / GOOD_CKPT
    names = []
    for what, damage in _manifest_damages():
        target = folder / f"m-{what}" / good.name
        shutil.copytree(good, target)
        path = target / "manifest.json"
        manifest = json.loads(path.read_text())
        if what == "manifest-list":
            path.write_text(json.dumps([manifest]))
        elif what == "manifest-not-json":
            path.write_text(path.read_text()[:100])
        else:
            damage(manifest)
            path.write_text(json.dumps(manifest))
        names.append(f"m-{what}")
    return names


def _bad_tokens(chooser: random.Random, folder: Path, index: int) -> list[str]:
    """A token file wrong in one way, and the flags that read it."""
    name = f"tokens-{index}.bin"
    kind = chooser.choice(["empty", "odd", "over-vocab", "short", "wrong-dtype"])
    path = folder / name
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "odd":
        path.write_bytes(bytes(2 * chooser.randint(100, 5000) + 1))
    elif kind == "over-vocab":
        tokens = (np.arange(chooser.randint(5000, 300_000)) % 200).astype(np.uint16)
        tokens[chooser.randrange(len(tokens))] = chooser.randint(256, 65535)
        tokens.tofile(path)
    elif kind == "short":  # fewer than TRAIN's seq_len 32 needs (its runs do not evaluate)
        needed = TokenData(np.zeros(1, dtype=np.uint16)).tokens_needed(32, held_out=False)
        np.arange(chooser.randint(1, needed - 1), dtype=np.uint16).tofile(path)
    else:  # uint16 ids read as uint32 make ids far beyond a 256-token vocabulary
        (np.arange(6000) % 200 + 1).astype(np.uint16).tofile(path)
        return ["--data", name, "--data-dtype", "uint32"]
    return ["--data", name]


def generate_inputs(chooser: random.Random, folder: Path, damaged: list[str]
                    ) -> list[list[str]]:
    """At least 500 command lines, each wrong in one way (files are written into `folder`
    here, before the snapshot each run is compared with)."""
    inputs: list[list[str]] = []
    for _ in range(170):
        flag = chooser.choice(sorted(TRAIN_BAD))
        extra = chooser.choice(TRAIN_GOOD) if chooser.random() < 0.5 else []
        inputs.append([*TRAIN, *extra, flag, chooser.choice(TRAIN_BAD[flag])])
    for _ in range(60):
        flag = chooser.choice(sorted(PLAN_BAD))
        inputs.append(["plan", "--model", "tiny", flag, chooser.choice(PLAN_BAD[flag])])
    for _ in range(20):
        flag = chooser.choice(sorted(MEMORY_BAD))
        inputs.append(["memory", "--params", "7e9", flag, chooser.choice(MEMORY_BAD[flag])])
    for index in range(90):
        key = chooser.choice(sorted(MODEL_BAD_VALUES))
        text = json.dumps({**MODEL, key: chooser.choice(MODEL_BAD_VALUES[key])})
        if key == "top_k":
            text = json.dumps({**MODEL, "top_k": 2})  # top_k without experts
        if index % 9 == 0:
            text = text[:chooser.randint(1, len(text) - 1)]  # cut short: not JSON
        (folder / f"model-{index}.json").write_text(text)
        where = ["plan", "--model"] if index % 3 == 0 else [*TRAIN, "--model"]
        inputs.append([*where, f"model-{index}.json"])
    for index in range(70):
        if index % 5 == 0:
            text = chooser.choice(RUN_FILE_BROKEN)
        else:
            section, key, value = chooser.choice(RUN_FILE_BAD)
            text = f"[{section}]\n{key} = {value}\n"
        (folder / f"run-{index}.toml").write_text(text)
        inputs.append(["train", "--quiet", "--device", "cpu", "--config", f"run-{index}.toml"])
    for name in damaged:
        inputs.append(["checkpoint", "info", name])
        command = chooser.choice([["generate", "--device", "cpu", "--prompt", "a",
                                   "--checkpoint", name],
                                  [*TRAIN, "--steps", "3", "--resume", name]])
        inputs.append(command)
    for index in range(60):
        inputs.append([*TRAIN, *_bad_tokens(chooser, folder, index)])
    for bad in (["--temperature", "-1"], ["--temperature", "1e-45"], ["--top-k", "-1"],
                ["--max-new-tokens", "-1"], ["--max-new-tokens", "10000000"],
                ["--prompt", ""], ["--checkpoint", "nowhere"]):
        inputs.append(["generate", "--device", "cpu", "--checkpoint", GOOD_CKPT, "--prompt",
                       "a", *bad])
    for ranks in ("0", "-1", "17", "5000"):
        inputs.append(["ring", "--ranks", ranks])
    return inputs


def _problem(code: int | None, stderr: str) -> str | None:
    lines = stderr.strip().splitlines()
    if "Traceback" in stderr:
        return "a traceback"
    if code != 2:
        return f"exit code {code}"
    if len(lines) != 1 or not lines[0].startswith("paraxis: error: "):
        return f"{len(lines)} lines"
    return None


@pytest.mark.slow
def test_generated_bad_inputs_are_one_line_exit_2_and_change_nothing(tmp_path):
    started = time.monotonic()
    damaged = make_inputs(tmp_path)
    chooser = random.Random(SEED)
    inputs = generate_inputs(chooser, tmp_path, damaged)
    assert len(inputs) >= 500
    before = snapshot(tmp_path)
    failures = []
    for start in range(0, len(inputs), BATCH):
        batch = inputs[start:start + BATCH]
        for argv in batch:
            code, stderr = run_row(argv, tmp_path, False)
            problem = _problem(code, stderr)
            if problem:
                failures.append(f"{' '.join(argv)!r}: {problem}: {stderr.strip()[-300:]}")
        if snapshot(tmp_path) != before:  # a file or folder changed (folders' mtimes count)
            failures.append(f"one of {batch!r} changed files on disk")
            before = snapshot(tmp_path)
    # 20 of them end to end, as real processes (started together: start-up dominates)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    picked = chooser.sample(inputs, 20)
    processes = [subprocess.Popen([sys.executable, "-m", "paraxis", *argv], cwd=tmp_path,
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  text=True) for argv in picked]
    for argv, process in zip(picked, processes, strict=True):
        _, stderr = process.communicate(timeout=120)
        problem = _problem(process.returncode, stderr)
        if problem:
            failures.append(f"subprocess {' '.join(argv)!r}: {problem}: {stderr[-300:]}")
    assert snapshot(tmp_path) == before, "a failed command changed files on disk"
    assert not failures, f"seed {SEED}, {len(failures)} of {len(inputs)}:\n" + "\n".join(
        failures[:40])
    assert time.monotonic() - started < 180  # 90 s on an idle machine; CI is shared
