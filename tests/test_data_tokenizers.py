"""A Hugging Face tokenizer on training data: a special token's text in a document is text,
not the token; the end-of-document id a tokenizer_config.json chooses is part of what a
prepared source depends on; a damaged tokenizer_config.json is one line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from paraxis.cli import main
from paraxis.data.corpus import HFTokenizer, TokenData
from paraxis.data.prepare import load_token_data, prepare, read_prepared
from paraxis.spec.errors import ParaxisError

VOCAB = {"[UNK]": 0, "<|endoftext|>": 1, "</s>": 2, "a": 3, "cat": 4, "dog": 5}


@pytest.fixture
def tokenizer(tmp_path):
    """Four words and two special tokens, <|endoftext|> (id 1) and </s> (id 2)."""
    tokenizers = pytest.importorskip("tokenizers")
    words = tokenizers.Tokenizer(tokenizers.models.WordLevel(VOCAB, unk_token="[UNK]"))
    words.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    words.add_special_tokens(["<|endoftext|>", "</s>"])
    folder = tmp_path / "tok"
    folder.mkdir()
    words.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


def _jsonl(path, docs):
    path.write_text("".join(json.dumps({"text": doc}) + "\n" for doc in docs))
    return path


def test_a_special_tokens_text_in_a_document_is_text(tmp_path, tokenizer):
    source = _jsonl(tmp_path / "d.jsonl", ["a <|endoftext|> cat", "dog </s>"])
    tokens, index = read_prepared(prepare(source, tmp_path / "out", tokenizer=str(tokenizer)))
    tokens = tokens.tolist()
    ends = np.load(tmp_path / "out" / "shard-00000.docs.npy")
    assert index["end_of_document"] == 1 and tokens.count(1) == 2  # the two ends only
    assert [tokens[end - 1] for end in ends] == [1, 1] and 2 not in tokens
    text = tmp_path / "t.txt"  # the on-the-fly path of text files reads it the same way
    text.write_text("a <|endoftext|> cat </s>")
    assert not {1, 2} & set(TokenData.load(str(text), tokenizer=str(tokenizer)).tokens.tolist())
    # a prompt still reads special tokens' text as the tokens
    assert HFTokenizer(tokenizer).encode("a </s>", special=True).tolist() == [3, 2]


def test_the_configured_end_of_document_is_part_of_the_fingerprint(tmp_path, tokenizer,
                                                                  monkeypatch):
    monkeypatch.setenv("PARAXIS_DATA_CACHE", str(tmp_path / "cache"))
    source = str(_jsonl(tmp_path / "d.jsonl", ["a cat", "dog"] * 200))
    config = tokenizer.parent / "tokenizer_config.json"
    config.write_text(json.dumps({"eos_token": "</s>"}))
    assert load_token_data(source, tokenizer=str(tokenizer)).end_of_document == 2
    prepare(source, tmp_path / "out", tokenizer=str(tokenizer))
    config.write_text(json.dumps({"eos_token": {"content": "<|endoftext|>"}}))
    data = load_token_data(source, tokenizer=str(tokenizer))  # prepared again, not reused
    assert data.end_of_document == 1 and data.tokens.tolist()[:3] == [3, 4, 1]
    assert len(list((tmp_path / "cache").iterdir())) == 2
    with pytest.raises(ParaxisError, match="holds tokens prepared from another source, "
                                           "tokenizer or text field"):
        prepare(source, tmp_path / "out", tokenizer=str(tokenizer))


@pytest.mark.parametrize("config, message", [
    ('{"eos_token": ', "tokenizer_config.json is not JSON (Expecting value"),
    ('{"eos_token": ["</s>"]}', "tokenizer_config.json: eos_token is list, not a token's text"),
])
def test_a_damaged_tokenizer_config_is_one_line(tmp_path, tokenizer, capsys, config, message):
    (tokenizer.parent / "tokenizer_config.json").write_text(config)
    source = _jsonl(tmp_path / "d.jsonl", ["a cat"])
    assert main(["data", "prepare", str(source), "--out", str(tmp_path / "out"),
                 "--tokenizer", str(tokenizer)]) == 2
    error = capsys.readouterr().err
    assert f"{tokenizer.parent / message.split(' ')[0]}" in error and message in error
    assert error.count("\n") == 1 and not (tmp_path / "out").exists(), error
