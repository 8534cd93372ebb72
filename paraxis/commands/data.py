"""`paraxis data prepare SRC --out DIR`: tokenize a raw corpus once into token shards.

Training reads the result directly (`--data DIR`); pointing training at the raw source does
the same preparation into a cache folder (`data/prepare.py`).
"""

from __future__ import annotations

import argparse
import os

from paraxis.files.host import check_writable_folder
from paraxis.spec.errors import ParaxisError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    prep = sub.add_parser("prepare", help="tokenize a .jsonl(.gz), Parquet or datasets source "
                          "into token shards with an index")
    prep.add_argument("source", help="a .jsonl / .jsonl.gz file or folder, a Parquet file or "
                      "folder, or a Hugging Face datasets directory (save_to_disk)")
    prep.add_argument("--out", required=True, help="folder to write the shards and index.json")
    prep.add_argument("--tokenizer", default=None,
                      help="Hugging Face tokenizer.json (default: byte-level)")
    prep.add_argument("--text-field", default="text", help="the field / column holding text")
    prep.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                      help="tokenizer processes (default: one per CPU core)")


def run(args: argparse.Namespace) -> int:
    from paraxis.data.prepare import prepare, read_prepared

    if getattr(args, "action", None) != "prepare":
        raise ParaxisError("say what to do: paraxis data prepare SRC --out DIR")
    if not args.source.strip():  # "" would read whatever the working folder holds
        raise ParaxisError("the source is empty; give a .jsonl / .jsonl.gz file, a Parquet "
                           "file or folder, or a Hugging Face datasets directory")
    if args.workers < 1:
        raise ParaxisError(f"--workers {args.workers} must be 1 or more")
    check_writable_folder(args.out, "--out", "data/shards")
    out = prepare(args.source, args.out, args.tokenizer, args.text_field, args.workers)
    _, index = read_prepared(out)
    print(f"{out}: {index['tokens']:,} tokens in {index['documents']:,} documents, "
          f"{len(index['shards'])} shard(s) ({index['tokenizer']}, end of document = id "
          f"{index['end_of_document']})")
    return 0
