"""What a resumed run shares with its checkpoint: the part of each source training draws
from (all but the tail, or the whole beside --val-data), and a blend of token files and text
under --tokenizer told how to prepare the text."""

from __future__ import annotations

import json

import numpy as np
import pytest

from paraxis.cli import main
from paraxis.data.blend import load_blend
from paraxis.files.checkpoint_ownership import data_facts


def _jsonl(path, docs):
    path.write_text("".join(json.dumps({"text": doc}) + "\n" for doc in docs))
    return path


@pytest.fixture
def sources(tmp_path, monkeypatch):
    monkeypatch.setenv("PARAXIS_DATA_CACHE", str(tmp_path / "cache"))
    return {name: str(_jsonl(tmp_path / f"{name}.jsonl", [f"{name} {i} " * (i % 7 + 1)
                                                           for i in range(200)]))
            for name in ("train", "val_a", "val_b")}


def _train(folder, data, *flags):
    return main(["train", "--model", "tiny", "--data", data, "--steps", "3",
                 "--global-batch", "4", "--seq-len", "32", "--device", "cpu", "--quiet",
                 "--warmup", "0", "--eval-every", "2", "--eval-batches", "1",
                 "--checkpoint-dir", str(folder), *flags])


def test_a_resume_that_adds_or_drops_val_data_is_refused(sources, tmp_path, capsys):
    plain = tmp_path / "plain"
    assert _train(plain, sources["train"], "--exit-after", "1") == 0
    assert _train(plain, sources["train"], "--resume", "auto",
                  "--val-data", sources["val_a"]) == 2
    error = capsys.readouterr().err
    assert "--val-data given (checkpoint: without --val-data" in error \
        and error.count("\n") == 1, error

    beside = tmp_path / "beside"
    assert _train(beside, sources["train"], "--val-data", sources["val_a"],
                  "--exit-after", "1") == 0
    assert _train(beside, sources["train"], "--resume", "auto") == 2
    error = capsys.readouterr().err
    assert "--val-data left out (checkpoint: with --val-data" in error, error
    # another held-out set leaves the training samples as they were
    assert _train(beside, sources["train"], "--resume", "auto",
                  "--val-data", sources["val_b"]) == 0


def test_without_val_data_the_facts_are_those_of_the_source(sources):
    blend = load_blend(sources["train"])
    source = blend.sources[0]
    assert blend.facts() == data_facts(source.tokens, source.name)
    blend.val = load_blend(sources["val_a"])
    beside = blend.facts()
    assert beside["train_span"] == "all" and beside["tokens"] == len(source.tokens)
    assert beside["fingerprint"] != data_facts(source.tokens, source.name)["fingerprint"]
    blend.val = load_blend(sources["val_b"])
    assert blend.facts() == beside


def test_a_blend_of_tokens_and_text_under_a_tokenizer_says_to_prepare_the_text(
        sources, tmp_path, tiny_tokenizer, capsys):
    tokens = tmp_path / "tokens.bin"
    np.arange(5000, dtype=np.uint16).__mod__(90).astype(np.uint16).tofile(tokens)
    assert main(["train", "--data", f"{tokens}:0.5,{sources['train']}:0.5", "--tokenizer",
                 tiny_tokenizer, "--steps", "1", "--quiet", "--device", "cpu"]) == 2
    error = capsys.readouterr().err
    assert f"--tokenizer {tiny_tokenizer} cannot apply to {tokens}, which already holds " \
        f"token ids; prepare {sources['train']} with it first (paraxis data prepare SRC " \
        f"--tokenizer {tiny_tokenizer} --out DIR)" in error and error.count("\n") == 1, error
