"""Token data: the embedded corpus, token files, and deterministic sample positions.

Sampling is a pure function of (seed, step): every rank computes the same global batch's
window starts and reads only its own rows of it (`paraxis.data.loader`), so a run resumed at step
s sees exactly the samples an uninterrupted run would, and every layout trains on the same
tokens as one device.
"""

from __future__ import annotations

import functools
import hashlib
import math
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from paraxis.data.tokens import TokenShards
from paraxis.spec.errors import ParaxisError

BYTE_VOCAB = 256
TOKEN_DTYPES = {"uint8": np.uint8, "uint16": np.uint16, "uint32": np.uint32}
TEXT_SUFFIXES = (".txt", ".md", ".py")  # text files read whole, alone or in a folder
FORMATS = ("a .bin token file, a .txt/.md/.py text file or folder of them, a .jsonl / "
           ".jsonl.gz, .parquet or .arrow file or folder, a datasets directory, a folder of "
           "`paraxis data prepare`, or 'embedded'")


class ByteTokenizer:
    """Text <-> UTF-8 bytes; vocabulary of 256, nothing to download."""

    vocab_size = BYTE_VOCAB

    def encode(self, text: str, special: bool = False) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)

    def decode(self, tokens: list[int] | np.ndarray) -> str:
        return bytes(int(t) for t in tokens).decode("utf-8", errors="replace")

    def __str__(self) -> str:
        return "byte-level"


class HFTokenizer:
    """A Hugging Face `tokenizer.json`, run by the `tokenizers` library (imported lazily:
    only runs that ask for one need it)."""

    def __init__(self, path: str | Path) -> None:
        path = Path(path)
        if path.is_dir():
            path = path / "tokenizer.json"
        if not path.is_file():
            raise ParaxisError(f"tokenizer {path} does not exist; give a Hugging Face "
                               "tokenizer.json (or the folder holding one)")
        try:
            from tokenizers import Tokenizer  # lazy: tokenizers, only for a tokenizer.json
        except ImportError:
            raise ParaxisError("a tokenizer.json needs the tokenizers package: "
                               "pip install tokenizers") from None
        try:
            self._tokenizer = Tokenizer.from_file(str(path))
        except Exception as error:  # noqa: BLE001 - the Rust side raises plain Exception
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise ParaxisError(f"tokenizer {path} is not a valid tokenizer.json: "
                               f"{reason}") from None
        self.path = path
        self.vocab_size = self._tokenizer.get_vocab_size(with_added_tokens=True)
        self.dtype = np.uint16 if self.vocab_size <= 2**16 else np.uint32

    def encode(self, text: str, special: bool = False) -> np.ndarray:
        """Token ids. Training data (`special` False) is all text: a special token's text in it
        (say "</s>") is encoded as those characters, not as the special id, which would end
        a document in its middle. A prompt (`special` True) reads special tokens' text as
        those tokens and gets what the tokenizer's post-processor adds (e.g. BOS), as a model
        trained with them needs."""
        self._tokenizer.encode_special_tokens = not special
        ids = self._tokenizer.encode(text, add_special_tokens=special).ids
        return np.asarray(ids, dtype=self.dtype)

    def encode_many(self, texts: list[str]) -> np.ndarray:
        """Documents concatenated, as training data, all text as `encode` reads it (batch
        encoding runs in parallel)."""
        self._tokenizer.encode_special_tokens = True
        encodings = self._tokenizer.encode_batch(texts, add_special_tokens=False)
        return np.asarray([i for e in encodings for i in e.ids], dtype=self.dtype)

    def decode(self, tokens: list[int] | np.ndarray) -> str:
        return self._tokenizer.decode([int(t) for t in tokens], skip_special_tokens=True)

    def __str__(self) -> str:
        return f"tokenizer {self.path}"


def load_tokenizer(path: str | Path | None) -> ByteTokenizer | HFTokenizer:
    """`None` -> the byte-level tokenizer; a tokenizer.json (or its folder) -> that one."""
    return ByteTokenizer() if path in (None, "") else HFTokenizer(path)


def tokenizer_hash(tokenizer: ByteTokenizer | HFTokenizer) -> str:
    """What identifies a tokenizer: its file's contents, wherever it lies."""
    if isinstance(tokenizer, ByteTokenizer):
        return "byte-level"
    return hashlib.sha256(tokenizer.path.read_bytes()).hexdigest()


@functools.cache
def embedded_corpus(max_bytes: int = 4_000_000) -> np.ndarray:
    """The Python standard library's own sources, as bytes: text that exists on every
    machine with Python, so the demo needs no download. Read once a process (a tenth of a
    second); the array is read-only."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    chunks, total = [], 0
    for path in sorted(stdlib.glob("*.py")):
        data = path.read_bytes()
        chunks.append(data)
        total += len(data)
        if total >= max_bytes:
            break
    if total < 10_000:
        raise ParaxisError(f"found only {total} bytes of Python sources under {stdlib}; give a "
                           "data file with --data")
    return np.frombuffer(b"".join(chunks)[:max_bytes], dtype=np.uint8)


CHUNK_TOKENS = 1 << 24  # 16M tokens (32 MB of uint16) per pass of the vocabulary check


def largest_token(tokens: np.ndarray) -> tuple[int, int]:
    """The largest id in the whole array and its first position, one vectorized max per
    16M-token chunk (a memory-mapped file is read once, in order: 1 GB of uint16 in 0.09 s
    from the page cache here), so an id beyond the vocabulary anywhere fails before
    training, not mid-run."""
    top, where = -1, 0
    for lo in range(0, len(tokens), CHUNK_TOKENS):
        chunk = np.asarray(tokens[lo:lo + CHUNK_TOKENS])
        peak = int(chunk.max())
        if peak > top:
            top, where = peak, lo + int(chunk.argmax())
    return top, where


@dataclass
class TokenData:
    """A sequence of token ids (`TokenShards`: one array or many memory-mapped shards) with
    a held-out tail for evaluation; `end_of_document`: the id ending each document, when known
    (prepared sources), for packing; `tokenizer`: what made the ids (`tokenizer_hash`), None
    for a token file, which does not say."""

    tokens: TokenShards
    name: str = "tokens"
    val_fraction: float = 0.05
    end_of_document: int | None = None
    tokenizer: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.tokens, TokenShards):
            self.tokens = TokenShards([np.asarray(self.tokens)])

    @classmethod
    def load(cls, source: str | None, dtype: str = "uint16",
             tokenizer: str | None = None) -> TokenData:
        """`None` or "embedded" -> the stdlib corpus; a `.bin` file -> memory-mapped token ids
        (the nanoGPT format); a `.txt` / `.md` / `.py` file or a folder of them -> text,
        byte-tokenised or tokenised by `tokenizer` (a Hugging Face tokenizer.json) when given;
        any other file is refused."""
        if dtype not in TOKEN_DTYPES:
            raise ParaxisError(f"token dtype {dtype!r} is unknown; use one of "
                               f"{', '.join(TOKEN_DTYPES)}")
        if source in (None, "", "embedded"):
            if tokenizer:
                text = embedded_corpus().tobytes().decode("utf-8", errors="replace")
                made = load_tokenizer(tokenizer)
                return cls(made.encode_many([text]), f"embedded stdlib corpus ({tokenizer})",
                           tokenizer=tokenizer_hash(made))
            return cls(embedded_corpus(), "embedded stdlib corpus", tokenizer="byte-level")
        path = Path(source)
        if not path.exists():
            raise ParaxisError(f"data {path} does not exist; give an existing .bin token file, "
                               "text file or folder, JSONL or Parquet source, folder of `paraxis "
                               "data prepare`, or 'embedded'")
        if not path.is_dir() and path.suffix not in (".bin", *TEXT_SUFFIXES):
            # read as text, anything else (.npy, .jsonl.zst, X.JSONL) would train on its bytes
            raise ParaxisError(f"data {path} is not in a format paraxis reads; give {FORMATS} "
                               "(suffixes are case-sensitive)")
        if path.suffix == ".bin" and tokenizer:
            raise ParaxisError(f"data {path} already holds token ids; --tokenizer applies to "
                               "text data only, leave it out")
        if path.is_dir() or path.suffix != ".bin":
            return cls._text(path, load_tokenizer(tokenizer))
        itemsize = np.dtype(TOKEN_DTYPES[dtype]).itemsize
        size = path.stat().st_size
        if size == 0:
            raise ParaxisError(f"data {path} is empty; give a token file that holds tokens")
        if size % itemsize:
            raise ParaxisError(f"data {path} has {size} bytes, not a whole number of "
                               f"{dtype} tokens; check --data-dtype")
        tokens = np.memmap(path, dtype=TOKEN_DTYPES[dtype], mode="r")
        return cls(TokenShards([tokens]), str(path))

    @classmethod
    def _text(cls, path: Path, tokenizer: ByteTokenizer | HFTokenizer) -> TokenData:
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in
                           TEXT_SUFFIXES)
            if not files and any(path.glob("shard-*.bin")):  # `data prepare`'s, unindexed
                raise ParaxisError(f"data folder {path} holds prepared shards but no "
                                   "index.json (an interrupted prepare?); prepare the source "
                                   "again with paraxis data prepare")
            if not files:
                raise ParaxisError(f"data folder {path} holds no .txt/.md/.py files; put text "
                                   "files in it or give a .bin token file")
        else:
            files = [path]
        if isinstance(tokenizer, ByteTokenizer):  # the bytes are the tokens: no decoding
            tokens = np.frombuffer(b"".join(p.read_bytes() for p in files), dtype=np.uint8)
        else:
            tokens = tokenizer.encode_many([p.read_text(encoding="utf-8", errors="replace")
                                            for p in files])
        return cls(tokens, f"{path} ({tokenizer})", tokenizer=tokenizer_hash(tokenizer))

    def check(self, vocab_size: int, seq_len: int, whole: bool = False,
              held_out: bool = True) -> None:
        """Enough tokens for `seq_len` windows (in the training part, and in the held-out tail
        where `held_out` (an --eval-every run); in the whole when `whole`: a separate held-out
        set, or training beside one) and every id within the vocabulary."""
        needed = self.tokens_needed(seq_len, whole, held_out)
        if len(self.tokens) < needed:
            tail = f" and in the held-out last {self.val_fraction:.0%}" if held_out else ""
            parts = "" if whole else f" (windows of {seq_len + 1} in the training part{tail})"
            raise ParaxisError(f"data {self.name} has {len(self.tokens)} tokens, too few for "
                               f"seq_len {seq_len}: it needs {needed}{parts}; give more data "
                               "or a shorter --seq-len")
        top, where = largest_token(self.tokens)
        if top >= vocab_size:
            raise ParaxisError(f"data {self.name} holds token id {top} (at token {where:,}) but "
                               f"the model's vocabulary is {vocab_size}; check --data-dtype or "
                               "--tokenizer, or choose a model whose vocabulary covers the data")

    def tokens_needed(self, seq_len: int, whole: bool = False, held_out: bool = True) -> int:
        """The fewest tokens that leave every part `starts` draws from a window: a part of p
        tokens starts windows of seq_len + 1 in [0, p - seq_len - 1), so it needs
        seq_len + 2; the held-out tail is the last `val_fraction` of the tokens."""
        part = seq_len + 2
        if whole:
            return part
        v = self.val_fraction
        n = math.ceil(max(part / (1 - v), part / v if held_out else 0.0))
        while (int(n * (1 - v)) < part
               or (held_out and n - int(n * (1 - v)) < part)):  # the split rounds down
            n += 1
        return n

    @property
    def split_at(self) -> int:
        return int(len(self.tokens) * (1 - self.val_fraction))

    def span(self, part: str) -> tuple[int, int]:
        """Where windows of `part` start: "train" (all but the tail), "val" (the tail) or
        "all" (the whole: a separate held-out set, or training data beside one)."""
        return {"train": (0, self.split_at), "val": (self.split_at, len(self.tokens)),
                "all": (0, len(self.tokens))}[part]

    def starts(self, key: list[int], batch_size: int, seq_len: int,
               part: str) -> np.ndarray:
        """`batch_size` window starts in `part`, drawn by the generator seeded with `key`."""
        lo, hi = self.span(part)
        return np.random.default_rng(key).integers(lo, hi - seq_len - 1, size=batch_size)

    def batch(self, step: int, batch_size: int, seq_len: int, seed: int,
              split: str = "train") -> tuple[np.ndarray, np.ndarray]:
        """The whole global batch of `step`: inputs and next-token targets, int64 (batch,
        seq_len). Training reads only each rank's rows of it (`paraxis.data.loader.read_share`)."""
        starts = self.starts(sample_key(seed, step, split), batch_size, seq_len, split)
        rows = np.stack([self.tokens.read(s, s + seq_len + 1) for s in starts])
        return rows[:, :-1], rows[:, 1:]


def sample_key(seed: int, step: int, split: str) -> list[int]:
    """The seed of a batch's generator: a pure function of (seed, step, split), so any rank,
    layout or resumed run draws the same samples."""
    return [seed, step, 0 if split == "train" else 1]
