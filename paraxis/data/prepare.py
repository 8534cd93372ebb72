"""Tokenize a raw corpus once into indexed token shards, so training reads tokens, not text.

`prepare(source, out)` splits the source into pieces (`data_sources.py`), tokenizes them in
parallel worker processes, and writes per piece a shard of token ids (`shard-NNNNN.bin`, the
nanoGPT layout) with the end offset of each of its documents (`shard-NNNNN.docs.npy`), then
`index.json`: the tokenizer, the end-of-document id, the shards in order, and a fingerprint of
source and tokenizer. Documents are separated by an end-of-document token: id 0 (the NUL
byte, which text never holds) for the byte tokenizer, the tokenizer's own EOS otherwise.

Everything is written to a temporary folder and renamed into place at the end, so a failure
(bad data names its file and row) leaves nothing behind, and two ranks preparing the same
source at once both end up reading one complete copy.

Training pointed at a raw source prepares it into `<cache>/<fingerprint>` first
(`load_token_data`); the cache is `$PARAXIS_DATA_CACHE`, else `~/.cache/paraxis/data`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import socket
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from uuid import uuid4

import numpy as np

from paraxis.data.corpus import ByteTokenizer, HFTokenizer, TokenData, load_tokenizer
from paraxis.data.sources import Piece, documents, pieces, source_files, source_kind
from paraxis.data.tokens import TokenShards
from paraxis.files.host import check_writable_folder
from paraxis.spec.errors import ParaxisError

VERSION = 1
BYTE_END_OF_DOCUMENT = 0
# Tried in order when no tokenizer_config.json names the tokenizer's eos_token.
EOS_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|im_end|>")


def end_of_document(tokenizer: ByteTokenizer | HFTokenizer) -> int:
    """The id that ends every document: NUL for bytes, the tokenizer's EOS token otherwise
    (named by a tokenizer_config.json beside it, else a special token with a usual name)."""
    if isinstance(tokenizer, ByteTokenizer):
        return BYTE_END_OF_DOCUMENT
    names = list(EOS_NAMES)
    eos = _configured_eos(tokenizer.path.parent / "tokenizer_config.json")
    if eos:
        names.insert(0, eos)
    added = json.loads(tokenizer.path.read_text(encoding="utf-8")).get("added_tokens", [])
    special = {t["content"]: t["id"] for t in added if t.get("special")}
    for name in names:
        if name in special:
            return int(special[name])
    raise ParaxisError(f"tokenizer {tokenizer.path} has no end-of-document token (none of "
                       f"{', '.join(EOS_NAMES)}); add one as a special token, or name it as "
                       "eos_token in a tokenizer_config.json beside it")


def _configured_eos(config: Path) -> str | None:
    """The eos_token a tokenizer_config.json names (text, or {"content": text}), if any."""
    if not config.is_file():
        return None
    try:
        record = json.loads(config.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as error:  # JSONDecodeError, UnicodeDecodeError
        raise ParaxisError(f"{config} is not JSON ({error}); fix it, or remove it to use the "
                           "tokenizer's usual end-of-document token") from None
    eos = record.get("eos_token") if isinstance(record, dict) else None
    eos = eos.get("content") if isinstance(eos, dict) else eos
    if eos is not None and not isinstance(eos, str):
        raise ParaxisError(f"{config}: eos_token is {type(eos).__name__}, not a token's text; "
                           'write it as "eos_token": "</s>" (the token that ends documents)')
    return eos


def fingerprint(path: Path, kind: str, tokenizer: str | None, text_field: str) -> str:
    """A hash of what the prepared tokens depend on: the source files (name, size and
    modification time, as build tools do; not their whole contents, which would mean reading
    the corpus each run), the tokenizer file's contents and, for a tokenizer.json, its
    end-of-document id (which a tokenizer_config.json beside it may choose), the text field
    and this format."""
    files = source_files(path, kind)
    stats = [[str(f.relative_to(path)) if f != path else f.name, f.stat().st_size,
              f.stat().st_mtime_ns] for f in files if f.is_file()]
    tok = load_tokenizer(tokenizer)
    key = {"version": VERSION, "kind": kind, "text_field": text_field,
           "tokenizer": tokenizer_hash(tok), "files": stats}
    if not isinstance(tok, ByteTokenizer):  # the byte tokenizer's is always NUL
        key["end_of_document"] = end_of_document(tok)
    return hashlib.sha256(json.dumps(key).encode()).hexdigest()[:20]


def tokenizer_hash(tokenizer: ByteTokenizer | HFTokenizer) -> str:
    """What identifies a tokenizer: its file's contents, wherever it lies."""
    if isinstance(tokenizer, ByteTokenizer):
        return "byte-level"
    return hashlib.sha256(tokenizer.path.read_bytes()).hexdigest()


@functools.cache
def _worker_tokenizer(path: str | None) -> ByteTokenizer | HFTokenizer:
    """Loaded once per worker process, not once per piece (a source may have thousands)."""
    return load_tokenizer(path)


def _tokenize(task: tuple[Piece, str, str | None, str]) -> tuple[int, int]:
    """One piece -> its shard and document ends in `out_stem`.*; (tokens, documents)."""
    piece, field, tokenizer_path, out_stem = task
    tokenizer = _worker_tokenizer(tokenizer_path)
    eod = end_of_document(tokenizer)
    dtype = np.uint8 if isinstance(tokenizer, ByteTokenizer) else tokenizer.dtype
    eod_bytes = np.asarray([eod], dtype=dtype).tobytes()
    ends, total = [], 0
    with open(f"{out_stem}.bin", "wb") as shard:  # streamed: a piece need not fit in memory
        for row, text in documents(piece, field):
            if isinstance(tokenizer, ByteTokenizer):
                data = text.encode("utf-8")
                if b"\0" in data:
                    raise ParaxisError(f"{piece.file} row {row} holds a NUL character, the "
                                       "byte tokenizer's end-of-document token; remove it")
            else:
                data = tokenizer.encode(text).tobytes()
            shard.write(data + eod_bytes)
            total += len(data) // np.dtype(dtype).itemsize + 1
            ends.append(total)
    if not ends and piece.kind != "parquet":  # a Parquet row group may hold no rows
        raise ParaxisError(f"{piece.file} holds no documents; remove it or give it some")
    if ends:
        np.save(f"{out_stem}.docs.npy", np.asarray(ends, dtype=np.int64))
    else:
        os.remove(f"{out_stem}.bin")
    return total, len(ends)


def prepare(source: str | Path, out: str | Path, tokenizer: str | None = None,
            text_field: str = "text", workers: int = 1) -> Path:
    """Tokenize the raw `source` into token shards under `out` (see the module docstring);
    a no-op when `out` already holds this source's tokens. Returns `out`."""
    path, out = Path(source), Path(out)
    if not path.exists():
        raise ParaxisError(f"{path} does not exist; give an existing .jsonl / .jsonl.gz file, "
                           "Parquet file or folder, or Hugging Face datasets directory")
    kind = source_kind(path)
    if kind is None:
        raise ParaxisError(f"{path} is not a raw source; give a .jsonl / .jsonl.gz file, a "
                           "Parquet file or folder, or a Hugging Face datasets directory")
    key = fingerprint(path, kind, tokenizer, text_field)
    if _prepared_fingerprint(out) == key:
        return out
    if is_prepared(out):
        raise ParaxisError(f"{out} holds tokens prepared from another source, tokenizer or "
                           "text field (or by another paraxis version); remove it to prepare "
                           "again, or choose another --out")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ParaxisError(f"{out} already exists and holds something else; choose another "
                           "--out or remove it")
    tok = load_tokenizer(tokenizer)
    todo = pieces(path, kind)
    created = [p for p in (out, *out.parents) if not p.exists()]
    out.parent.mkdir(parents=True, exist_ok=True)
    # unique per process and host (ranks on nodes sharing a filesystem may share a pid), and
    # made before the cleanup guard, so a failure only ever removes what this process made
    tmp = out.parent / f".{out.name}.tmp-{socket.gethostname()}-{os.getpid()}-{uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        _worker_tokenizer.cache_clear()  # the file may have changed since the last prepare
        tasks = [(p, text_field, tokenizer, str(tmp / f"shard-{i:05d}")) for i, p in
                 enumerate(todo)]
        workers = max(1, min(workers, len(tasks)))
        if workers == 1:
            counts = [_tokenize(t) for t in tasks]
        else:
            # fork, as PyTorch's DataLoader workers: "spawn" would re-run a caller's script
            # that starts training without an `if __name__ == "__main__":` guard.
            with ProcessPoolExecutor(workers, mp_context=get_context("fork")) as pool:
                counts = list(pool.map(_tokenize, tasks))
        shards = [{"file": f"shard-{i:05d}.bin", "documents_file": f"shard-{i:05d}.docs.npy",
                   "tokens": n, "documents": d, "source": piece.file,
                   "row_group": piece.row_group}
                  for i, (piece, (n, d)) in enumerate(zip(todo, counts, strict=True)) if d]
        if not shards:
            raise ParaxisError(f"{path} holds no documents; give it some")
        ends = sum(s["documents"] for s in shards) if end_of_document(tok) is not None else 0
        if sum(s["tokens"] for s in shards) <= ends:
            # each document's tokens end with one end-of-document id: no more means no text
            raise ParaxisError(f"every document of {path} is empty (field {text_field!r}); give "
                               "it some text, or choose the field with --text-field")
        dtype = "uint8" if isinstance(tok, ByteTokenizer) else np.dtype(tok.dtype).name
        index = {"format": "paraxis token shards", "version": VERSION, "fingerprint": key,
                 "source": str(path), "kind": kind, "text_field": text_field,
                 "tokenizer": str(tok), "tokenizer_sha256": tokenizer_hash(tok),
                 "vocab_size": tok.vocab_size,
                 "end_of_document": end_of_document(tok), "dtype": dtype,
                 "tokens": sum(s["tokens"] for s in shards),
                 "documents": sum(s["documents"] for s in shards), "shards": shards}
        (tmp / "index.json").write_text(json.dumps(index, indent=1) + "\n")
        try:
            tmp.rename(out)  # atomic; fails if another process just put its copy there
        except OSError:
            if _prepared_fingerprint(out) != key:
                raise
            shutil.rmtree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        for folder in created[1:]:  # `out` itself was never created, only its parents
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        raise
    return out


def _prepared_fingerprint(folder: Path) -> str | None:
    index = folder / "index.json"
    try:
        return json.loads(index.read_text()).get("fingerprint") if index.is_file() else None
    except (json.JSONDecodeError, AttributeError):
        return None


def is_prepared(path: Path) -> bool:
    return path.is_dir() and (path / "index.json").is_file()


def read_prepared(folder: str | Path) -> tuple[TokenShards, dict]:
    """The token ids of a prepared folder, its shards memory-mapped in order (never joined:
    `TokenShards` reads a window across shard boundaries), and its index; every shard is
    checked whole (size, ids within the vocabulary) and named when bad."""
    folder = Path(folder)
    try:
        index = json.loads((folder / "index.json").read_text())
        dtype, vocab, shards = np.dtype(index["dtype"]), index["vocab_size"], index["shards"]
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise ParaxisError(f"{folder / 'index.json'} is not a paraxis token index ({error}); "
                           "prepare the source again with `paraxis data prepare`") from None
    arrays = []
    for shard in shards:
        file = folder / shard["file"]
        size = file.stat().st_size if file.is_file() else -1
        if size <= 0:
            raise ParaxisError(f"shard {file} is {'missing' if size < 0 else 'empty'}; "
                               "prepare the source again with `paraxis data prepare`")
        if size != shard["tokens"] * dtype.itemsize:
            raise ParaxisError(f"shard {file} has {size} bytes, not the {shard['tokens']} "
                               f"{dtype.name} tokens index.json says; prepare it again")
        tokens = np.memmap(file, dtype=dtype, mode="r")
        _check_vocabulary(tokens, vocab, file, folder / shard["documents_file"])
        arrays.append(tokens)
    return TokenShards(arrays), index


def _check_vocabulary(tokens: np.ndarray, vocab: int, file: Path, ends_file: Path) -> None:
    """Every id below `vocab`, scanned in chunks (a shard may be larger than memory)."""
    chunk = 1 << 24
    for start in range(0, len(tokens), chunk):
        bad = np.flatnonzero(tokens[start: start + chunk] >= vocab)
        if len(bad):
            at = start + int(bad[0])
            row = int(np.searchsorted(np.load(ends_file), at, side="right")) + 1
            raise ParaxisError(f"shard {file} document {row} (token {at}) holds id "
                               f"{int(tokens[at])}, beyond the vocabulary of {vocab}; "
                               "prepare the source again")


def cache_root() -> Path:
    """Where training keeps the tokens of raw sources it prepared."""
    if os.environ.get("PARAXIS_DATA_CACHE"):
        root = Path(os.environ["PARAXIS_DATA_CACHE"])
        check_writable_folder(root, "PARAXIS_DATA_CACHE", "~/.cache/paraxis/data")
        return root
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "paraxis" / "data"


def load_token_data(source: str | None, dtype: str = "uint16", tokenizer: str | None = None,
                    text_field: str = "text") -> TokenData:
    """Training's data: a prepared folder is read; a raw source (JSONL, Parquet, datasets) is
    prepared into the cache first, once; anything else goes to `TokenData.load`."""
    path = Path(source) if source not in (None, "", "embedded") else None
    if path is not None and is_prepared(path):
        tokens, index = read_prepared(path)
        if tokenizer and tokenizer_hash(load_tokenizer(tokenizer)) != index.get(
                "tokenizer_sha256"):
            raise ParaxisError(f"data {path} was prepared with {index['tokenizer']}, not "
                               f"{tokenizer}; leave --tokenizer out, or prepare the source "
                               "again with it")
        return TokenData(tokens, f"{path} (prepared, {index['tokenizer']})",
                         end_of_document=index.get("end_of_document"))
    kind = source_kind(path) if path is not None and path.exists() else None
    if kind is None:
        return TokenData.load(source, dtype, tokenizer)
    out = cache_root() / fingerprint(path, kind, tokenizer, text_field)
    # A rank of a torchrun job prepares in-process: its peers are doing the same, and its
    # threads (gloo's) make forking unwise. `paraxis data prepare` first avoids the repeat.
    workers = 1 if "WORLD_SIZE" in os.environ else min(8, os.cpu_count() or 1)
    prepare(path, out, tokenizer, text_field, workers=workers)
    tokens, index = read_prepared(out)
    return TokenData(tokens, f"{path} ({index['tokenizer']}, prepared in {out})",
                     end_of_document=index.get("end_of_document"))
