"""Real corpora: JSONL, Parquet and `datasets` sources prepared into token shards give the same
tokens, batches and losses; bad data is one line naming the file and row; nothing is left
behind by a failed prepare."""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from paraxis.cli import main
from paraxis.data.prepare import BYTE_END_OF_DOCUMENT, load_token_data, prepare, read_prepared
from paraxis.spec.errors import ParaxisError
from paraxis.train.config import RunConfig
from paraxis.train.loop import run_training

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

DOCS = [f"doc {i}: {'the quick brown fox ' * (i % 5 + 1)}{'é' * (i % 3)}" for i in range(120)]
DOCS[7] = ""  # an empty document is just its end-of-document token


def _jsonl(path, docs, field="text"):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as out:
        for doc in docs:
            out.write(json.dumps({field: doc, "meta": 1}) + "\n\n")  # blank lines are skipped
    return path


def _parquet_folder(folder, docs):
    folder.mkdir()
    half = len(docs) // 2  # two files of several row groups each
    pq.write_table(pa.table({"text": docs[:half]}), folder / "part-0.parquet", row_group_size=16)
    pq.write_table(pa.table({"text": docs[half:], "n": list(range(len(docs) - half))}),
                   folder / "part-1.parquet", row_group_size=25)
    return folder


@pytest.fixture
def sources(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("PARAXIS_DATA_CACHE", str(tmp_path / "cache"))
    saved = tmp_path / "saved"
    datasets.Dataset.from_dict({"text": DOCS}).save_to_disk(str(saved), num_shards=3)
    return {"jsonl": _jsonl(tmp_path / "c.jsonl.gz", DOCS),
            "parquet": _parquet_folder(tmp_path / "pq", DOCS), "datasets": saved}


def test_three_sources_give_the_same_tokens_batches_losses_and_resume(sources, tmp_path):
    expected = b"".join(d.encode() + bytes([BYTE_END_OF_DOCUMENT]) for d in DOCS)
    losses = {}

    def train(path, **flags):
        cfg = RunConfig.from_flags(model="tiny", data=str(path), steps=3, global_batch=4,
                                   seq_len=32, device="cpu", quiet=True, eval_every=0, **flags)
        return [r["loss"] for r in run_training(cfg)]

    for name, path in sources.items():
        data = load_token_data(str(path))
        assert data.tokens.tobytes() == expected, name
        for step in (0, 5):
            x, y = data.batch(step, 4, 32, seed=3)
            reference = load_token_data(str(sources["jsonl"])).batch(step, 4, 32, seed=3)
            assert np.array_equal(x, reference[0]) and np.array_equal(y, reference[1])
        losses[name] = train(path)
        split = str(tmp_path / "split" / name)  # resume after --exit-after, from each source
        assert train(path, checkpoint_dir=split, exit_after=1) == losses[name][:1], name
        assert train(path, checkpoint_dir=split, resume="auto") == losses[name][1:], name
    assert losses["jsonl"] == losses["parquet"] == losses["datasets"]
    assert len(list((tmp_path / "cache").iterdir())) == 3  # one cached preparation each
    first = sorted(sources["datasets"].glob("*.arrow"))[0]  # one Arrow file: its 40 rows
    expected = b"".join(d.encode() + b"\0" for d in DOCS[:40])
    assert load_token_data(str(first)).tokens.tobytes() == expected


def test_prepare_in_parallel_is_the_same_and_runs_once(sources, tmp_path):
    one = prepare(sources["parquet"], tmp_path / "one", workers=1)
    two = prepare(sources["parquet"], tmp_path / "two", workers=2)
    (a, index), (b, _) = read_prepared(one), read_prepared(two)
    assert np.array_equal(a, b) and index["documents"] == len(DOCS)
    assert len(index["shards"]) == 4 + 3  # row groups: 60 rows by 16, 60 by 25
    before = (one / "index.json").stat().st_mtime_ns
    assert prepare(sources["parquet"], one) == one  # same fingerprint: nothing to do
    assert (one / "index.json").stat().st_mtime_ns == before
    assert np.array_equal(load_token_data(str(one)).tokens, a)  # a prepared folder trains


def _word_tokenizer(tmp_path):
    """Five words, <|endoftext|> (id 1) a special token."""
    tokenizers = pytest.importorskip("tokenizers")
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(
        {"[UNK]": 0, "<|endoftext|>": 1, "a": 2, "cat": 3, "dog": 4}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(["<|endoftext|>"])
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    return str(tmp_path / "tokenizer.json")


def test_a_tokenizer_json_ends_documents_with_its_eos(tmp_path):
    source = _jsonl(tmp_path / "d.jsonl", ["a cat", "a dog dog", "cat"])
    out = prepare(source, tmp_path / "out", tokenizer=_word_tokenizer(tmp_path))
    tokens, index = read_prepared(out)
    assert tokens.tolist() == [2, 3, 1, 2, 4, 4, 1, 3, 1] and index["end_of_document"] == 1
    assert np.load(out / "shard-00000.docs.npy").tolist() == [3, 7, 9]


def test_a_tokenizer_without_an_end_of_document_token_is_refused(tmp_path, tiny_tokenizer):
    source = _jsonl(tmp_path / "d.jsonl", ["a cat"])
    with pytest.raises(ParaxisError, match="has no end-of-document token"):
        prepare(source, tmp_path / "out", tokenizer=tiny_tokenizer)
    assert not (tmp_path / "out").exists()


def _bad(tmp_path, case):
    """A source (or prepared folder) with one defect, and the words its error must say."""
    if case == "row without the field":
        path = tmp_path / "c.jsonl"
        path.write_text('{"text": "fine"}\n{"body": "no text"}\n')
        return path, f"{path} row 2 has no 'text' field"
    if case == "null text":
        path = _parquet_folder(tmp_path / "pq", ["x"] * 20 + [None] + ["y"] * 9)
        return path, f"{path / 'part-1.parquet'} row 6: 'text' is missing"  # 21st of 15 + 15
    if case == "parquet without the column":
        path = tmp_path / "p.parquet"
        pq.write_table(pa.table({"body": ["a", "b"]}), path)
        return path, f"{path} has no column 'text' (it has body)"
    if case == "empty shard":
        (tmp_path / "f").mkdir()
        _jsonl(tmp_path / "f" / "a.jsonl", ["doc"])
        (tmp_path / "f" / "b.jsonl").write_text("")
        return tmp_path / "f", f"{tmp_path / 'f' / 'b.jsonl'} is empty"
    if case == "row not UTF-8":
        path = tmp_path / "u.jsonl"
        path.write_bytes(b'{"text": "ok"}\n{"text": "\xff\xfe bad"}\n')
        return path, f"{path} row 2 is not UTF-8 (byte 0xff at column 11)"
    if case == "empty file":
        path = tmp_path / "e.jsonl"
        path.write_text("")
        return path, f"{path} is empty; give it documents\n"
    rows = {"lone surrogate": ('{"text": "bad \\ud800 here"}',
                               "row 2: 'text' holds a lone surrogate \\ud800"),
            "deep nesting": ('{"text": "x", "n": ' + "[" * 100_000 + "]" * 100_000 + "}",
                             "row 2 is nested too deeply to read as JSON"),
            "huge integer": ('{"text": "x", "n": ' + "9" * 5000 + "}",
                             "row 2 holds a number Python does not read")}
    if case in rows:
        path = tmp_path / "r.jsonl"
        path.write_text('{"text": "fine"}\n' + rows[case][0] + "\n")
        return path, f"{path} {rows[case][1]}"
    if case in ("state.json cut", "state.json entry without filename"):
        path = tmp_path / "ds"
        path.mkdir()
        (path / "dataset_info.json").write_text("{}")
        state = '{"_data_files": [{"filena' if case == "state.json cut" else \
            '{"_data_files": [{"name": "x.arrow"}]}'
        (path / "state.json").write_text(state)
        return path, (f"{path / 'state.json'} is not JSON" if case == "state.json cut" else
                      f"{path / 'state.json'} data file 1 has no 'filename'")
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["row without the field", "null text",
                                  "parquet without the column", "empty shard",
                                  "row not UTF-8", "empty file", "lone surrogate",
                                  "deep nesting", "huge integer", "state.json cut",
                                  "state.json entry without filename"])
def test_bad_data_is_one_line_naming_file_and_row(tmp_path, capsys, case):
    source, message = _bad(tmp_path, case)
    assert main(["data", "prepare", str(source), "--out", str(tmp_path / "out" / "x"),
                 "--workers", "2"]) == 2
    error = capsys.readouterr().err
    assert message in error and error.count("\n") == 1, error
    assert not (tmp_path / "out").exists()  # nothing written, not even the parent


@pytest.mark.parametrize("defect", ["empty", "beyond the vocabulary"])
def test_a_bad_prepared_shard_is_named(tmp_path, capsys, defect):
    source = _jsonl(tmp_path / "c.jsonl", ["a cat", "a dog dog", "cat"] * 50)
    out = prepare(source, tmp_path / "out", tokenizer=_word_tokenizer(tmp_path))
    shard = out / "shard-00000.bin"
    if defect == "empty":
        shard.write_bytes(b"")
        message = f"shard {shard} is empty"
    else:
        tokens = np.memmap(shard, dtype=np.uint16, mode="r+")
        tokens[5] = 60_000  # in the second document ("a dog dog" starts at token 3)
        tokens.flush()
        message = f"shard {shard} document 2 (token 5) holds id 60000, beyond the vocabulary"
    assert main(["train", "--data", str(out), "--steps", "1", "--quiet"]) == 2
    error = capsys.readouterr().err
    assert message in error and error.count("\n") == 1, error


def test_resume_from_a_raw_source_is_bit_identical(tmp_path, monkeypatch):
    monkeypatch.setenv("PARAXIS_DATA_CACHE", str(tmp_path / "cache"))
    source = str(_jsonl(tmp_path / "c.jsonl", DOCS))

    def train(directory, **options):
        cfg = RunConfig.from_flags(model="tiny", data=source, steps=4, global_batch=4,
                                   seq_len=32, device="cpu", quiet=True, eval_every=0,
                                   checkpoint_dir=str(tmp_path / directory), **options)
        return [r["loss"] for r in run_training(cfg)]

    straight = train("straight")
    assert train("split", exit_after=2) == straight[:2]
    assert train("split", resume="auto") == straight[2:]


def test_a_prepared_folder_refuses_another_tokenizer(tmp_path):
    tokenizer = _word_tokenizer(tmp_path)
    out = prepare(_jsonl(tmp_path / "c.jsonl", ["a cat"] * 5), tmp_path / "out")
    with pytest.raises(ParaxisError, match="was prepared with byte-level, not .*tokenizer.json"):
        load_token_data(str(out), tokenizer=tokenizer)
    again = prepare(tmp_path / "c.jsonl", tmp_path / "words", tokenizer=tokenizer)
    assert load_token_data(str(again), tokenizer=tokenizer).tokens.tolist()[:3] == [2, 3, 1]


def test_a_lone_surrogate_is_one_line_with_a_tokenizer_too(tmp_path, capsys):
    source, message = _bad(tmp_path, "lone surrogate")
    assert main(["data", "prepare", str(source), "--out", str(tmp_path / "out"),
                 "--tokenizer", _word_tokenizer(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert message in error and error.count("\n") == 1, error


def test_a_utf8_byte_order_mark_is_not_text(tmp_path):
    source = tmp_path / "bom.jsonl"
    source.write_bytes(b"\xef\xbb\xbf" + b'{"text": "ab"}\n{"text": "c"}\n')
    tokens, _ = read_prepared(prepare(source, tmp_path / "out"))
    assert tokens.tobytes() == b"ab\0c\0"


@pytest.mark.parametrize("name", ["tokens.npy", "c.jsonl.zst", "c.jsonl.bz2", "C.JSONL",
                                  "notes"])
def test_a_single_file_of_no_known_format_is_refused(tmp_path, capsys, name):
    (tmp_path / name).write_bytes(b'{"text": "not read as bytes"}\n' * 400)
    assert main(["train", "--data", str(tmp_path / name), "--steps", "1", "--quiet",
                 "--device", "cpu"]) == 2
    error = capsys.readouterr().err
    assert f"data {tmp_path / name} is not in a format paraxis reads; give a .bin token " \
        "file, a .txt/.md/.py text file" in error and error.count("\n") == 1, error
