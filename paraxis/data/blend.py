"""Weighted blends of token sources, and the held-out set: where each sample of a batch lies.

    --data corpus.jsonl                        one source: its windows alone, no source draw
    --data web.jsonl:0.7,code_prepared:0.3     each sample from web with probability 0.7
    --val-data heldout.jsonl                   evaluation reads this instead of the tail 5%

A blend picks each sample's source with the given probabilities, then its window start
within that source, both from generators seeded by (seed, step): a pure function, so every
rank computes the same global batch whatever the layout, and a resumed run continues at the
exact sample. A single source draws its windows with the window generator alone (no source
draw), and its fingerprint is the source's own.

Without --val-data each source keeps its last 5% for evaluation; with it, training draws from
the whole of every source and evaluation from the whole held-out set (itself a source or a
blend, in any format `--data` takes).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from paraxis.data.corpus import TokenData, sample_key
from paraxis.data.prepare import is_prepared, load_token_data
from paraxis.data.sources import source_kind
from paraxis.files.checkpoint_ownership import data_facts
from paraxis.spec.errors import ParaxisError
from paraxis.spec.options import option

EXAMPLE = "write PATH:WEIGHT items joined by commas, e.g. web.jsonl:0.7,code:0.3"


def parse_blend(spec: str | None) -> list[tuple[str, float]]:
    """`--data` text -> [(path, weight)], weights summing to 1. A path that exists is one
    source even if its name holds ',' or ':'."""
    if spec in (None, "", "embedded") or Path(spec).exists():
        return [(spec or "embedded", 1.0)]
    items = [item.strip() for item in spec.split(",")]
    out = []
    for item in items:
        path, sep, text = item.rpartition(":")
        try:
            weight = float(text) if sep else None
        except ValueError:
            weight = None
        if weight is None:
            if sep and path and Path(path).exists():  # "c.jsonl:abc": a weight misspelt
                raise ParaxisError(f"blend weight {text!r} of {path} is not a number; "
                                   f"{EXAMPLE}")
            if len(items) == 1:
                return [(spec, 1.0)]  # one path (TokenData.load says if it does not exist)
            raise ParaxisError(f"blend item {item!r} of --data {spec} has no weight; {EXAMPLE}")
        if not (weight > 0 and math.isfinite(weight)):
            raise ParaxisError(f"blend weight {text} of {path} is not a positive number; "
                               f"{EXAMPLE}")
        if not path:
            raise ParaxisError(f"blend item {item!r} of --data {spec} has no path; {EXAMPLE}")
        out.append((path, weight))
    total = sum(weight for _, weight in out)
    if not math.isfinite(total):  # weights near the float's limit: scale them down first
        top = max(weight for _, weight in out)
        out = [(path, weight / top) for path, weight in out]
        total = sum(weight for _, weight in out)
    return [(path, weight / total) for path, weight in out]


@dataclass
class Blend:
    """Token sources drawn with probabilities `weights`, and where evaluation draws from:
    `val` (a separate held-out blend) or, when None, each source's tail."""

    sources: list[TokenData]
    weights: list[float]
    name: str
    val: Blend | None = None

    @classmethod
    def of(cls, data: TokenData | Blend) -> Blend:
        """A blend as is; one TokenData as the blend of itself alone."""
        return data if isinstance(data, Blend) else cls([data], [1.0], data.name)

    def part(self, split: str) -> tuple[Blend, str]:
        """The blend and the part of each source that `split` ("train" or "val") draws
        windows from (`TokenData.span`)."""
        if self.val is None:
            return self, split
        return (self.val if split == "val" else self), "all"

    def positions(self, step: int, batch_size: int, seq_len: int, seed: int,
                  split: str = "train") -> tuple[Blend, np.ndarray, np.ndarray]:
        """Every sample of the global batch of `step`: the blend it comes from, each
        sample's source index and window start. Cheap (integers only): every rank computes
        all of them and reads just its own rows."""
        blend, part = self.part(split)
        key = sample_key(seed, step, split)
        if len(blend.sources) == 1:  # no source to draw: the window draws alone
            starts = blend.sources[0].starts(key, batch_size, seq_len, part)
            return blend, np.zeros(batch_size, dtype=np.int64), starts
        which = np.random.default_rng([*key, 1]).choice(len(blend.sources), size=batch_size,
                                                        p=blend.weights)
        starts = np.empty(batch_size, dtype=np.int64)
        for index, source in enumerate(blend.sources):
            drawn = source.starts([*key, 2, index], batch_size, seq_len, part)
            starts[which == index] = drawn[which == index]
        return blend, which, starts

    def check(self, vocab_size: int, seq_len: int, held_out: bool = True) -> None:
        """Each source (and the held-out set's) long enough and within the vocabulary;
        `held_out`: whether the run evaluates (each source's tail is then drawn too)."""
        for source in self.sources:
            source.check(vocab_size, seq_len, whole=self.val is not None, held_out=held_out)
        if self.val is not None:
            for source in self.val.sources:
                source.check(vocab_size, seq_len, whole=True)

    @property
    def end_of_document(self) -> int | None:
        """The id ending each document, for packing: the sources' common id, None when one
        source does not know it; sources that end documents differently cannot be packed."""
        ids = {source.end_of_document for source in self.sources}
        if len(ids) > 1 and None not in ids:
            raise ParaxisError(f"the blended sources end documents with different ids "
                               f"({sorted(ids)}); prepare them with one tokenizer to pack them")
        return None if None in ids else ids.pop()

    def bytes_read(self) -> int:
        """Bytes the loader has read from every source, held-out set included."""
        blends = [self] if self.val is None else [self, self.val]
        return sum(s.tokens.bytes_read for b in blends for s in b.sources)

    def facts(self) -> dict[str, Any]:
        """What a resumed run must share with its checkpoint (`checkpoint.ownership`): the
        tokens training draws from. One source's name, length and fingerprint; a blend's
        fingerprint covers every source's and its weight. Beside
        a held-out set training draws from the whole of each source, not all but its tail:
        that span is part of the fingerprint (and said in the name), so a resume that adds or
        drops --val-data is refused; which held-out set is not (changing it leaves the
        training samples as they were)."""
        each = [data_facts(s.tokens, s.name) for s in self.sources]
        if len(each) == 1:
            facts = each[0]
        else:
            digest = hashlib.sha256(repr([(f["fingerprint"], round(w, 12)) for f, w in
                                          zip(each, self.weights, strict=True)]).encode())
            facts = {"name": self.name, "tokens": sum(f["tokens"] for f in each),
                     "fingerprint": digest.hexdigest()[:16],
                     "blend": [{**f, "weight": w} for f, w in
                               zip(each, self.weights, strict=True)]}
        span = self.part("train")[1]
        if span == "train":  # the span of runs without --val-data: their facts as they were
            return facts
        digest = hashlib.sha256(f"{facts['fingerprint']} {span}".encode())
        return {**facts, "name": f"{facts['name']}, whole for training beside --val-data",
                "fingerprint": digest.hexdigest()[:16], "train_span": span}


def load_blend(spec: str | None, dtype: str = "uint16", tokenizer: str | None = None,
               text_field: str = "text") -> Blend:
    """The sources `spec` names (`parse_blend`), each read as `--data` reads one."""
    parsed = parse_blend(spec)
    sources = [load_token_data(path, dtype, tokenizer, text_field) for path, _ in parsed]
    return Blend(sources, [weight for _, weight in parsed],
                 sources[0].name if len(sources) == 1 else spec or "embedded")


@dataclass(frozen=True)
class DataSection:
    path: str = option("embedded", "'embedded', a .bin, text, .jsonl(.gz), Parquet or datasets "
                       "source, a prepared folder, or a blend: a.jsonl:0.7,b:0.3", "--data")
    dtype: str = option("uint16", "token dtype of a .bin file", "--data-dtype")
    tokenizer: str | None = option(None, "Hugging Face tokenizer.json for text data "
                                   "(default: byte-level)")
    text_field: str = option("text", "the text field of JSONL, Parquet and datasets sources")
    val_path: str | None = option(None, "held-out data for --eval-every (as --data takes); "
                                  "default: the last 5% of each source", "--val-data")
    prefetch: int = option(2, "batches the loader reads ahead in a thread; 0: in the step")


def load_run_data(section: DataSection) -> Blend:
    """A run's training blend, with its held-out set when `--val-data` names one."""
    check_data_flags(section)
    blend = load_blend(section.path, section.dtype, section.tokenizer, section.text_field)
    if section.val_path:
        blend.val = load_blend(section.val_path, section.dtype, section.tokenizer,
                               section.text_field)
    check_one_tokenizer(blend)
    return blend


def check_one_tokenizer(blend: Blend) -> None:
    """Every source the run reads (the blend's and the held-out set's) holds the ids of one
    tokenizer: id 100 cannot be a byte in one source and a merge in another. A token file
    does not say what made its ids, so it is not compared."""
    sources = blend.sources + (blend.val.sources if blend.val is not None else [])
    known = [source for source in sources if source.tokenizer is not None]
    for source in known[1:]:
        if source.tokenizer != known[0].tokenizer:
            held_out = " (--val-data)" if blend.val is not None and any(
                source is s for s in blend.val.sources) else ""
            raise ParaxisError(f"data {known[0].name} and {source.name}{held_out} hold the "
                               "ids of different tokenizers; tokenize every source with one "
                               "(paraxis data prepare SOURCE --tokenizer TOKENIZER --out DIR, "
                               "or one --tokenizer for the text sources)")


def check_data_flags(section: DataSection) -> None:
    """Refuse --data-dtype and --text-field where no source reads them (a .bin token file,
    and JSONL, Parquet or datasets sources): given there, they would be silently ignored."""
    for flag, spec in (("--data", section.path), ("--val-data", section.val_path)):
        if spec is not None and not spec.strip():  # "" would read the embedded corpus
            raise ParaxisError(f"{flag} is empty; give a token file, text, JSONL or Parquet "
                               "source, or leave the flag out")
    paths = [Path(path) for spec in (section.path, section.val_path) if spec
             for path, _ in parse_blend(spec) if path not in (None, "", "embedded")]
    _check_tokenizer_applies(section.tokenizer, [p for p in paths if p.exists()])
    defaults = DataSection()
    if section.dtype != defaults.dtype and not any(p.suffix == ".bin" for p in paths):
        raise ParaxisError(f"--data-dtype {section.dtype} says how a .bin token file is read, "
                           "and --data names none; leave it out")
    if section.text_field != defaults.text_field and not any(
            p.exists() and source_kind(p) is not None for p in paths):
        raise ParaxisError(f"--text-field {section.text_field} names a field of JSONL, "
                           "Parquet or datasets sources, and --data names none; leave it out")


def _check_tokenizer_applies(tokenizer: str | None, paths: list[Path]) -> None:
    """--tokenizer tokenizes the text sources and cannot apply to token files beside them:
    the text must be prepared with it first, so that no source goes untokenized (leaving
    --tokenizer out would read the text as bytes, another vocabulary than the token files')."""
    token_files = [p for p in paths if p.is_file() and p.suffix == ".bin"]
    text = [p for p in paths if p not in token_files and not is_prepared(p)]
    if tokenizer and token_files and text:
        names = ", ".join(map(str, text))
        raise ParaxisError(f"--tokenizer {tokenizer} cannot apply to {token_files[0]}, which "
                           f"already holds token ids; prepare {names} with it first (paraxis "
                           f"data prepare SRC --tokenizer {tokenizer} --out DIR) and give the "
                           "prepared folders in their place, without --tokenizer")
