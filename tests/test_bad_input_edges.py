"""The bad-input catalogue at the edges: numbers too large or too small for what they become,
names longer than the file system holds, one path given for two things, flags that need
another, checkpoints written into a folder a run owns, torchrun's variables left in a shell.
Same rules as `tests/test_bad_input.py`: one line `paraxis: error: ...` with a fix, exit
code 2, no traceback, and every file in the folder unchanged. Rows marked SUB run in a
subprocess."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

from tests.test_bad_input import catalogue, check_row, run_row

SUB = True
TRAIN = ["train", "--steps", "1", "--quiet", "--seq-len", "32", "--global-batch", "4",
         "--device", "cpu"]
LONG_NAME = "n" * 300  # past the 255 bytes of ext4 and most file systems

ROWS: list[tuple[str, list[str], str, str, bool]] = [
    # --- numbers past what they become (an int, a C timeout)
    ("bucket-mb-inf", [*TRAIN, "--bucket-mb", "inf"], "--bucket-mb inf",
     "DDP uses 25", SUB),
    ("timeout-overflows", [*TRAIN, "--nproc", "2", "--timeout-s", "1e300"],
     "--timeout-s 1e+300", "1 to 10,000,000 (default 600)", SUB),
    ("timeout-below-a-second", [*TRAIN, "--nproc", "2", "--timeout-s", "1e-9"],
     "--timeout-s 1e-09", "1 to 10,000,000 (default 600)", False),
    ("weight-decay-inf", [*TRAIN, "--weight-decay", "inf"], "--weight-decay inf",
     "typical: 0.1", False),
    # --- names the file system cannot hold
    ("metrics-file-name-too-long", [*TRAIN, "--metrics-file", f"{LONG_NAME}/m.jsonl"],
     "--metrics-file: the name nnnn", "choose a shorter name", False),
    ("checkpoint-dir-name-too-long", [*TRAIN, "--checkpoint-dir", LONG_NAME],
     "--checkpoint-dir: the name nnnn", "choose a shorter name", False),
    # ...and files to read by such a name: an OSError traceback wherever it was opened
    ("plan-model-name-too-long", ["plan", "--model", f"{LONG_NAME}.json"],
     "nnnn.json: a name longer than this file system allows", "a shorter path", False),
    ("checkpoint-info-name-too-long", ["checkpoint", "info", LONG_NAME],
     "a name longer than this file system allows", "choose a shorter path", False),
    ("train-data-name-too-long", [*TRAIN, "--data", f"{LONG_NAME}.jsonl"],
     "a name longer than this file system allows", "choose a shorter path", False),
    ("lab-out-name-too-long", ["lab", "--out", LONG_NAME], "--out: the name nnnn",
     "choose a shorter name", False),
    # --- one path for two things
    ("metrics-file-is-the-checkpoint-dir", [*TRAIN, "--metrics-file", "X",
                                            "--checkpoint-dir", "X"],
     "--metrics-file X is also the --checkpoint-dir folder", "another path", False),
    # --- flags that do nothing without another (as --exit-after without a folder)
    ("checkpoint-every-without-dir", [*TRAIN, "--checkpoint-every", "1"],
     "--checkpoint-every needs --checkpoint-dir", "leave the flag out", False),
    ("exit-after-past-the-steps", [*TRAIN, "--checkpoint-dir", "ck_exit", "--exit-after", "5"],
     "--exit-after 5 is past --steps 1", "give a step before it", False),
    ("keep-without-dir", [*TRAIN, "--keep", "5"], "--keep needs --checkpoint-dir",
     "leave the flag out", False),
    # --- the other commands refuse what train refuses
    ("experts-seed-negative", ["experts", "--seed", "-5"],
     "--seed -5 must be between 0 and 2**63 - 1", "2**63 - 1", False),
    ("demo-out-empty", ["demo", "--out", ""], "--out is empty", "runs/demo", SUB),
    # --- a checkpoint from outside a run into a folder a run owns or holds
    ("convert-into-a-run-folder", ["checkpoint", "convert", "no_source", "run_folder",
                                   "--layout", "dp=1"],
     "run_folder belongs to run owner-1 (its run.json)", "into another folder", SUB),
    ("import-hf-into-a-held-folder", ["checkpoint", "import-hf", "hf_quoted", "held_folder"],
     "held_folder is held by run holder-1", "checkpoint import-hf into another folder",
     False),
    # --- run files TOML cannot read as written, or whose values train would blame on a flag
    ("run-file-with-a-bom", [*TRAIN, "--config", "bom.toml"], "starts with a byte-order mark",
     "save it as UTF-8 without BOM", False),
    ("run-file-a-fifo", [*TRAIN, "--config", "fifo.toml"], "fifo.toml is not a regular file",
     "give a .toml run file", SUB),
    ("run-file-lr-nan", [*TRAIN, "--config", "nan.toml"],
     "nan.toml: [optimizer] lr = nan must be a finite number", "write e.g. lr = 0.003", False),
    # --- flags that would be silently ignored
    ("cp-attention-without-cp", [*TRAIN, "--cp-attention", "all_to_all"],
     "--cp-attention all_to_all says how K/V reach the queries across cp ranks, and cp = 1",
     "add --cp N, or leave it out", False),
    ("zero3-reshard-without-a-pipeline", [*TRAIN, "--zero", "3", "--zero3-reshard", "step"],
     "--zero3-reshard step applies to ZeRO-3 under a pipeline", "leave it out", False),
    ("data-dtype-without-a-token-file", [*TRAIN, "--data-dtype", "uint8"],
     "--data-dtype uint8 says how a .bin token file is read, and --data names none",
     "leave it out", False),
    ("text-field-without-a-raw-source", [*TRAIN, "--text-field", "body"],
     "--text-field body names a field of JSONL, Parquet or datasets sources",
     "leave it out", False),
    ("rdzv-host-empty", [*TRAIN, "--nproc", "2", "--rdzv-host", ""], "--rdzv-host is empty",
     "e.g. 127.0.0.1", False),
    # --- checkpoints that are not what their names say, runs that change under them
    ("resume-a-renamed-step", [*TRAIN, "--steps", "4", "--checkpoint-dir", "renamed",
                               "--resume", "auto"],
     "renamed/step-00000009 is named for step 9 but its manifest says step 2",
     "give it back its name, step-00000002", False),
    ("resume-in-another-precision", [*TRAIN, "--steps", "3", "--checkpoint-dir", "ck",
                                     "--resume", "auto", "--precision", "bf16"],
     "with --precision bf16 (checkpoint: fp32)", "--allow-resume-changes", False),
    # --- model and data files that would train on something else than they say
    ("model-json-key-twice", [*TRAIN, "--model", "twice.json"],
     "the key 'n_layers' is given twice", "fix the file", False),
    ("import-hf-integer-weights", ["checkpoint", "import-hf", "hf_int", "out"],
     "is stored as I32, not floating point", "give its float (F32, BF16, F16) weights", False),
    ("prepare-only-empty-texts", ["data", "prepare", "empty.jsonl", "--out", "prepared"],
     "every document of empty.jsonl is empty", "--text-field", SUB),
    ("prepared-folder-without-index", [*TRAIN, "--data", "unindexed"],
     "holds prepared shards but no index.json", "paraxis data prepare", False),
    # --- sampling from weights or with a tokenizer the model cannot take
    ("generate-nan-weights", ["generate", "--checkpoint", "hf_nan", "--prompt", "hi"],
     "holds NaN or infinite values", "use another checkpoint", SUB),
    ("generate-tokenizer-larger-than-vocab", ["generate", "--checkpoint", "ck", "--prompt",
                                              "hi", "--tokenizer", "big_tokenizer.json"],
     "the tokenizer has 300 tokens, more than the model's vocabulary of 256",
     "--tokenizer", False),
    # --- a config.json whose counts are not numbers
    ("import-hf-quoted-heads", ["checkpoint", "import-hf", "hf_quoted", "out"],
     "num_attention_heads = '4' must be a whole number", "fix config.json", False),
    # ...or null where transformers has no meaning for null, or not the object RoPE needs
    ("import-hf-null-eps", ["checkpoint", "import-hf", "hf_null_eps", "out"],
     "rms_norm_eps = null must be a finite number", "fix config.json", False),
    ("import-hf-null-nested-theta", ["checkpoint", "import-hf", "hf_null_theta", "out"],
     "rope_parameters.rope_theta = null must be a finite number", "fix config.json", False),
    ("import-hf-rope-not-an-object", ["checkpoint", "import-hf", "hf_rope_text", "out"],
     "rope_parameters = 'default' must be an object", "fix config.json", False),
    ("import-hf-no-heads", ["checkpoint", "import-hf", "hf_no_heads", "out"],
     "num_attention_heads = 0 must be at least 1", "fix config.json", False),
    # --- files that are not text where text is read
    ("report-run-not-text", ["report", "--run", "binary.jsonl", "--out", "r.html"],
     "binary.jsonl is not a metrics file (not UTF-8 text)", "--metrics-file` wrote", SUB),
    ("convert-config-not-text", ["checkpoint", "convert", "binary_config", "out", "--layout",
                                 "dp=1"], "config.toml is not UTF-8 text",
     "use an earlier one", False),
    # --- sizes that would run for hours before saying anything
    ("model-a-billion-layers", [*TRAIN, "--model", "billion_layers.json"],
     "n_layers=1,000,000,000 is over 10,000", "give the model's real layer count", False),
    ("calibrate-more-ranks-than-cores", ["calibrate", "--nproc", "100000", "--device", "cpu",
                                         "--out", "c.json"],
     "--nproc 100000 is more ranks than this machine's", "or fewer, e.g. 2,4", False),
    # ...and numbers no calibration can take: an overflow or an allocation, from the ranks
    ("calibrate-busy-forever", ["calibrate", "--busy-s", "inf", "--out", "c.json"],
     "--busy-s inf must be above 0 and at most 600", "e.g. 2", False),
    ("calibrate-a-message-of-100-tb", ["calibrate", "--sizes-kb", "1,99999999999", "--out",
                                       "c.json"], "a message of at most 1048576 KiB",
     "a gradient bucket", False),
    ("calibrate-a-trillion-tokens", ["calibrate", "--tokens", "1000000000000", "--out",
                                     "c.json"], "more than half of this machine's free memory",
     "give fewer tokens", False),
    # --- a path typed with a line break: still one line
    ("data-path-with-a-newline", [*TRAIN, "--data", "tok\nens.bin"],
     "data tok\\nens.bin does not exist", "give an existing .bin token file", False),
    # --- empty text that meant the default or the working folder, unsaid
    ("data-empty", [*TRAIN, "--data", ""], "--data is empty", "or leave the flag out", False),
    ("resume-empty", [*TRAIN, "--resume", ""], "--resume is empty", "leave the flag out",
     False),
    ("convert-layout-empty", ["checkpoint", "convert", "ck", "out", "--layout", ""],
     "--layout is empty", "dp=1 for one device", False),
    ("convert-destination-empty", ["checkpoint", "convert", "ck", "", "--layout", "dp=1"],
     "the destination is empty", "give a folder", False),
    ("info-path-empty", ["checkpoint", "info", ""], "the checkpoint info source is empty",
     "give a checkpoint", False),
    ("plan-layout-empty", ["plan", "--model", "tiny", "--layout", ""], "--layout is empty",
     "leave the flag out", False),
    ("prepare-source-empty", ["data", "prepare", "", "--out", "prepared_here"],
     "the source is empty", "give a .jsonl / .jsonl.gz file", False),
    ("schedule-trace-a-folder", ["schedule", "--from-trace", "unindexed"],
     "cannot read trace unindexed", "give the trace.json a pipeline run (pp > 1) writes",
     False),
    # --- a file where a checkpoint directory is expected
    ("init-from-a-file", [*TRAIN, "--init-from", "cache_file"],
     "checkpoint cache_file is a file, not a checkpoint directory", "give a step-N directory",
     False),
]


def make_inputs(folder: Path) -> None:
    (folder / "run_folder").mkdir()
    (folder / "run_folder" / "run.json").write_text(json.dumps({"id": "owner-1",
                                                                "created": 0.0}))
    (folder / "held_folder").mkdir()
    (folder / "held_folder" / "run.lock").write_text(json.dumps(
        {"run": "holder-1", "token": "t", "host": socket.gethostname(), "pid": os.getpid(),
         "beat": time.time()}))
    (folder / "hf_quoted").mkdir()
    (folder / "hf_quoted" / "config.json").write_text(json.dumps(
        {"architectures": ["LlamaForCausalLM"], "vocab_size": 256, "hidden_size": 64,
         "num_hidden_layers": 2, "num_attention_heads": "4", "num_key_value_heads": 4,
         "intermediate_size": 128, "max_position_embeddings": 128}))
    llama = {"architectures": ["LlamaForCausalLM"], "vocab_size": 256, "hidden_size": 64,
             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": None,
             "intermediate_size": 128, "max_position_embeddings": 128}
    for name, change in (("hf_null_eps", {"rms_norm_eps": None}),
                         ("hf_null_theta", {"rope_parameters": {"rope_theta": None}}),
                         ("hf_rope_text", {"rope_parameters": "default"}),
                         ("hf_no_heads", {"num_attention_heads": 0})):
        (folder / name).mkdir()
        (folder / name / "config.json").write_text(json.dumps({**llama, **change}))
    (folder / "cache_file").write_text("not a folder\n")
    (folder / "bom.toml").write_text("\ufeff[train]\nsteps = 1\n", encoding="utf-8")
    os.mkfifo(folder / "fifo.toml")
    (folder / "nan.toml").write_text("[optimizer]\nlr = nan\n")
    (folder / "c.jsonl").write_text('{"text": "one document"}\n{"text": "another"}\n')
    (folder / "empty.jsonl").write_text('{"text": ""}\n' * 20)
    (folder / "unindexed").mkdir()
    (folder / "unindexed" / "shard-00000.bin").write_bytes(bytes(64))
    (folder / "binary.jsonl").write_bytes(bytes(range(256)))
    (folder / "billion_layers.json").write_text(json.dumps(
        {"style": "gpt2", "vocab_size": 256, "n_layers": 10**9, "d_model": 64, "n_heads": 4,
         "d_ff": 256, "max_seq_len": 128}))
    (folder / "twice.json").write_text(
        '{"style": "gpt2", "vocab_size": 256, "n_layers": 2, "n_layers": 4, "d_model": 64, '
        '"n_heads": 4, "d_ff": 256, "max_seq_len": 128}')
    _checkpoints_and_weights(folder)


def _checkpoints_and_weights(folder: Path) -> None:
    """A 2-step run's checkpoint folder (ck), a copy with its step renamed, and its weights as
    Hugging Face directories: one with an integer tensor, one with a NaN."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    code, stderr = run_row([*TRAIN, "--steps", "2", "--checkpoint-dir", "ck"], folder, False)
    assert code == 0, stderr
    shutil.copytree(folder / "ck", folder / "renamed")
    (folder / "renamed" / "step-00000002").rename(folder / "renamed" / "step-00000009")
    code, stderr = run_row(["checkpoint", "export-hf", "ck", "hf"], folder, False)
    assert code == 0, stderr
    for name, spoil in (("hf_int", lambda t: (t * 100).to(torch.int32)),
                        ("hf_nan", lambda t: t.fill_(float("nan")))):
        shutil.copytree(folder / "hf", folder / name)
        tensors = load_file(folder / name / "model.safetensors")
        first = sorted(tensors)[0]
        tensors[first] = spoil(tensors[first])
        save_file(tensors, folder / name / "model.safetensors", metadata={"format": "pt"})
    shutil.copytree(folder / "ck", folder / "binary_config")
    (folder / "binary_config" / "step-00000002" / "config.toml").write_bytes(bytes(range(256)))
    vocab = {f"w{i}": i for i in range(300)}
    Tokenizer(WordLevel(vocab, unk_token="w0")).save(str(folder / "big_tokenizer.json"))


inputs, test_bad_input_is_one_line_with_a_hint = catalogue(ROWS, make_inputs, "bad_edges",
                                                           exit_code=2)


@pytest.mark.parametrize("environment,argv,message,hint", [
    ({"WORLD_SIZE": "4"}, [*TRAIN, "--nproc", "2"],
     "WORLD_SIZE=4 is set but RANK, MASTER_ADDR, MASTER_PORT are not", "start the run with "
     "torchrun"),
    # a whole torchrun world left in the shell: before, the run waited silently for peers
    ({"RANK": "0", "WORLD_SIZE": "4", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"},
     [*TRAIN, "--nproc", "2"], "--nproc 2 starts its own ranks, but WORLD_SIZE=4",
     "drop --nproc under torchrun"),
    ({"PARAXIS_DATA_CACHE": "cache_file"}, [*TRAIN, "--data", "c.jsonl"],
     "PARAXIS_DATA_CACHE cache_file is a file, not a folder", "choose another path"),
    ({"TORCHELASTIC_RESTART_COUNT": "x"}, TRAIN,
     "TORCHELASTIC_RESTART_COUNT='x' is not a restart count", "unset it"),
], ids=["world-size-alone", "a-leftover-torchrun-world", "data-cache-a-file",
        "restart-count-not-a-number"])
def test_what_the_environment_says_is_checked_in_one_line(inputs, monkeypatch, environment,
                                                          argv, message, hint):
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    check_row(inputs, argv, message, hint, SUB, exit_code=2)


def test_checkpoint_every_with_its_folder_still_trains(inputs):
    # the flag alone is refused above; with the folder it needs, the run saves as before
    code, stderr = run_row([*TRAIN, "--checkpoint-every", "1", "--checkpoint-dir", "ok_ck"],
                           inputs, False)
    assert code == 0, stderr
    assert (inputs / "ok_ck" / "run.json").is_file()


def test_checkpoint_info_takes_the_manifest_itself(inputs):
    # before: "does not exist" for a manifest.json that exists
    code, stderr = run_row(["checkpoint", "info", "ck/step-00000002/manifest.json"], inputs,
                           False)
    assert code == 0, stderr


@pytest.mark.parametrize("argv,flag", [
    (["report", "--run", "runs/x", "--out", "/proc/paraxis.html"], "--out"),
    (["demo", "--out", "/proc/paraxis"], "--out"),
    (["context", "--out", "/proc/paraxis"], "--out"),
    (["calibrate", "--out", "/proc/paraxis.json"], "--out"),
    ([*TRAIN, "--metrics-file", "/proc/paraxis/m.jsonl"], "--metrics-file"),
], ids=["report", "demo", "context", "calibrate", "train"])
def test_an_output_where_no_file_can_be_made_is_one_line(tmp_path, argv, flag):
    """/proc lets root 'write' by its permission bits, and refuses every new file: the
    commands that trusted the bits failed with a traceback, calibrate after measuring."""
    code, stderr = run_row(argv, tmp_path, False)
    assert code == 2 and stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
    assert f"{flag} /proc/paraxis" in stderr and "the kernel's proc file system" in stderr


def test_an_output_file_that_cannot_be_opened_stops_the_run_before_it_writes(tmp_path):
    """A --metrics-file that is a loop of links: train wrote config.toml beside it first,
    then failed with a traceback."""
    os.symlink("loop_b", tmp_path / "loop_a")
    os.symlink("loop_a", tmp_path / "loop_b")
    (tmp_path / "config.toml").write_text("an earlier run's\n")
    code, stderr = run_row([*TRAIN, "--metrics-file", "loop_a"], tmp_path, False)
    assert code == 2 and stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
    assert "--metrics-file loop_a cannot be written (Too many levels of symbolic links)" \
        in stderr
    assert (tmp_path / "config.toml").read_text() == "an earlier run's\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.toml", "loop_a", "loop_b"]


def test_the_kernels_file_systems_are_told_from_a_folder_that_holds_files():
    """/proc is refused by its type: an empty tmpfs or a ramfs has no blocks either, and
    holds files."""
    from paraxis.files.host import KERNEL_FILE_SYSTEMS, _file_system_type

    assert _file_system_type(Path("/proc")) == "proc"
    assert _file_system_type(Path("/proc/self")) == "proc"
    assert _file_system_type(Path.cwd()) not in KERNEL_FILE_SYSTEMS
