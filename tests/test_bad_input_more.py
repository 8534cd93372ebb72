"""The bad-input catalogue, continued: a run file's values named as the file writes them
(not as flags nobody gave), held-out data without evaluations, negative numbers in exponent
notation, empty text where a model, checkpoint or output file is named, and a checkpoint
folder whose newest step another run wrote. Same rules as `tests/test_bad_input.py`: one
line `paraxis: error: ...` with a fix, exit code 2, no traceback, and every file in the
folder unchanged. Rows marked SUB run in a subprocess."""

from __future__ import annotations

import argparse
import json
import shutil
import signal
from pathlib import Path

import pytest

from paraxis.dist.launch import failure_summary, stopped_line
from paraxis.spec.errors import ParaxisError
from paraxis.train.flags import add_arguments, config_from_args
from tests.test_bad_input import catalogue, run_row

SUB = True
TRAIN = ["train", "--steps", "1", "--quiet", "--seq-len", "32", "--global-batch", "4",
         "--device", "cpu"]
NEWEST = "step-00000002"  # in `mixed`, written by another run than the folder's

ROWS: list[tuple[str, list[str], str, str, bool]] = [
    # --- a run file's values: named by the file and its key, not by a flag nobody gave
    ("run-file-lr-negative", [*TRAIN, "--config", "neg_lr.toml"],
     "neg_lr.toml: [optimizer] lr = -1 must be a positive number", "positive number", SUB),
    ("run-file-seed-negative", [*TRAIN, "--config", "seed.toml"],
     "seed.toml: [train] seed = -3 must be between 0 and 2**63 - 1", "non-negative", False),
    ("run-file-steps-0", ["train", "--quiet", "--device", "cpu", "--config", "steps0.toml"],
     "steps0.toml: [train] steps = 0 must be at least 1", "at least 1", False),
    ("run-file-precision-unknown", [*TRAIN, "--config", "precision.toml"],
     'precision.toml: [train] precision = "fp4" is unknown', "use fp32, bf16", False),
    ("run-file-checkpoint-every-without-dir", [*TRAIN, "--config", "every.toml"],
     "every.toml: [checkpoint] every needs --checkpoint-dir", "add it", False),
    ("run-file-val-path-without-evaluations", [*TRAIN, "--config", "val.toml"],
     'val.toml: [data] val_path = "c.jsonl" is read only by evaluations',
     "add --eval-every N", False),
    # --- the command line's own values, each named with its value
    ("keep-negative", [*TRAIN, "--keep", "-1", "--checkpoint-dir", "ck_keep"],
     "--keep -1 must be >= 0", "0: keep all", False),
    ("min-lr-ratio-negative", [*TRAIN, "--min-lr-ratio", "-0.1"],
     "--min-lr-ratio -0.1 must be between 0 and 1", "fraction of --lr", False),
    # --- read only by evaluations, which --eval-every 0 never runs
    ("val-data-without-eval-every", [*TRAIN, "--data", "c.jsonl", "--val-data", "c.jsonl"],
     "--val-data c.jsonl is read only by evaluations", "add --eval-every N", False),
    # --- a negative number in exponent notation is a number, not a flag
    ("adam-eps-negative-exponent", [*TRAIN, "--adam-eps", "-1e-8"],
     "--adam-eps -1e-08 must be a small positive number", "typical: 1e-8", False),
    ("lr-negative-exponent", [*TRAIN, "--lr", "-1e-3"], "--lr -0.001 must be a positive number",
     "positive number", False),
    ("memory-params-negative-exponent", ["memory", "--params", "-7e9"], "--params -7e+09",
     "must be at least 1", False),
    # --- a world no layout can split: quick (divisors in sqrt time), one reason per rule
    ("plan-gpus-a-million", ["plan", "--model", "tiny", "--gpus", "1048576"],
     "global batch 1024 does not split over dp=1048576", "attention heads", False),
    # --- beyond the search's bounds: refused at once, where listing divisors took minutes
    ("plan-gpus-a-hundred-million", ["plan", "--model", "tiny", "--gpus", "100000000"],
     "--gpus 100,000,000 is more than the planner searches", "(1,048,576)", False),
    ("plan-global-batch-huge", ["plan", "--model", "tiny", "--global-batch", "1" + "0" * 15],
     "--global-batch 1,000,000,000,000,000 is more", "(16,777,216)", False),
    ("memory-gpus-huge", ["memory", "--params", "7e9", "--gpus", "1" + "0" * 20],
     "--gpus 100,000,000,000,000,000,000", "give 1 to 1,048,576 GPUs", False),
    # --- empty text that meant the working folder or the default, unsaid
    ("train-model-empty", [*TRAIN, "--model", ""], "--model is empty", "give a preset", False),
    ("plan-model-empty", ["plan", "--model", ""], "--model is empty", "leave the flag out",
     False),
    ("report-model-empty", ["report", "--model", "", "--out", "r.html"], "--model is empty",
     "leave the flag out", False),
    ("schedule-model-empty", ["schedule", "--model", ""], "--model is empty",
     "leave the flag out", False),
    ("schedule-trace-empty", ["schedule", "--from-trace", ""], "--from-trace is empty",
     "leave the flag out", False),
    ("experts-model-empty", ["experts", "--model", ""], "--model is empty", "give a preset",
     False),
    ("generate-checkpoint-empty", ["generate", "--checkpoint", "", "--prompt", "hi"],
     "--checkpoint is empty", "give a paraxis checkpoint", False),
    ("report-out-empty", ["report", "--model", "tiny", "--out", ""], "--out is empty",
     "e.g. report.html", SUB),
    ("calibrate-out-empty", ["calibrate", "--nproc", "2", "--out", ""], "--out is empty",
     "e.g. profile.json", False),
    ("calibrate-tokens-0", ["calibrate", "--nproc", "2", "--tokens", "0", "--out", "c.json"],
     "--tokens 0 must be at least 1", "at least 1", False),
    # --- more ranks than memory holds even idle: they had all been started (2 PB here)
    ("nproc-past-the-memory", [*TRAIN, "--nproc", "10000000", "--global-batch", "10000000"],
     "--nproc 10000000 ranks need about 2,200,000 GB before any model", "or fewer", False),
    # --- a checkpoint folder whose newest step another run wrote (copied in by hand)
    ("resume-auto-another-runs-newest", [*TRAIN, "--steps", "4", "--checkpoint-dir", "mixed",
                                         "--resume", "auto"],
     f"the newest checkpoint in mixed, {NEWEST}, belongs to run",
     f"move {NEWEST} out of mixed", False),
    ("resume-auto-another-runs-newest-past-steps", [*TRAIN, "--steps", "2",
                                                    "--checkpoint-dir", "mixed", "--resume",
                                                    "auto"],
     f"the newest checkpoint in mixed, {NEWEST}, belongs to run", "another --checkpoint-dir",
     False),
    # --- a run already complete, asked for by another model or batch: it said "complete,
    # nothing to train" and exited 0, whatever was asked
    ("resume-auto-complete-another-model", [*TRAIN, "--model", "tiny-llama", "--steps", "2",
                                            "--seed", "1", "--checkpoint-dir", "other",
                                            "--resume", "auto"],
     "holds a different model", "train with --model set to the checkpoint's model", False),
    ("resume-auto-complete-another-batch", [*TRAIN, "--steps", "2", "--seed", "1",
                                            "--global-batch", "8", "--checkpoint-dir", "other",
                                            "--resume", "auto"],
     "is complete, but for another run: --global-batch 8 (checkpoint: 4)",
     "another --checkpoint-dir", False),
]


def make_inputs(folder: Path) -> None:
    (folder / "neg_lr.toml").write_text("[optimizer]\nlr = -1\n")
    (folder / "seed.toml").write_text("[train]\nseed = -3\n")
    (folder / "steps0.toml").write_text("[train]\nsteps = 0\n")
    (folder / "precision.toml").write_text('[train]\nprecision = "fp4"\n')
    (folder / "every.toml").write_text("[checkpoint]\nevery = 2\n")
    (folder / "val.toml").write_text('[data]\nval_path = "c.jsonl"\n')
    (folder / "c.jsonl").write_text("".join(json.dumps({"text": f"document {i} " * 20}) + "\n"
                                            for i in range(50)))
    # run "mixed" saved step 1; another run (another seed) saved step 2, copied in after
    for argv in ([*TRAIN, "--checkpoint-dir", "mixed"],
                 [*TRAIN, "--steps", "2", "--seed", "1", "--checkpoint-dir", "other"]):
        code, stderr = run_row(argv, folder, False)
        assert code == 0, stderr
    shutil.copytree(folder / "other" / NEWEST, folder / "mixed" / NEWEST)


inputs, test_bad_input_is_one_line_with_a_hint = catalogue(ROWS, make_inputs, "bad_more",
                                                           exit_code=2)


def _config(argv: list[str]):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return config_from_args(parser.parse_args(argv))


def test_a_value_a_flag_overrides_is_the_flags(inputs, monkeypatch):
    # the run file's bad lr, replaced on the command line, is not an error; the flag's own is
    # named as the flag
    monkeypatch.chdir(inputs)
    assert _config(["--config", "neg_lr.toml", "--lr", "0.1"]).optimizer.lr == 0.1
    with pytest.raises(ParaxisError, match=r"^--lr -2.0 must be a positive number$"):
        _config(["--config", "neg_lr.toml", "--lr", "-2"])


def test_the_folders_own_checkpoint_resumes_once_the_other_is_moved_out(inputs, tmp_path):
    # the fix the refusal names: move the other run's step out, and --resume auto continues
    shutil.copytree(inputs / "mixed", tmp_path / "mixed")
    shutil.rmtree(tmp_path / "mixed" / NEWEST)
    code, stderr = run_row([*TRAIN, "--steps", "2", "--checkpoint-dir", "mixed", "--resume",
                            "auto"], tmp_path, False)
    assert code == 0, stderr
    assert (tmp_path / "mixed" / NEWEST).is_dir()


def test_generate_takes_the_manifest_itself(inputs):
    # before: "is not a directory; give ... a paraxis checkpoint (manifest.json)"
    code, stderr = run_row(["generate", "--checkpoint", f"other/{NEWEST}/manifest.json",
                            "--prompt", "hi", "--max-new-tokens", "2"], inputs, False)
    assert code == 0, stderr


def test_a_rank_killed_by_a_signal_is_not_sent_to_a_line_it_never_wrote():
    # before: "...; a failed rank's own line above, where it wrote one, says why" after a
    # SIGKILL during start-up, with no line above
    line = failure_summary([None, -signal.SIGKILL])
    assert line.startswith("rank 0 was stopped by the launcher, rank 1 was killed by SIGKILL "
                           "(of 2 ranks); a rank killed by SIGKILL writes no line of its own")
    assert "line above" not in line and "dmesg" in line
    line = failure_summary([3, -signal.SIGSEGV])  # one said why, one crashed
    assert "rank 0 exited with code 3" in line and "its own line above" in line
    assert "a rank killed by SIGSEGV writes no line of its own" in line


def test_two_signals_say_which_checkpoint_is_the_newest(tmp_path):
    # before: "nothing was saved", or "the checkpoint folder holds the last save", whether
    # or not steps had been saved
    for step in (1, 3):
        (tmp_path / "ck" / f"step-{step:08d}").mkdir(parents=True)
        (tmp_path / "ck" / f"step-{step:08d}" / "manifest.json").write_text("{}")
    (tmp_path / "ck" / "step-00000004.tmp").mkdir()  # a save the second signal cut short
    line = stopped_line(signal.SIGTERM, 2, str(tmp_path / "ck"))
    assert line == (f"stopped by SIGTERM: a second signal stopped the ranks at once, without "
                    f"saving; the newest checkpoint is {tmp_path}/ck/step-00000003 (step 3): "
                    "continue from it with --resume auto")
    assert stopped_line(signal.SIGTERM, 1, str(tmp_path / "none")).endswith(
        f"where a signal saves nothing; no checkpoint was saved in {tmp_path}/none")
    assert stopped_line(signal.SIGINT, 2, None).endswith(
        "no --checkpoint-dir, so nothing was saved")
