"""The bad-input catalogue of late failures: inputs that would end in a traceback, fail
late (after training, at the first save) or be silently ignored. Same rules as
`tests/test_bad_input.py`: one line `paraxis: error: ...` with a fix, a non-zero exit, no
traceback, and every file in the folder unchanged. Rows marked SUB run in a subprocess."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from paraxis.files.checkpoint_manifest import with_checksum
from paraxis.train.config import RunConfig
from paraxis.train.loop import run_training
from tests.test_bad_input import catalogue, run_row, snapshot

SUB = True
TRAIN = ["train", "--steps", "1", "--quiet", "--seq-len", "32", "--global-batch", "4",
         "--device", "cpu"]
GOOD = "ckpt/step-00000001"

ROWS: list[tuple[str, list[str], str, str, bool]] = [
    # --- training flags that were ignored or crashed
    ("seed-negative", [*TRAIN, "--seed", "-1"], "--seed -1 must be between 0 and 2**63 - 1",
     "non-negative", False),
    ("grad-clip-nan", [*TRAIN, "--grad-clip", "nan"], "--grad-clip nan", "0 turns it off",
     False),
    ("peak-tflops-negative", [*TRAIN, "--peak-tflops", "-5"], "--peak-tflops -5.0",
     "must be a positive number", False),
    ("exit-after-without-folder", [*TRAIN, "--exit-after", "1"],
     "--exit-after needs --checkpoint-dir", "checkpoint to continue from", False),
    ("layout-key-twice", [*TRAIN, "--layout", "dp=1,dp=1"], "sets dp more than once",
     "give each key once", False),
    ("interleaved-without-pipeline", [*TRAIN, "--layout", "pp=1,schedule=interleaved"],
     "schedule=interleaved needs pp > 1", "use schedule=1f1b", False),
    ("zb-v-without-pipeline", [*TRAIN, "--schedule", "zb-v", "--microbatches", "2"],
     "schedule=zb-v needs pp > 1 (it runs 2 model chunks", "use schedule=1f1b", False),
    ("checkpoint-dir-unwritable", [*TRAIN, "--checkpoint-dir", "a_file.txt/ck"],
     "--checkpoint-dir a_file.txt/ck cannot be written", "choose another path", SUB),
    ("checkpoint-dir-is-a-file", [*TRAIN, "--checkpoint-dir", "a_file.txt"],
     "is a file, not a folder", "choose another path", False),
    ("tensorboard-unwritable", [*TRAIN, "--tensorboard", "a_file.txt/tb"],
     "--tensorboard a_file.txt/tb cannot be written", "choose another path", False),
    # --- model files with the wrong types
    ("model-file-a-list", [*TRAIN, "--model", "list.json"], "not a list",
     "a table of key = value", False),
    ("model-norm-eps-string", [*TRAIN, "--model", "eps.json"], "norm_eps = '1e-5'",
     "must be a finite number", False),
    ("model-layers-true", [*TRAIN, "--model", "layers.json"], "n_layers = True",
     "must be a whole number", False),
    ("model-llama-odd-head", [*TRAIN, "--model", "odd_head.json"],
     "head of 15 dimensions", "choose an even head size", False),
    # --- data: an id beyond the vocabulary after the first million tokens
    ("data-late-bad-id", [*TRAIN, "--data", "late.bin"], "holds token id 300 (at token "
     "1,499,999)", "check --data-dtype", False),
    # --- damaged manifests, in train, generate and checkpoint info
    ("train-tp-index-out-of-range", [*TRAIN, "--steps", "2", "--resume", "bad_index"],
     "tp_index 5 outside 0..tp_count-1", "use an earlier checkpoint", False),
    ("generate-manifest-without-step", ["generate", "--checkpoint", "no_step", "--prompt", "a",
                                        "--device", "cpu"],
     "step is None, not a whole number", "use an earlier checkpoint", SUB),
    ("info-smaller-shape", ["checkpoint", "info", "small_shape"],
     "has range 0..16384 outside its slice of 8192", "use an earlier checkpoint", False),
    ("info-manifest-edited", ["checkpoint", "info", "edited"],
     "edited/step-00000001/manifest.json is damaged: its content does not match its checksum",
     "use an earlier checkpoint", False),
    ("train-manifest-without-checksum", [*TRAIN, "--steps", "2", "--resume", "no_checksum"],
     "no_checksum/step-00000001/manifest.json is damaged: it has no checksum of its own",
     "use an earlier checkpoint", False),
    # --- a failed run or conversion leaves no folder it made behind (snapshot: every name)
    ("train-resume-truncated-into-new-folders", [*TRAIN, "--steps", "2", "--resume",
                                                 "truncated", "--checkpoint-dir", "new/ck"],
     "truncated/rank-00000.safetensors is corrupt or truncated", "use an earlier checkpoint",
     False),
    ("train-resume-truncated-keeps-the-last-runs-config", [
        *TRAIN, "--steps", "2", "--resume", "truncated", "--metrics-file",
        "last_run/metrics.jsonl"], "truncated/rank-00000.safetensors is corrupt or truncated",
     "use an earlier checkpoint", False),
    ("convert-truncated-into-new-folders", ["checkpoint", "convert", "truncated", "new/ck",
                                            "--layout", "dp=1"],
     "truncated/rank-00000.safetensors is corrupt or truncated", "use an earlier checkpoint",
     False),
    ("generate-a-listed-file-missing", ["generate", "--checkpoint", "lost_file", "--prompt",
                                        "a", "--device", "cpu"],
     "lost_file/rank-00001.safetensors is missing", "use an earlier one", False),
    ("convert-into-its-own-source", ["checkpoint", "convert", GOOD, GOOD, "--layout", "dp=1"],
     f"the destination {GOOD} lies inside the source", "write it outside the checkpoint",
     False),
    ("convert-into-a-file", ["checkpoint", "convert", GOOD, "a_file.txt/out", "--layout",
                             "dp=1"], "the destination a_file.txt/out cannot be written",
     "choose another path", False),
    ("export-hf-into-a-file", ["checkpoint", "export-hf", GOOD, "a_file.txt/hf"],
     "the destination a_file.txt/hf cannot be written", "choose another path", False),
    # --- planner and calculators
    ("plan-gpus-per-node-0", ["plan", "--model", "tiny", "--gpus", "8", "--gpus-per-node",
                              "0"], "--gpus-per-node 0", "must be at least 1", SUB),
    ("demo-layout-tp-3", ["demo", "--layout", "tp=3", "--out", "demo"],
     "4 attention heads are not divisible by tp=3", "choose tp among 1, 2, 4", False),
    ("calibrate-unknown-model", ["calibrate", "--model", "nosuch", "--nproc", "2", "--out",
                                 "c.json"], "unknown model 'nosuch'", "choose a preset", False),
    ("calibrate-nproc-empty", ["calibrate", "--nproc", "", "--out", "c.json"],
     "--nproc '' needs positive integers", "e.g. 2,4,8", False),
    ("lab-screenshots-under-a-file", ["lab", "--out", "lab", "--screenshots",
                                      "a_file.txt/shots"], "--screenshots a_file.txt/shots "
     "cannot be written", "choose another path", False),
    ("lab-out-empty", ["lab", "--out", ""], "--out is empty", "give a folder", False),
    ("plan-tp-0", ["plan", "--model", "tiny", "--gpus", "4", "--tp", "0"], "--tp 0 must be "
     "at least 1", "leave it out to search that degree", False),
    ("plan-max-pp-0", ["plan", "--model", "tiny", "--gpus", "4", "--max-pp", "0"],
     "--max-pp 0 must be at least 1", "leave it out", False),
    ("ring-bandwidth-0", ["ring", "--bandwidth-gbps", "0"], "--bandwidth-gbps 0.0",
     "must be a positive number of GB/s", False),
    ("ring-latency-nan", ["ring", "--latency-us", "nan"], "--latency-us nan",
     "at least 0", False),
    ("ring-size-0", ["ring", "--size", "0"], "--size 0", "at least 1 element", False),
    ("context-gpus-per-node-0", ["context", "--layout", "cp=2,tp=2", "--gpus-per-node", "0",
                                 "--out", "ctx"], "--gpus-per-node 0", "must be at least 1",
     False),
    ("plan-network-negative", ["plan", "--model", "tiny", "--gpus", "8", "--network-gbps",
                               "-1"], "--network-gbps -1.0", "leave the flag out", False),
    ("plan-seq-len-0", ["plan", "--model", "tiny", "--seq-len", "0"], "--seq-len 0",
     "must be a positive number", False),
    ("plan-memory-0", ["plan", "--model", "tiny", "--memory-gb", "0"], "--memory-gb 0.0",
     "must be a positive number", False),
    ("plan-seq-len-over-context", ["plan", "--model", "tiny", "--seq-len", "4096"],
     "--seq-len 4096 is over tiny's context of 128", "use --seq-len 128 or less", False),
    ("memory-params-inf", ["memory", "--params", "inf"], "--params inf",
     "must be a number below 1e18", SUB),
    ("ring-5000-ranks", ["ring", "--ranks", "5000"], "too big to watch",
     "use --ranks <= 16", SUB),
    ("generate-tiny-temperature", ["generate", "--checkpoint", GOOD, "--prompt", "a",
                                   "--temperature", "1e-45"], "--temperature 1e-45",
     "at least 0.0001", False),
    ("generate-endless", ["generate", "--checkpoint", GOOD, "--prompt", "a",
                          "--max-new-tokens", "100000000000000000000"],
     "--max-new-tokens 100000000000000000000", "within 0..100000", False),
    # --- output paths that cannot be written, found before any work
    ("prepare-out-under-a-file", ["data", "prepare", "good.jsonl", "--out", "a_file.txt/x"],
     "--out a_file.txt/x cannot be written", "choose another path", False),
    ("report-out-under-a-file", ["report", "--model", "tiny", "--out", "a_file.txt/r.html"],
     "--out a_file.txt/r.html cannot be written", "choose another path", False),
    ("context-out-a-file", ["context", "--cp", "2", "--out", "a_file.txt"],
     "is a file, not a folder", "choose another path", False),
    ("experts-out-a-file", ["experts", "--out", "a_file.txt"], "is a file, not a folder",
     "choose another path", False),
    ("calibrate-out-under-a-file", ["calibrate", "--nproc", "2", "--out", "a_file.txt/p.json"],
     "--out a_file.txt/p.json cannot be written", "choose another path", False),
    # --- numbers past what the libraries take, and sizes past what a command can show
    ("seed-over-int64", [*TRAIN, "--seed", "99999999999999999999999"],
     "must be between 0 and 2**63 - 1", "64-bit seeds", False),
    ("steps-over-a-trillion", [*TRAIN, "--steps", "99999999999999999999"], "is over 10**12",
     "give a real step count", False),
    ("plan-params-1e30", ["plan", "--params", "1e30", "--gpus", "8"], "--params 1e+30",
     "within 1e6..1e13", False),
    ("schedule-nan-scale", ["schedule", "--kind", "zb-h1", "--stage-scale", "1,1,1,nan"],
     "'1,1,1,nan'", "each between 0 and 1e+06", False),
    ("schedule-huge", ["schedule", "--stages", "1000", "--microbatches", "1000"],
     "over 100,000 actions", "a few stages and microbatches", False),
    # costs the model's split would have replaced without a word
    ("schedule-model-and-cost", ["schedule", "--model", "tiny", "--weight-cost", "99"],
     "--weight-cost and --model both give the costs", "leave --weight-cost out", False),
    # within the actions, but 100,000 rows (it once ran for hours)
    ("schedule-deep", ["schedule", "--stages", "100000", "--microbatches", "1"],
     "--stages 100000 is over 1,024 rows", "a few stages show the schedule", False),
    ("context-seq-len-0", ["context", "--cp", "2", "--seq-len", "0"], "--seq-len must be",
     "within 1..", False),
    ("experts-too-many-tokens", ["experts", "--model", "tiny-moe", "--seq-len", "100000"],
     "--batch 8 x --seq-len 100000 is over 65,536 tokens", "route fewer tokens", False),
    ("metrics-file-empty", [*TRAIN, "--metrics-file", ""], "--metrics-file is empty",
     "leave the flag out", False),
    ("checkpoint-dir-empty", [*TRAIN, "--checkpoint-dir", ""], "--checkpoint-dir is empty",
     "give a path", False),
    ("config-a-folder", ["train", "--config", "."], "config file . is a folder",
     "give a .toml run file", False),
    # --- damaged compressed data
    ("data-cut-gzip", ["data", "prepare", "cut.jsonl.gz", "--out", "prepared_cut"],
     "cut.jsonl.gz is not a complete gzip file", "compress it again", False),
    ("data-not-gzip", ["data", "prepare", "fake.jsonl.gz", "--out", "prepared_fake"],
     "fake.jsonl.gz is not a complete gzip file", "give the uncompressed .jsonl", False),
    ("rdzv-host-elsewhere", [*TRAIN, "--nproc", "2", "--rdzv-host", "192.0.2.1"],
     "--rdzv-host 192.0.2.1 cannot be listened on here", "127.0.0.1 for one machine", False),
    # --- under --nproc, bad input the ranks find: one line (not one per rank), exit code 2
    ("nproc-resume-other-model", [*TRAIN, "--steps", "2", "--nproc", "2", "--model",
                                  "tiny-llama", "--resume", GOOD],
     "holds a different model", "--model set to the checkpoint's model", SUB),
    ("nproc-share-gpu-compile-tp", [*TRAIN, "--nproc", "2", "--tp", "2", "--share-gpu",
                                    "--compile"],
     "--compile with --share-gpu compiles only layouts", "drop --compile", SUB),
    # found by the first pipeline stage alone: its peer loses it and stays quiet
    ("nproc-found-on-one-rank", [*TRAIN, "--steps", "2", "--nproc", "2", "--pp", "2",
                                 "--resume", "missing_piece"],
     "has no param for blocks.1.", "it was made for a different model", SUB),
]


def make_inputs(folder: Path) -> None:
    import gzip

    (folder / "a_file.txt").write_text("not a folder\n")
    (folder / "last_run").mkdir()  # a finished run's files, which a failed one must keep
    (folder / "last_run" / "config.toml").write_text("[train]\nsteps = 100\n")
    (folder / "last_run" / "metrics.jsonl").write_text('{"step": 0, "loss": 5.0}\n')
    rows = "".join(json.dumps({"text": f"document {i} " * 20}) + "\n" for i in range(200))
    (folder / "good.jsonl").write_text(rows)
    packed = gzip.compress(rows.encode())
    (folder / "cut.jsonl.gz").write_bytes(packed[:len(packed) // 2])
    (folder / "fake.jsonl.gz").write_text(rows)
    shape = {"name": "m", "style": "llama", "vocab_size": 256, "n_layers": 2, "d_model": 64,
             "n_heads": 4, "n_kv_heads": 4, "d_ff": 128, "max_seq_len": 64}
    (folder / "list.json").write_text(json.dumps([shape]))
    (folder / "eps.json").write_text(json.dumps({**shape, "norm_eps": "1e-5"}))
    (folder / "layers.json").write_text(json.dumps({**shape, "n_layers": True}))
    (folder / "odd_head.json").write_text(json.dumps({**shape, "d_model": 60}))
    tokens = (np.arange(1_500_000) % 200).astype(np.uint16)
    tokens[-1] = 300
    tokens.tofile(folder / "late.bin")
    run_training(RunConfig.from_flags(model="tiny", steps=1, global_batch=4, seq_len=32,
                                      quiet=True, device="cpu",
                                      checkpoint_dir=str(folder / "ckpt")))
    good = folder / GOOD
    for name, damage in (("bad_index", lambda m: m["pieces"][0].update(tp_index=5)),
                         ("no_step", lambda m: m.pop("step")),
                         ("small_shape", lambda m: m["pieces"][0].update(shape=[128, 64])),
                         # well-formed edits only the manifest's own checksum reveals
                         ("edited", lambda m: m.update(step=7)),
                         ("no_checksum", lambda m: m.pop("checksum")),
                         ("version_1", lambda m: (m.pop("checksum"), m.update(version=1)))):
        shutil.copytree(good, folder / name / good.name)
        path = folder / name / good.name / "manifest.json"
        manifest = json.loads(path.read_text())
        damage(manifest)
        path.write_text(json.dumps(manifest))
    # a file the manifest lists (an optimizer shard, say) is gone: generate reads only the
    # weights, and must refuse it all the same, as training and `checkpoint info` do
    shutil.copytree(good, folder / "lost_file")
    path = folder / "lost_file" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["files"]["rank-00001.safetensors"] = dict(manifest["files"]["rank-00000.safetensors"])
    path.write_text(json.dumps(with_checksum(manifest)))
    shutil.copytree(good, folder / "truncated")  # a rank file cut short
    cut = folder / "truncated" / "rank-00000.safetensors"
    os.truncate(cut, cut.stat().st_size // 2)
    # well-formed and checksummed, but without the second block: only stage 0 loads it
    shutil.copytree(good, folder / "missing_piece" / good.name)
    path = folder / "missing_piece" / good.name / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["pieces"] = [p for p in manifest["pieces"] if not p["name"].startswith("blocks.1.")]
    path.write_text(json.dumps(with_checksum(manifest)))


inputs, test_bad_input_is_one_line_with_a_hint = catalogue(ROWS, make_inputs, "bad_inputs2",
                                                           exit_code=2)


def test_a_manifest_written_before_checksums_still_reads(inputs):
    """Format version 1 (no checksum of its own) reads as before; this paraxis writes 2."""
    from paraxis.files.checkpoint_manifest import VERSION, read_manifest

    old = read_manifest(inputs / "version_1" / "step-00000001")
    new = read_manifest(inputs / GOOD)
    assert (old["version"], new["version"], VERSION) == (1, 2, 2)
    assert "checksum" not in old and len(new["checksum"]) == 64
    assert {k: v for k, v in new.items() if k not in ("checksum", "version")} == {
        k: v for k, v in old.items() if k != "version"}


def test_ranks_of_a_job_print_one_line_for_one_mistake(monkeypatch):
    """Through the job's store: the first rank to raise a line prints it, a rank raising the
    same line stays quiet, another line is printed too, and a rank whose peer left after
    bad input is quiet with exit code 2 (`dist/bad_input.py`)."""
    from datetime import timedelta

    import torch.distributed as dist

    from paraxis.dist.bad_input import decide
    from paraxis.spec.errors import CommFailure, ParaxisError

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=5))
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(store.port))
    monkeypatch.setenv("WORLD_SIZE", "4")
    lost = CommFailure("rank 1: lost a peer")
    assert decide(lost) == (True, 3)  # no bad input yet: a failure of its own, said
    wrong = ParaxisError("checkpoint ck holds a different model")
    assert [decide(wrong) for _ in range(3)] == [(True, 2), (False, 2), (False, 2)]
    assert decide(ParaxisError("another problem")) == (True, 2)
    assert decide(lost) == (False, 2)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # a restarted attempt starts afresh
    assert decide(lost) == (True, 3) and decide(wrong) == (True, 2)


@pytest.mark.slow
def test_bad_input_one_rank_finds_under_torchrun_is_one_line(inputs):
    """torchrun's ranks: one `paraxis: error:` line (not the peer's "lost a peer" too), and
    the rank that found it exits with code 2 (torchrun's own report follows, its format)."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
               "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", "-m",
               "paraxis.train", *TRAIN[1:], "--steps", "2", "--pp", "2", "--resume",
               "missing_piece"]
    before = snapshot(inputs)
    done = subprocess.run(command, cwd=inputs, capture_output=True, text=True, timeout=170,
                          env={**os.environ, "PYTHONPATH": str(root)})
    lines = [line for line in done.stderr.splitlines() if line.startswith("paraxis: error:")]
    assert len(lines) == 1 and "has no param for blocks.1." in lines[0], done.stderr
    # the one traceback is torchrun's own report of a failed child
    assert "exitcode  : 2" in done.stderr and done.stderr.count("Traceback") == 1, done.stderr
    assert "ChildFailedError" in done.stderr.split("Traceback")[1], done.stderr
    assert snapshot(inputs) == before


def test_a_checkpoint_that_cannot_fit_is_refused_before_training(inputs, monkeypatch):
    import collections

    import paraxis.train.claim as claim

    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(claim.shutil, "disk_usage", lambda path: usage(10**6, 10**6 - 1000, 1000))
    before = snapshot(inputs)
    code, stderr = run_row([*TRAIN, "--checkpoint-dir", "new_ckpt"], inputs, False)
    assert code == 2 and len(stderr.strip().splitlines()) == 1, stderr
    assert "has 1e-06 GB free but one checkpoint of this model takes about 0.0" in stderr
    assert "free space or choose another --checkpoint-dir" in stderr
    assert snapshot(inputs) == before


def test_a_full_disk_during_a_save_is_one_line_and_exit_3(tmp_path, monkeypatch):
    import errno

    import paraxis.model.checkpoint.save as save

    def full(tensors: object, path: Path) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(save, "_write_tensors", full)
    code, stderr = run_row([*TRAIN, "--checkpoint-dir", "ck"], tmp_path, False)
    assert code == 3 and "Traceback" not in stderr, stderr
    assert stderr.strip().splitlines() == [
        "paraxis: error: rank 0: cannot write checkpoint ck/step-00000001.tmp (No space left "
        "on device: ck/step-00000001.tmp/rank-00000.safetensors); free space or fix the "
        "folder, then resume from the previous checkpoint with --resume auto"]


def test_a_full_disk_reported_by_safetensors_is_one_line_and_frees_the_tmp(tmp_path,
                                                                           monkeypatch):
    # safetensors reports a full disk with its own SafetensorError, not an OSError (as a
    # 3 MB tmpfs showed); the half-written step folder is removed, its space given back
    from safetensors import SafetensorError

    import paraxis.model.checkpoint.save as save

    def full(tensors: object, path: Path) -> None:
        Path(path).write_bytes(b"partial")
        raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: "
                              "StorageFull, message: \"No space left on device\" })")

    monkeypatch.setattr(save, "_write_tensors", full)
    code, stderr = run_row([*TRAIN, "--checkpoint-dir", "ck"], tmp_path, False)
    assert code == 3 and "Traceback" not in stderr, stderr
    assert len(stderr.strip().splitlines()) == 1 and "No space left on device" in stderr
    assert not (tmp_path / "ck" / "step-00000001.tmp").exists()


def test_a_full_disk_during_convert_and_export_is_one_line_and_leaves_nothing(tmp_path,
                                                                             monkeypatch):
    """convert, import-hf and export-hf write through safetensors, whose full disk is its own
    SafetensorError: one line, exit 2, no destination left behind, the source untouched."""
    from safetensors import SafetensorError

    import paraxis.model.checkpoint.convert as convert
    import paraxis.model.hf.write as hf_write

    assert run_row([*TRAIN, "--checkpoint-dir", "ck"], tmp_path, False)[0] == 0
    assert run_row(["checkpoint", "export-hf", "ck", "hf"], tmp_path, False)[0] == 0
    before = snapshot(tmp_path)

    def full(*args: object, **kwargs: object) -> None:
        raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: "
                              "StorageFull, message: \"No space left on device\" })")

    monkeypatch.setattr(convert, "_write_tensors", full)
    monkeypatch.setattr(hf_write, "save_file", full)
    for argv in (["checkpoint", "convert", "ck", "out", "--layout", "tp=2"],
                 ["checkpoint", "import-hf", "hf", "out"],
                 ["checkpoint", "export-hf", "ck", "out"]):
        code, stderr = run_row(argv, tmp_path, False)
        assert code == 2 and len(stderr.strip().splitlines()) == 1, (argv, stderr)
        assert "(No space left on device); free space" in stderr, stderr
        assert snapshot(tmp_path) == before, argv


def test_checkpoint_dir_is_neither_a_checkpoint_nor_a_hugging_face_model(tmp_path):
    """A run's --checkpoint-dir takes its step folders: inside a checkpoint they would nest
    steps in a step, and in an exported model's folder `generate --checkpoint` would then
    sample the run's weights instead of the model's."""
    assert run_row([*TRAIN, "--checkpoint-dir", "ck"], tmp_path, False)[0] == 0
    assert run_row(["checkpoint", "export-hf", "ck", "hf"], tmp_path, False)[0] == 0
    before = snapshot(tmp_path)
    for folder, words in (("ck/step-00000001", "is a checkpoint (its manifest.json)"),
                          ("hf", "holds a Hugging Face model (its config.json)")):
        code, stderr = run_row([*TRAIN, "--checkpoint-dir", folder], tmp_path, False)
        assert code == 2 and len(stderr.strip().splitlines()) == 1, stderr
        assert words in stderr, stderr
        assert snapshot(tmp_path) == before, folder


def test_an_unfinished_save_named_outright_is_not_loaded(tmp_path):
    """A step-N.tmp folder is a save that never finished: skipped when its parent is given,
    and refused in one line when named itself, by every command that reads checkpoints."""
    assert run_row([*TRAIN, "--checkpoint-dir", "ck"], tmp_path, False)[0] == 0
    shutil.copytree(tmp_path / "ck" / "step-00000001", tmp_path / "x" / "step-00000001.tmp")
    before = snapshot(tmp_path)
    for argv in (["checkpoint", "info", "x/step-00000001.tmp"],
                 ["checkpoint", "convert", "x/step-00000001.tmp", "out", "--layout", "tp=2"],
                 [*TRAIN, "--steps", "2", "--resume", "x/step-00000001.tmp"]):
        code, stderr = run_row(argv, tmp_path, False)
        assert code == 2 and len(stderr.strip().splitlines()) == 1, (argv, stderr)
        assert "is a save that never finished" in stderr, stderr
        assert snapshot(tmp_path) == before, argv
