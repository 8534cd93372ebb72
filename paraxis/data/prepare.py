"""Tokenize a raw corpus once into indexed token shards, so training reads tokens, not text.

`prepare(source, out)` splits the source into pieces (`data/sources.py`), tokenizes them in
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

from paraxis.data.corpus import (
    ByteTokenizer,
    HFTokenizer,
    TokenData,
    load_tokenizer,
    tokenizer_hash,
)
from paraxis.data.sources import Piece, documents, pieces, source_files, source_kind
from paraxis.data.tokens import TokenShards
from paraxis.files.checkpoint_ownership import pid_alive
from paraxis.files.host import (
    check_writable_folder,
    flush_to_disk,
    sync_folder,
    terminate_raises,
)
from paraxis.spec.errors import ParaxisError

FORMAT = "paraxis token shards"
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
    """A hash of what the prepared tokens depend on: the source files (name, size,
    modification time and a hash of their first and last `SAMPLE_BYTES`, so that two copies
    of a dataset whose files share names, sizes and times (cp -p, rsync -a, tar) but not
    contents never share a cache entry; not their whole contents, which would mean reading
    the corpus each run), the tokenizer file's contents and, for a tokenizer.json, its
    end-of-document id (which a tokenizer_config.json beside it may choose), the text field
    and this format."""
    files = source_files(path, kind)
    stats = [[str(f.relative_to(path)) if f != path else f.name, f.stat().st_size,
              f.stat().st_mtime_ns, _ends_hash(f)] for f in files if f.is_file()]
    tok = load_tokenizer(tokenizer)
    key = {"version": VERSION, "kind": kind, "text_field": text_field,
           "tokenizer": tokenizer_hash(tok), "files": stats}
    if not isinstance(tok, ByteTokenizer):  # the byte tokenizer's is always NUL
        key["end_of_document"] = end_of_document(tok)
    return hashlib.sha256(json.dumps(key).encode()).hexdigest()[:20]


SAMPLE_BYTES = 1 << 16


def _ends_hash(file: Path) -> str:
    """A hash of the first and the last `SAMPLE_BYTES` of `file` (two reads, whatever its
    size)."""
    digest = hashlib.sha256()
    with open(file, "rb") as handle:
        digest.update(handle.read(SAMPLE_BYTES))
        size = handle.seek(0, os.SEEK_END)
        handle.seek(max(SAMPLE_BYTES, size - SAMPLE_BYTES))
        digest.update(handle.read(SAMPLE_BYTES))
    return digest.hexdigest()[:16]


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
        flush_to_disk(shard)
    if not ends and piece.kind != "parquet":  # a Parquet row group may hold no rows
        raise ParaxisError(f"{piece.file} holds no documents; remove it or give it some")
    if ends:
        with open(f"{out_stem}.docs.npy", "wb") as docs:
            np.save(docs, np.asarray(ends, dtype=np.int64))
            flush_to_disk(docs)
    else:
        os.remove(f"{out_stem}.bin")
    return total, len(ends)


def prepare(source: str | Path, out: str | Path, tokenizer: str | None = None,
            text_field: str = "text", workers: int = 1) -> Path:
    """Tokenize the raw `source` into token shards under `out` (see the module docstring);
    a no-op when `out` already holds this source's tokens whole, a repair when it holds them
    damaged (a shard cut short by a crash or a copy). Returns `out`."""
    path, out = Path(source), Path(out)
    if not path.exists():
        raise ParaxisError(f"{path} does not exist; give an existing .jsonl / .jsonl.gz file, "
                           "Parquet file or folder, or Hugging Face datasets directory")
    kind = source_kind(path)
    if kind is None:
        raise ParaxisError(f"{path} is not a raw source; give a .jsonl / .jsonl.gz file, a "
                           "Parquet file or folder, or a Hugging Face datasets directory")
    key = fingerprint(path, kind, tokenizer, text_field)
    ours = _prepared_fingerprint(out) == key
    if ours and _shards_whole(out):
        return out
    if not ours and is_prepared(out):
        raise ParaxisError(f"{out} holds tokens prepared from another source, tokenizer or "
                           "text field (or by another paraxis version); remove it to prepare "
                           "again, or choose another --out")
    if not ours and out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ParaxisError(f"{out} already exists and holds something else; choose another "
                           "--out or remove it")
    tok = load_tokenizer(tokenizer)
    todo = pieces(path, kind)
    created = [p for p in (out, *out.parents) if not p.exists()]
    target = out.resolve()  # a link's target; "." as a named folder
    # An existing folder (empty, or holding this source's tokens damaged) is filled in
    # place: the shards are made in a hidden folder inside it and moved in, index.json
    # last. Otherwise the shards are made beside it and the folder renamed into place.
    in_place = target.is_dir()
    home = target if in_place else target.parent
    prefix = ".tmp-" if in_place else f".{target.name}.tmp-"
    home.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(home, prefix)
    # unique per process and host (ranks on nodes sharing a filesystem may share a pid), so
    # a failure only ever removes what this process made; made under the SIGTERM handler,
    # so a stop at any point after it is cleaned up
    tmp = home / f"{prefix}{socket.gethostname()}-{os.getpid()}-{uuid4().hex[:8]}"
    with terminate_raises():
        try:
            tmp.mkdir()
            _write_shards(path, kind, key, todo, tok, tokenizer, text_field, tmp, workers)
            if in_place:
                for name in sorted(os.listdir(tmp), key=lambda n: n == "index.json"):
                    os.replace(tmp / name, target / name)  # index.json last
                tmp.rmdir()
                sync_folder(target)
            else:
                try:
                    tmp.rename(target)  # atomic; fails if another process just put its copy
                except OSError:
                    if _prepared_fingerprint(target) != key:
                        raise
                    shutil.rmtree(tmp)
                sync_folder(home)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            for folder in created[1:]:  # `out` itself was never created, only its parents
                if folder.is_dir() and not any(folder.iterdir()):
                    folder.rmdir()
            raise
    return out


def _write_shards(path: Path, kind: str, key: str, todo: list[Piece],
                  tok: ByteTokenizer | HFTokenizer, tokenizer: str | None, text_field: str,
                  tmp: Path, workers: int) -> dict:
    """Tokenize `todo` into shards in `tmp` and write its index.json; returns the index."""
    _worker_tokenizer.cache_clear()  # the file may have changed since the last prepare
    tasks = [(p, text_field, tokenizer, str(tmp / f"shard-{i:05d}")) for i, p in
             enumerate(todo)]
    workers = max(1, min(workers, len(tasks)))
    if workers == 1:
        counts = [_tokenize(t) for t in tasks]
    else:
        # fork, as PyTorch's DataLoader workers: "spawn" would re-run a caller's script
        # that starts training without an `if __name__ == "__main__":` guard.
        pool = ProcessPoolExecutor(workers, mp_context=get_context("fork"))
        try:
            counts = list(pool.map(_tokenize, tasks))
        finally:  # stopped (a bad piece, SIGTERM): the pieces not started are not tokenized
            pool.shutdown(wait=True, cancel_futures=True)
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
    index = {"format": FORMAT, "version": VERSION, "fingerprint": key,
             "source": str(path), "kind": kind, "text_field": text_field,
             "tokenizer": str(tok), "tokenizer_sha256": tokenizer_hash(tok),
             "vocab_size": tok.vocab_size,
             "end_of_document": end_of_document(tok), "dtype": dtype,
             "tokens": sum(s["tokens"] for s in shards),
             "documents": sum(s["documents"] for s in shards), "shards": shards}
    with open(tmp / "index.json", "w") as handle:
        handle.write(json.dumps(index, indent=1) + "\n")
        flush_to_disk(handle)
    sync_folder(tmp)
    return index


def _remove_abandoned(home: Path, prefix: str) -> None:
    """Remove the temporary folders (`prefix`HOST-PID-...) of prepares on this host whose
    process is gone: killed outright (SIGKILL, a node's out-of-memory killer), they could
    not clean up after themselves."""
    host = socket.gethostname()
    for folder in home.glob(f"{prefix}{host}-*"):
        pid = folder.name[len(prefix) + len(host) + 1:].split("-")[0]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def _shards_whole(folder: Path) -> bool:
    """Whether every shard index.json lists is there at the size it says (what a crash or
    a partial copy breaks); what ids they hold is `read_prepared`'s check."""
    try:
        index = json.loads((folder / "index.json").read_text())
        dtype = np.dtype(index["dtype"])
        return all(_shard_problem(folder / shard["file"], int(shard["tokens"]), dtype) is None
                   and (folder / shard["documents_file"]).is_file()
                   for shard in index["shards"])
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _shard_problem(file: Path, count: int, dtype: np.dtype) -> str | None:
    """What is wrong with the shard `file` index.json says holds `count` ids of `dtype`
    (missing, empty, cut short or grown), or None."""
    size = file.stat().st_size if file.is_file() else -1
    if size <= 0:
        return f"shard {file} is {'missing' if size < 0 else 'empty'}"
    if size != count * dtype.itemsize:
        return (f"shard {file} has {size} bytes, not the {count} {dtype.name} tokens "
                "index.json says")
    return None


def _prepared_fingerprint(folder: Path) -> str | None:
    index = folder / "index.json"
    try:
        return json.loads(index.read_text()).get("fingerprint") if index.is_file() else None
    except (json.JSONDecodeError, AttributeError):
        return None


def is_prepared(path: Path) -> bool:
    """Whether `path` is a folder of `paraxis data prepare` (its index.json says so, or it
    holds shards beside an index.json that no longer reads), not a raw source that happens
    to hold a file of that name (a dataset's own manifest)."""
    index = path / "index.json"
    if not (path.is_dir() and index.is_file()):
        return False
    try:
        record = json.loads(index.read_text())
    except (OSError, ValueError):
        return True  # damaged: `read_prepared` names the file
    return (isinstance(record, dict) and record.get("format") == FORMAT) or any(
        path.glob("shard-*.bin"))


def read_prepared(folder: str | Path) -> tuple[TokenShards, dict]:
    """The token ids of a prepared folder, its shards memory-mapped in order (never joined:
    `TokenShards` reads a window across shard boundaries), and its index; every shard is
    checked whole (size, ids within the vocabulary) and named when bad."""
    folder = Path(folder)
    again = ("prepare the source again with `paraxis data prepare SOURCE --out "
             f"{folder}` (it rebuilds a damaged folder)")
    try:
        index = json.loads((folder / "index.json").read_text())
        dtype, vocab, shards = np.dtype(index["dtype"]), int(index["vocab_size"]), [
            (str(shard["file"]), str(shard["documents_file"]), int(shard["tokens"]))
            for shard in index["shards"]]
    except (ValueError, KeyError, TypeError) as error:  # JSONDecodeError, a bad entry
        raise ParaxisError(f"{folder / 'index.json'} is not a paraxis token index "
                           f"({type(error).__name__}: {error}); {again}") from None
    arrays = []
    for name, ends_name, count in shards:
        file = folder / name
        problem = _shard_problem(file, count, dtype)
        if problem is not None:
            raise ParaxisError(f"{problem}; {again}")
        tokens = np.memmap(file, dtype=dtype, mode="r")
        _check_vocabulary(tokens, vocab, file, folder / ends_name)
        arrays.append(tokens)
    return TokenShards(arrays), index


def _check_vocabulary(tokens: np.ndarray, vocab: int, file: Path, ends_file: Path) -> None:
    """Every id below `vocab`, scanned in chunks (a shard may be larger than memory)."""
    chunk = 1 << 24
    for start in range(0, len(tokens), chunk):
        bad = np.flatnonzero(tokens[start: start + chunk] >= vocab)
        if len(bad):
            at = start + int(bad[0])
            try:
                row = int(np.searchsorted(np.load(ends_file), at, side="right")) + 1
                where = f"document {row} (token {at})"
            except (OSError, ValueError):  # its document ends are missing or damaged too
                where = f"token {at}"
            raise ParaxisError(f"shard {file} {where} holds id {int(tokens[at])}, beyond the "
                               f"vocabulary of {vocab}; prepare the source again")


def cache_root() -> Path:
    """Where training keeps the tokens of raw sources it prepared."""
    if os.environ.get("PARAXIS_DATA_CACHE"):
        root = Path(os.environ["PARAXIS_DATA_CACHE"])
        check_writable_folder(root, "PARAXIS_DATA_CACHE", "~/.cache/paraxis/data")
        return root
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    root = Path(base) / "paraxis" / "data"
    check_writable_folder(root, "the data cache (set PARAXIS_DATA_CACHE to another folder)")
    return root


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
                         end_of_document=index.get("end_of_document"),
                         tokenizer=index.get("tokenizer_sha256"))
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
                     end_of_document=index.get("end_of_document"),
                     tokenizer=index.get("tokenizer_sha256"))
