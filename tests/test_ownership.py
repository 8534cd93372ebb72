"""A checkpoint folder belongs to one run: another run is refused in one line unless it
resumes, pruning touches the run's own checkpoints only, a resume takes over the lock of a
dead or silent owner (saying so), and a resume must share the checkpoint's batch, sequence
length, seed and data (`files/checkpoint_ownership.py`, `train/claim.py`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from paraxis.files.checkpoint_ownership import LOCK_FILE, RUN_FILE
from paraxis.model.checkpoint import complete_checkpoints
from paraxis.model.checkpoint.save import prune
from paraxis.train.config import RunConfig
from paraxis.train.loop import run_training
from tests.test_bad_input import run_row, snapshot

ROOT = Path(__file__).resolve().parents[1]
ARGS = ["train", "--model", "tiny", "--global-batch", "4", "--seq-len", "32", "--quiet",
        "--device", "cpu", "--checkpoint-dir", "ck", "--checkpoint-every", "1", "--keep", "2"]


def _one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder `ck` holding run A's checkpoints of steps 2 and 3 (of 4)."""
    folder = tmp_path_factory.mktemp("owned")
    run_training(RunConfig.from_flags(model="tiny", steps=4, global_batch=4, seq_len=32,
                                      quiet=True, device="cpu", keep=2, checkpoint_every=1,
                                      exit_after=3, checkpoint_dir=str(folder / "ck")))
    return folder


@pytest.fixture
def folder(first_run: Path, tmp_path: Path) -> Path:
    shutil.copytree(first_run, tmp_path, dirs_exist_ok=True)
    return tmp_path


def _owner(folder: Path) -> str:
    return json.loads((folder / "ck" / RUN_FILE).read_text())["id"]


def test_a_fresh_run_is_refused_and_a_resume_continues_the_same_run(folder):
    run_id = _owner(folder)
    before = snapshot(folder)
    code, stderr = run_row([*ARGS, "--steps", "4"], folder, False)
    assert code == 2
    assert (f"checkpoint folder ck belongs to run {run_id}, newest step-3; continue that run "
            "with --resume auto") in _one_line(stderr)
    assert snapshot(folder) == before  # nothing deleted, nothing written
    code, stderr = run_row([*ARGS, "--steps", "4", "--resume", "auto"], folder, False)
    assert code == 0, stderr
    assert [s for s, _ in complete_checkpoints(folder / "ck")] == [3, 4]
    manifest = json.loads((folder / "ck" / "step-00000004" / "manifest.json").read_text())
    assert manifest["run"]["id"] == run_id == _owner(folder)
    assert not (folder / "ck" / LOCK_FILE).exists()  # released at the end


def test_a_folder_of_checkpoints_that_name_no_run_is_not_taken_either(folder):
    """Checkpoints an older paraxis wrote (no run.json): a fresh run is refused too, and a
    resume of them continues under a new id that the folder then records."""
    (folder / "ck" / RUN_FILE).unlink()
    code, stderr = run_row([*ARGS, "--steps", "4"], folder, False)
    assert code == 2 and ("checkpoint folder ck already holds checkpoints (step-2..3); continue "
                          "them with --resume auto") in _one_line(stderr)
    code, stderr = run_row([*ARGS, "--steps", "4", "--resume", "auto"], folder, False)
    assert code == 0, stderr
    assert (folder / "ck" / RUN_FILE).exists()


def test_pruning_touches_only_the_runs_own_checkpoints(tmp_path):
    for step, run in ((1, "a"), (2, "b"), (3, "a"), (5, None), (6, "a")):
        directory = tmp_path / f"step-{step:08d}"
        directory.mkdir()
        (directory / "manifest.json").write_text(json.dumps({"run": {"id": run}} if run else {}))
    prune(tmp_path, 1, "a")
    assert [s for s, _ in complete_checkpoints(tmp_path)] == [2, 5, 6]


def test_a_second_run_on_a_folder_in_use_is_refused_in_one_line(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.Popen([sys.executable, "-m", "paraxis", *ARGS, "--steps", "8"],
                             cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "ck" / LOCK_FILE).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        code, stderr = run_row([*ARGS, "--steps", "8"], tmp_path, False)
        assert code == 2
        line = _one_line(stderr)
        assert "checkpoint folder ck is in use by run " in line
        assert f"(pid {first.pid} on " in line and "give another --checkpoint-dir" in line
        code, stderr = run_row([*ARGS, "--steps", "8", "--resume", "auto"], tmp_path, False)
        assert code == 2 and "is in use by run" in _one_line(stderr)
    finally:
        _, first_stderr = first.communicate(timeout=170)
    assert first.returncode == 0, first_stderr
    assert [s for s, _ in complete_checkpoints(tmp_path / "ck")] == [7, 8]


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.mark.parametrize("state", ["dead", "silent"])
def test_a_resume_takes_over_the_lock_of_a_dead_or_silent_owner(folder, state):
    import socket

    pid, beat = (_dead_pid(), time.time()) if state == "dead" else (os.getpid(), 0.0)
    (folder / "ck" / LOCK_FILE).write_text(json.dumps({
        "run": _owner(folder), "token": "t", "host": socket.gethostname(), "pid": pid,
        "beat": beat}))
    code, stderr = run_row([*ARGS, "--steps", "4"], folder, False)
    assert code == 2 and "belongs to run" in _one_line(stderr)  # a fresh run: never
    code, stderr = run_row([*ARGS, "--steps", "4", "--resume", "auto"], folder, False)
    assert code == 0, stderr
    assert _one_line(stderr).startswith(f"paraxis: taking over checkpoint folder ck from "
                                        f"{state} run {_owner(folder)} (pid {pid} on ")
    assert [s for s, _ in complete_checkpoints(folder / "ck")] == [3, 4]


def test_a_live_owner_keeps_its_lock_against_a_resume(folder):
    import socket

    (folder / "ck" / LOCK_FILE).write_text(json.dumps({
        "run": _owner(folder), "token": "t", "host": socket.gethostname(),
        "pid": os.getpid(), "beat": time.time()}))
    code, stderr = run_row([*ARGS, "--steps", "4", "--resume", "auto"], folder, False)
    assert code == 2 and "is in use by run" in _one_line(stderr)
    # a fresh run is told the folder is in use, not to continue it with --resume auto
    code, stderr = run_row([*ARGS, "--steps", "4"], folder, False)
    line = _one_line(stderr)
    assert code == 2 and "is in use by run" in line and "--resume auto" not in line


def test_a_resume_with_other_batch_seed_or_data_says_which_and_needs_a_flag(folder):
    np.tile(np.arange(200, dtype=np.uint16), 100).tofile(folder / "other.bin")
    before = snapshot(folder)
    code, stderr = run_row([*ARGS, "--steps", "4", "--resume", "auto", "--global-batch", "8",
                            "--seed", "1", "--data", "other.bin"], folder, False)
    assert code == 2
    line = _one_line(stderr)
    assert ("with --global-batch 8 (checkpoint: 4), --seed 1 (checkpoint: 0), --data other.bin "
            "(20,000 tokens; checkpoint: embedded stdlib corpus, 4,000,000 tokens)") in line
    code, stderr = run_row([*ARGS, "--steps", "4", "--resume", "auto", "--seq-len", "16"],
                           folder, False)
    assert code == 2 and "with --seq-len 16 (checkpoint: 32)" in _one_line(stderr)
    assert "--allow-resume-changes" in line
    assert snapshot(folder) == before
    code, stderr = run_row([*ARGS, "--steps", "4", "--resume", "auto", "--seed", "1",
                            "--allow-resume-changes"], folder, False)
    assert code == 0, stderr
    assert "warning: resuming ck/step-00000003 with --seed 1 (checkpoint: 0)" in stderr


def test_the_same_run_checks_hold_without_a_checkpoint_folder_and_create_nothing(folder):
    """Resuming with no --checkpoint-dir (weights from a checkpoint, nothing saved) is still
    a resume: another batch is refused in one line, and a refused run creates no folder
    (not its TensorBoard one either)."""
    before = snapshot(folder)
    argv = [*ARGS[:ARGS.index("--checkpoint-dir")], "--steps", "4", "--resume",
            "ck/step-00000003", "--global-batch", "8", "--tensorboard", "tb"]
    code, stderr = run_row(argv, folder, False)
    assert code == 2 and "with --global-batch 8 (checkpoint: 4)" in _one_line(stderr)
    code, stderr = run_row([*ARGS, "--steps", "4", "--resume", "auto", "--seq-len", "16",
                            "--tensorboard", "tb"], folder, False)
    assert code == 2 and "--seq-len 16" in _one_line(stderr)
    assert snapshot(folder) == before and not (folder / "tb").exists()


def test_resuming_behind_the_folders_later_checkpoints_is_refused(folder):
    """Resuming step 2 where step 3 of the same run is saved would train a second line into
    the folder: pruning by step would take the new line's checkpoints, a crash's --resume
    auto the abandoned line's. Refused, naming them; the newest resumes as before."""
    before = snapshot(folder)
    code, stderr = run_row([*ARGS, "--steps", "4", "--resume", "ck/step-00000002"], folder,
                           False)
    assert code == 2
    line = _one_line(stderr)
    assert "holds later checkpoints (step-00000003)" in line and "--resume auto" in line
    assert snapshot(folder) == before
    code, stderr = run_row([*ARGS, "--steps", "4", "--resume", "ck/step-00000003"], folder,
                           False)
    assert code == 0, stderr


def test_metrics_logged_after_the_resumed_checkpoint_are_dropped(tmp_path):
    """A run killed during the save of step 5 logged steps 3 and 4 after its step-3
    checkpoint; resuming there must not log them twice (and a line cut short goes too)."""
    from paraxis.train.resume import trim_metrics

    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in range(5))
                    + '{"step": 5, "lo')
    trim_metrics(path, 3)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [0, 1, 2]


def test_a_resume_of_another_model_leaves_the_folder_as_it_was(folder):
    """Refused before the folder's lock is taken: its names, sizes and times unchanged (the
    lock, made and removed, once moved the folder's time)."""
    before = snapshot(folder)
    code, stderr = run_row([*ARGS, "--steps", "4", "--resume", "auto", "--model",
                            "tiny-llama"], folder, False)
    assert code == 2 and "holds a different model" in _one_line(stderr)
    assert snapshot(folder) == before
