"""Text data through a Hugging Face tokenizer.json (--tokenizer, [data] tokenizer), and the
byte-level default left as it was."""

import argparse

import numpy as np
import pytest

from paraxis.data.corpus import ByteTokenizer, HFTokenizer, TokenData
from paraxis.spec.errors import ParaxisError
from paraxis.train.config import RunConfig
from paraxis.train.flags import add_arguments, config_from_args
from paraxis.train.loop import run_training
from paraxis.train.run_file import read_run_file, to_toml

pytest.importorskip("tokenizers")

DOCS = {"b.txt": "the dog sat on the log in the sun\n" * 8,
        "a.md": "a cat and a dog ran to the hat\n" * 8,
        "skip.json": "not text data"}


@pytest.fixture
def text_folder(tmp_path):
    folder = tmp_path / "corpus"
    (folder / "sub").mkdir(parents=True)
    for name, text in DOCS.items():
        (folder / ("sub" if name == "b.txt" else "") / name).write_text(text)
    return folder


def test_a_folder_is_tokenised_file_by_file_in_name_order(text_folder, tiny_tokenizer):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(tiny_tokenizer)
    expected = [*tokenizer.encode(DOCS["a.md"], add_special_tokens=False).ids,
                *tokenizer.encode(DOCS["b.txt"], add_special_tokens=False).ids]
    data = TokenData.load(str(text_folder), tokenizer=tiny_tokenizer)
    assert data.tokens.dtype == np.uint16 and data.tokens.tolist() == expected
    assert len(expected) < len(DOCS["a.md"] + DOCS["b.txt"]) / 2  # words, not bytes
    text = HFTokenizer(tiny_tokenizer).decode(data.tokens[:6])
    assert text == "a cat and a dog ran"


def test_without_a_tokenizer_text_is_still_bytes(text_folder):
    data = TokenData.load(str(text_folder))
    assert data.tokens.tolist() == list((DOCS["a.md"] + DOCS["b.txt"]).encode())
    assert ByteTokenizer().decode(data.tokens[:5]) == "a cat"


@pytest.mark.parametrize("source,tokenizer,message", [
    ("tokens.bin", "TOKENIZER", "already holds token ids; --tokenizer applies to text"),
    ("CORPUS", "/nowhere/tokenizer.json", "tokenizer /nowhere/tokenizer.json does not exist"),
    ("CORPUS", "BROKEN", "is not a valid tokenizer.json"),
])
def test_bad_tokenizer_input_is_one_line(text_folder, tiny_tokenizer, tmp_path, source,
                                         tokenizer, message):
    (tmp_path / "tokens.bin").write_bytes(np.arange(100, dtype=np.uint16).tobytes())
    (tmp_path / "broken.json").write_text('{"model": 3}')
    source = str(text_folder) if source == "CORPUS" else str(tmp_path / source)
    tokenizer = {"TOKENIZER": tiny_tokenizer,
                 "BROKEN": str(tmp_path / "broken.json")}.get(tokenizer, tokenizer)
    with pytest.raises(ParaxisError, match=message) as error:
        TokenData.load(source, tokenizer=tokenizer)
    assert "\n" not in str(error.value)


def test_run_file_key_and_flag(tmp_path):
    run_file = tmp_path / "run.toml"
    run_file.write_text('[data]\npath = "corpus"\ntokenizer = "tok/tokenizer.json"\n')
    assert read_run_file(run_file).data.tokenizer == "tok/tokenizer.json"
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    cfg = config_from_args(parser.parse_args(["--config", str(run_file)]))
    assert cfg.data.tokenizer == "tok/tokenizer.json"
    flag = config_from_args(parser.parse_args(["--config", str(run_file), "--tokenizer",
                                               "other.json"]))
    assert flag.data.tokenizer == "other.json"
    run_file.write_text(to_toml(cfg))
    assert config_from_args(parser.parse_args(["--config", str(run_file)])) == cfg


def test_training_on_tokenised_text(text_folder, tiny_tokenizer):
    cfg = RunConfig.from_flags(model="tiny", data=str(text_folder), tokenizer=tiny_tokenizer,
                               steps=3, global_batch=2, seq_len=16, device="cpu", quiet=True)
    records = run_training(cfg)
    assert len(records) == 3 and all(np.isfinite(r["loss"]) for r in records)


@pytest.mark.parametrize("seq_len", [1, 16, 32, 127])
@pytest.mark.parametrize("held_out", [True, False])
def test_the_fewest_tokens_leave_every_part_a_window(seq_len, held_out):
    """`check` asks for exactly the tokens every part `starts` draws from needs: with that
    many, training (and with evaluation the held-out tail) draw windows; with one fewer it
    says so in one line instead of numpy failing in the middle of a run."""
    needed = TokenData(np.zeros(1, dtype=np.uint16)).tokens_needed(seq_len, held_out=held_out)
    enough = TokenData(np.arange(needed, dtype=np.uint16))
    enough.check(65536, seq_len, held_out=held_out)
    for part in ("train", "val") if held_out else ("train",):
        enough.batch(0, 4, seq_len, seed=0, split=part)
    short = TokenData(np.arange(needed - 1, dtype=np.uint16))
    with pytest.raises(ParaxisError, match=f"it needs {needed}"):
        short.check(65536, seq_len, held_out=held_out)
    if held_out:  # the tail is what was missing: 103 tokens passed at seq_len 32 before
        assert needed > TokenData(np.zeros(1)).tokens_needed(seq_len, held_out=False)

