"""Raw corpora as documents: JSON lines, Parquet and Hugging Face `datasets` directories.

A source is split into *pieces* (a JSONL file, a Parquet row group, an Arrow file) that can be
tokenized independently, in parallel, and concatenated in piece order: the order of documents
is the same whatever the number of workers, so a prepared source is the same bytes each time.

A `datasets` directory (`Dataset.save_to_disk`) is Arrow IPC stream files listed in its
`state.json`; they are read with `pyarrow` directly rather than through `datasets`, whose
import costs seconds and pulls pandas, only to hand back the same Arrow table.

Rows are numbered from 1 in error messages (a JSONL row is its line).
"""

from __future__ import annotations

import codecs
import gzip
import json
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from paraxis.spec.errors import ParaxisError

JSONL_SUFFIXES = (".jsonl", ".jsonl.gz")
KINDS = ("jsonl", "parquet", "arrow")


@dataclass(frozen=True)
class Piece:
    """One independently tokenizable part of a source: a file, or one row group of it."""

    kind: str  # one of KINDS
    file: str
    row_group: int | None = None
    first_row: int = 1  # number of the piece's first row in its file, for messages


def _is_jsonl(path: Path) -> bool:
    return path.name.endswith(JSONL_SUFFIXES)


def _is_datasets_dir(path: Path) -> bool:
    return path.is_dir() and (path / "state.json").is_file() and \
        (path / "dataset_info.json").is_file()


def source_kind(path: Path) -> str | None:
    """The kind of raw source at `path` ("jsonl", "parquet", "arrow"), or None when it is not
    one (a token file, plain text, or a folder of text files)."""
    if path.is_file():
        if _is_jsonl(path):
            return "jsonl"
        # one Arrow stream file: a shard of a datasets directory, or of its Arrow cache
        return {".parquet": "parquet", ".arrow": "arrow"}.get(path.suffix)
    if _is_datasets_dir(path):
        return "arrow"
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file())
        parquet = [p for p in files if p.suffix == ".parquet"]
        jsonl = [p for p in files if _is_jsonl(p)]
        if parquet and jsonl:
            raise ParaxisError(f"folder {path} holds Parquet files ({parquet[0]}, ...) and JSON "
                               f"lines files ({jsonl[0]}, ...); put each kind in a folder of its "
                               "own and blend them (--data a:0.5,b:0.5)")
        if not (parquet or jsonl):
            return None
        kind = "parquet" if parquet else "jsonl"
        unread = [p for p in files if _unread_data(p)]
        if unread:
            raise ParaxisError(f"folder {path} holds {kind} files and {unread[0]} ("
                               f"{len(unread)} such), which would not be read (.jsonl, "
                               ".jsonl.gz and .parquet are read, the suffix in lower case; a "
                               "folder of .txt files is read as text); convert or move them")
        return kind
    return None


def _unread_data(path: Path) -> bool:
    """A file beside JSONL or Parquet files that holds data of another kind, which the
    source would otherwise skip without a word: plain text, and JSON lines or Parquet under
    a suffix not read (upper case, or compressed other than with gzip). README.md, a
    loading script and JSON metadata are not data."""
    name = path.name.lower()
    if path.suffix == ".txt":
        return True
    if name.endswith((".jsonl", ".jsonl.gz", ".parquet")):
        return not (_is_jsonl(path) or path.suffix == ".parquet")
    return ".jsonl." in name  # .jsonl.zst, .jsonl.bz2, .jsonl.xz


def source_files(path: Path, kind: str) -> list[Path]:
    """The files of a source, in the order their documents are read."""
    if path.is_file():
        return [path]
    if kind == "arrow":
        return [path / name for name in _datasets_files(path / "state.json")]
    match = (lambda p: p.suffix == ".parquet") if kind == "parquet" else _is_jsonl
    return sorted(p for p in path.rglob("*") if p.is_file() and match(p))


def _datasets_files(state_file: Path) -> list[str]:
    """The data file names a datasets directory's state.json lists, in order."""
    again = "save the dataset again with Dataset.save_to_disk"
    try:
        state = json.loads(state_file.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as error:  # JSONDecodeError, UnicodeDecodeError
        raise ParaxisError(f"{state_file} is not JSON ({error}); {again}") from None
    entries = state.get("_data_files") if isinstance(state, dict) else None
    if not isinstance(entries, list):
        raise ParaxisError(f"{state_file} has no '_data_files' list; {again}")
    names = [entry.get("filename") if isinstance(entry, dict) else None for entry in entries]
    for number, name in enumerate(names, 1):
        if not isinstance(name, str) or not name:
            raise ParaxisError(f"{state_file} data file {number} has no 'filename'; {again}")
    if not names:
        raise ParaxisError(f"{state_file} lists no data files; {again}")
    return names


def pieces(path: Path, kind: str) -> list[Piece]:
    """The source split into pieces: Parquet by row group, others by file."""
    out = []
    for file in source_files(path, kind):
        if not file.is_file():
            raise ParaxisError(f"{file} is listed by {path} but does not exist; save the "
                               "dataset again")
        if file.stat().st_size == 0:
            raise ParaxisError(f"{file} is empty; give it documents" + (
                f" or remove it from {path}" if file != path else ""))
        if kind != "parquet":
            out.append(Piece(kind, str(file)))
            continue
        metadata = _parquet(file).metadata
        first = 1
        for group in range(metadata.num_row_groups):
            out.append(Piece(kind, str(file), group, first))
            first += metadata.row_group(group).num_rows
    return out


def _pyarrow() -> ModuleType:
    """pyarrow, imported lazily: token-file runs do not need it."""
    try:
        import pyarrow  # lazy: pyarrow takes 80 ms; only Parquet and datasets need it
        import pyarrow.parquet  # noqa: F401 - registers pyarrow.parquet  # lazy: pyarrow, as above
    except ImportError:
        raise ParaxisError("Parquet and datasets sources need pyarrow: pip install pyarrow") \
            from None
    return pyarrow


def _parquet(file: Path) -> Any:  # a pyarrow.parquet.ParquetFile
    try:
        return _pyarrow().parquet.ParquetFile(file)
    except Exception as error:  # noqa: BLE001 - pyarrow raises ArrowInvalid, OSError, ...
        raise ParaxisError(f"{file} is not a readable Parquet file: "
                           f"{str(error).splitlines()[0]}") from None


def _texts(column: list, file: str, first_row: int, field: str) -> Iterator[tuple[int, str]]:
    for offset, text in enumerate(column):
        if not isinstance(text, str):
            raise ParaxisError(f"{file} row {first_row + offset}: '{field}' is "
                               f"{'missing' if text is None else type(text).__name__}, not "
                               "text; fix the row or choose the column with --text-field")
        yield first_row + offset, text


def _columnar(piece: Piece, field: str) -> Iterator[tuple[int, str]]:
    pa = _pyarrow()
    if piece.kind == "parquet":
        reader = _parquet(Path(piece.file))
        if field not in reader.schema_arrow.names:
            raise ParaxisError(f"{piece.file} has no column '{field}' (it has "
                               f"{', '.join(reader.schema_arrow.names)}); choose one with "
                               "--text-field")
        table = reader.read_row_group(piece.row_group, columns=[field])
    else:
        try:
            with pa.memory_map(piece.file) as source:
                table = pa.ipc.open_stream(source).read_all()
        except Exception as error:  # noqa: BLE001 - ArrowInvalid and kin
            raise ParaxisError(f"{piece.file} is not an Arrow stream file: "
                               f"{str(error).splitlines()[0]}") from None
        if field not in table.column_names:
            raise ParaxisError(f"{piece.file} has no column '{field}' (it has "
                               f"{', '.join(table.column_names)}); choose one with "
                               "--text-field")
    yield from _texts(table.column(field).to_pylist(), piece.file, piece.first_row, field)


def _numbered_lines(file: str) -> Iterator[tuple[int, bytes]]:
    """(row number, raw line) of a JSONL file, gzipped where it ends in .gz."""
    opener = gzip.open if file.endswith(".gz") else open
    try:
        with opener(file, "rb") as lines:
            yield from enumerate(lines, 1)
    except (EOFError, zlib.error, gzip.BadGzipFile) as error:  # a cut or foreign .gz
        raise ParaxisError(f"{file} is not a complete gzip file ({error}); download or "
                           "compress it again, or give the uncompressed .jsonl") from None


def _jsonl(piece: Piece, field: str) -> Iterator[tuple[int, str]]:
    for number, raw in _numbered_lines(piece.file):  # decoded row by row, to name a bad one
        if number == 1 and raw.startswith(codecs.BOM_UTF8):  # a mark some editors write, not text
            raw = raw[len(codecs.BOM_UTF8):]
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise ParaxisError(f"{piece.file} row {number} is not UTF-8 (byte "
                               f"0x{raw[error.start]:02x} at column {error.start + 1}); "
                               "re-encode the file as UTF-8 or remove the row") from None
        if not line.strip():
            continue
        row = _json_row(line, piece.file, number)
        if not isinstance(row, dict) or field not in row:
            raise ParaxisError(f"{piece.file} row {number} has no '{field}' field; fix "
                               "the row or choose the field with --text-field")
        text = row[field]
        # valid UTF-8 holds no surrogate: only a \u escape can make one, which no encoder takes
        if isinstance(text, str) and b"\\u" in raw:
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as error:
                raise ParaxisError(f"{piece.file} row {number}: '{field}' holds a lone surrogate "
                                   f"\\u{ord(text[error.start]):04x} (half of a UTF-16 pair), "
                                   "which is not text; fix or remove the row") from None
        yield from _texts([text], piece.file, number, field)


def _json_row(line: str, file: str, number: int) -> Any:
    """One JSONL row parsed; what the json module cannot read is named in one line."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as error:
        reason = f"is not JSON ({error.msg})"
    except RecursionError:
        reason = "is nested too deeply to read as JSON"
    except ValueError as error:  # json's only other error: an integer of too many digits
        reason = f"holds a number Python does not read ({str(error).split(':')[0]})"
    raise ParaxisError(f"{file} row {number} {reason}; fix or remove the line")


def documents(piece: Piece, field: str) -> Iterator[tuple[int, str]]:
    """(row number, text) of each document of `piece`, in order."""
    return _jsonl(piece, field) if piece.kind == "jsonl" else _columnar(piece, field)
