"""Data sources as users hand them over: mixed tokenizers and mixed folders refused in one
line, copies of a dataset kept apart in the cache, damaged or interrupted prepares repaired
or cleaned up, and the data position a checkpoint records."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from paraxis.cli import main
from paraxis.data.blend import parse_blend
from paraxis.data.prepare import load_token_data, prepare, read_prepared
from paraxis.spec.errors import ParaxisError

DOCS = [f"doc {i}: {'the quick brown fox ' * (i % 5 + 1)}" for i in range(200)]
TRAIN = ["--steps", "1", "--seq-len", "16", "--global-batch", "2", "--quiet", "--device", "cpu"]


def _jsonl(path: Path, docs: list[str] = DOCS) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    return path


def _word_tokenizer(folder: Path) -> str:
    tokenizers = pytest.importorskip("tokenizers")
    words = {w for d in DOCS for w in d.replace(":", " ").split()}
    vocab = {"<|endoftext|>": 0, "[UNK]": 1, **{w: i + 2 for i, w in enumerate(sorted(words))}}
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(["<|endoftext|>"])
    path = folder / "tokenizer.json"
    tokenizer.save(str(path))
    return str(path)


def _one_line_error(capsys: pytest.CaptureFixture, *args: str) -> str:
    assert main(list(args)) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1, error
    return error


def test_sources_of_different_tokenizers_are_not_blended(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PARAXIS_DATA_CACHE", str(tmp_path / "cache"))
    raw = _jsonl(tmp_path / "a.jsonl")
    words = prepare(raw, tmp_path / "words", tokenizer=_word_tokenizer(tmp_path))
    as_bytes = prepare(raw, tmp_path / "bytes")
    for data in (f"{as_bytes}:0.5,{words}:0.5", f"{raw}:0.5,{words}:0.5"):
        error = _one_line_error(capsys, "train", "--data", data, *TRAIN)
        assert "hold the ids of different tokenizers; tokenize every source with one" in error
    error = _one_line_error(capsys, "train", "--data", str(raw), "--val-data", str(words),
                            "--eval-every", "1", *TRAIN)
    assert f"{words} (prepared, tokenizer {tmp_path / 'tokenizer.json'}) (--val-data)" in error
    # one tokenizer throughout: a raw source and a prepared folder blend
    assert main(["train", "--data", f"{raw}:0.5,{as_bytes}:0.5", *TRAIN]) == 0


def test_a_folder_of_two_kinds_of_data_is_refused_not_half_read(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    folder = tmp_path / "mixed"
    _jsonl(folder / "a.jsonl")
    pq.write_table(pa.table({"text": DOCS}), folder / "b.parquet")
    with pytest.raises(ParaxisError, match="holds Parquet files .* and JSON lines files"):
        prepare(folder, tmp_path / "out")
    (folder / "b.parquet").unlink()
    for name in ("book.txt", "c.JSONL", "d.jsonl.zst"):
        (folder / name).write_text("text that would be skipped\n")
        with pytest.raises(ParaxisError, match=f"holds jsonl files and {folder / name} "
                                               r"\(1 such\), which would not be read"):
            prepare(folder, tmp_path / "out")
        (folder / name).unlink()
    (folder / "README.md").write_text("# a dataset card, not data\n")
    (folder / "index.json").write_text('{"files": ["a.jsonl"]}')  # the dataset's manifest
    tokens, _ = read_prepared(prepare(folder, tmp_path / "out"))
    assert len(tokens) == len("".join(DOCS).encode()) + len(DOCS)
    # the folder itself reads as the JSONL source it is, not as a damaged prepared folder
    assert len(load_token_data(str(folder)).tokens) == len(tokens)


def test_copies_of_a_dataset_with_the_same_names_sizes_and_times_are_kept_apart(
        tmp_path, monkeypatch):
    monkeypatch.setenv("PARAXIS_DATA_CACHE", str(tmp_path / "cache"))
    first = _jsonl(tmp_path / "x" / "train.jsonl")
    second = _jsonl(tmp_path / "y" / "train.jsonl", [d.replace("quick", "QUICK") for d in DOCS])
    os.utime(second, ns=(first.stat().st_atime_ns, first.stat().st_mtime_ns))  # as cp -p
    assert first.stat().st_size == second.stat().st_size
    read = [bytes(load_token_data(str(p)).tokens[:40]).decode() for p in (first, second)]
    assert "quick" in read[0] and "QUICK" in read[1]


def test_preparing_again_repairs_a_damaged_folder(tmp_path, capsys):
    source = _jsonl(tmp_path / "a.jsonl")
    out = prepare(source, tmp_path / "out")
    whole, _ = read_prepared(out)
    expected = whole.tobytes()
    shard = out / "shard-00000.bin"
    shard.write_bytes(shard.read_bytes()[:1000])  # a crash, or a copy cut short
    error = _one_line_error(capsys, "train", "--data", str(out), *TRAIN)
    assert f"prepare the source again with `paraxis data prepare SOURCE --out {out}`" in error
    assert main(["data", "prepare", str(source), "--out", str(out)]) == 0
    assert read_prepared(out)[0].tobytes() == expected
    assert not [p for p in out.iterdir() if p.name.startswith(".")]


def test_the_working_folder_or_a_link_names_the_output(tmp_path, monkeypatch):
    source = _jsonl(tmp_path / "a.jsonl")
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    assert main(["data", "prepare", str(source), "--out", "."]) == 0
    assert (here / "index.json").is_file() and Path.cwd() == here
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "linked").symlink_to(target)
    assert main(["data", "prepare", str(source), "--out", str(tmp_path / "linked")]) == 0
    assert (tmp_path / "linked").is_symlink() and (target / "index.json").is_file()
    assert read_prepared(target)[0].tobytes() == read_prepared(here)[0].tobytes()


def test_a_damaged_index_entry_is_one_line(tmp_path, capsys):
    out = prepare(_jsonl(tmp_path / "a.jsonl"), tmp_path / "out")
    index = json.loads((out / "index.json").read_text())
    del index["shards"][0]["tokens"]
    (out / "index.json").write_text(json.dumps(index))
    error = _one_line_error(capsys, "train", "--data", str(out), *TRAIN)
    assert "index.json is not a paraxis token index (KeyError: 'tokens')" in error
    index["shards"][0]["tokens"] = index["tokens"]
    index["vocab_size"] = 50  # ids beyond it, and no document ends to name the document
    (out / "index.json").write_text(json.dumps(index))
    (out / "shard-00000.docs.npy").unlink()
    error = _one_line_error(capsys, "train", "--data", str(out), *TRAIN)
    assert "shard-00000.bin token 0 holds id 100, beyond the vocabulary of 50" in error


def test_a_default_data_cache_that_cannot_be_made_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("PARAXIS_DATA_CACHE", raising=False)
    source = _jsonl(tmp_path / "a.jsonl")
    monkeypatch.setenv("XDG_CACHE_HOME", str(source))  # a file, not a folder
    error = _one_line_error(capsys, "train", "--data", str(source), *TRAIN)
    assert "the data cache (set PARAXIS_DATA_CACHE to another folder)" in error


def test_blend_weights_near_the_float_limit_are_read_as_their_ratio():
    assert parse_blend("a:1e308,b:1e308") == [("a", 0.5), ("b", 0.5)]
    weights = [w for _, w in parse_blend("a:1.7e308,b:1.7e308,c:3.4e307")]
    assert weights == pytest.approx([5 / 11, 5 / 11, 1 / 11])


def test_samples_seen_counts_each_steps_own_batch(tmp_path):
    source = str(_jsonl(tmp_path / "a.jsonl"))
    run = ["train", "--data", source, "--steps", "4", "--seq-len", "16", "--quiet",
           "--device", "cpu", "--checkpoint-dir", str(tmp_path / "ck")]
    assert main([*run, "--global-batch", "2", "--exit-after", "2"]) == 0
    assert main([*run, "--global-batch", "4", "--resume", "auto",
                 "--allow-resume-changes"]) == 0
    seen = {step: json.loads((tmp_path / "ck" / f"step-{step:08d}" / "manifest.json")
                             .read_text())["data"]["samples_seen"] for step in (2, 4)}
    assert seen == {2: 4, 4: 4 + 2 * 4}


def test_a_terminated_prepare_leaves_nothing_and_an_abandoned_one_is_removed(tmp_path):
    source = tmp_path / "big.jsonl"
    source.write_text("".join(json.dumps({"text": f"lorem ipsum dolor {i} " * 8}) + "\n"
                              for i in range(300_000)))
    out = tmp_path / "out"
    code = ("import sys; from paraxis.data.prepare import prepare; "
            "prepare(sys.argv[1], sys.argv[2])")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    process = subprocess.Popen([sys.executable, "-c", code, str(source), str(out)], env=env)
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob(".out.tmp-*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(tmp_path.glob(".out.tmp-*")), "the prepare never started"
    process.send_signal(signal.SIGTERM)
    assert process.wait(60) == 128 + signal.SIGTERM
    assert not list(tmp_path.glob(".out.tmp-*")) and not out.exists()
    # a prepare killed outright (SIGKILL) cannot clean up: the next one on its host does
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    abandoned = tmp_path / f".small.tmp-{socket.gethostname()}-{dead.pid}-0123abcd"
    abandoned.mkdir()
    (abandoned / "shard-00000.bin").write_bytes(b"partial")
    prepare(_jsonl(tmp_path / "small.jsonl"), tmp_path / "small")
    assert not abandoned.exists() and (tmp_path / "small" / "index.json").is_file()
