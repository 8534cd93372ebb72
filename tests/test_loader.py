"""The loader: each rank reads only its share of each batch from memory-mapped
shards, prefetched by a thread; the same samples on every layout and across resumes;
weighted blends; a separate held-out set; bad input in one line."""

from __future__ import annotations

import json
import re
import statistics
import threading
import time

import numpy as np
import pytest
import torch

from paraxis.cli import main
from paraxis.data.blend import load_blend, parse_blend
from paraxis.data.loader import SLEEP_ENV, Loader, Share, read_share
from paraxis.data.prepare import prepare
from paraxis.data.tokens import TokenShards
from paraxis.dist.testing import run_on_ranks
from paraxis.parallel.context.chunks import full_sequence
from paraxis.spec.errors import ParaxisError
from paraxis.train.config import RunConfig
from paraxis.train.loop import run_training

BATCH, SEQ = 8, 32


def _jsonl(path, docs):
    path.write_text("".join(json.dumps({"text": doc}) + "\n" for doc in docs))
    return path


@pytest.fixture
def corpus(tmp_path, monkeypatch):
    """Two sources told apart by their letters: `a` a folder of three JSONL files (three
    shards once prepared, so windows cross shard boundaries), `b` one JSONL file; and a
    held-out file of a third letter."""
    monkeypatch.setenv("PARAXIS_DATA_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "a"
    folder.mkdir()
    for part in range(3):
        _jsonl(folder / f"part-{part}.jsonl", [f"a{'a' * (i % 9)} aaa" for i in range(90)])
    paths = {"a": folder, "b": _jsonl(tmp_path / "b.jsonl", [f"bb{'b' * (i % 7)}" for i in
                                                              range(300)]),
             "val": _jsonl(tmp_path / "val.jsonl", [f"zz{'z' * (i % 5)}" for i in range(200)])}
    paths["a_prepared"] = prepare(folder, tmp_path / "a_prepared")
    paths["b_prepared"] = prepare(paths["b"], tmp_path / "b_prepared")
    return paths


def _cfg(**flags):
    base = dict(model="tiny", steps=4, global_batch=4, seq_len=SEQ, device="cpu",
                quiet=True, eval_every=0, warmup=0)
    return RunConfig.from_flags(**{**base, **flags})


def test_shards_read_windows_across_boundaries_and_count_bytes():
    parts = [np.arange(start, start + n, dtype=np.uint16) for start, n in ((0, 5), (5, 1),
                                                                           (6, 7))]
    tokens = TokenShards(parts)
    whole = np.arange(13)
    for start, stop in ((0, 13), (3, 9), (5, 6), (4, 12), (6, 6), (12, 13)):
        assert tokens.read(start, stop).tolist() == whole[start:stop].tolist()
    assert tokens.bytes_read == 2 * (13 + 6 + 1 + 8 + 0 + 1)
    assert tokens[-4:].tolist() == whole[-4:].tolist() and tokens.bytes_read == 58  # uncounted
    with pytest.raises(IndexError):
        tokens.read(10, 14)


def test_a_share_is_the_rows_and_chunks_of_the_whole_batch(corpus):
    """What each dp x cp rank reads is its cut of the global batch the old code drew whole."""
    data = load_blend(str(corpus["a_prepared"]))
    x, y = data.sources[0].batch(3, BATCH, SEQ, seed=5)  # the whole batch, as before
    for dp in (1, 2, 4):
        for cp in (1, 2):
            parts = [[read_share(data, 3, BATCH, SEQ, 5, Share(d, dp, c, cp)) for c in range(cp)]
                     for d in range(dp)]
            whole = [np.concatenate([full_sequence([torch.from_numpy(p[i]) for p in row])
                                     .numpy() for row in parts]) for i in (0, 1)]
            assert np.array_equal(whole[0], x) and np.array_equal(whole[1], y), (dp, cp)


def _shares(ctx, spec):
    """On each rank: its share of steps 0..2 of a blend, and the bytes that took."""
    data = load_blend(spec)
    share = Share.of(ctx.groups.layout, ctx.groups.rank)
    got = [read_share(data, step, BATCH, SEQ, 7, share) for step in range(3)]
    return share, got, data.bytes_read()


def test_every_layout_reads_only_its_share_of_the_same_samples(corpus):
    spec = f"{corpus['a_prepared']}:0.6,{corpus['b_prepared']}:0.4"
    data = load_blend(spec)
    single = [read_share(data, step, BATCH, SEQ, 7, Share()) for step in range(3)]
    alone = data.bytes_read()
    layouts = ["dp=2,tp=2", "dp=2,pp=2", "dp=2,cp=2"]  # one launch of four ranks
    for layout, ranks in zip(layouts, run_on_ranks(layouts, _shares, spec), strict=True):
        for step in range(3):
            for i in (0, 1):  # inputs, targets: rebuilt from the ranks' shares
                rows = {}
                for share, got, _ in ranks:
                    rows.setdefault(share.dp_rank, {})[share.cp_rank] = got[step][i]
                whole = np.concatenate([full_sequence([torch.from_numpy(cut[c]) for c in
                                                       sorted(cut)]).numpy()
                                        for _, cut in sorted(rows.items())])
                assert np.array_equal(whole, single[step][i]), (layout, step)
        cp = 2 if "cp" in layout else 1
        row = SEQ + 1 if cp == 1 else SEQ // cp + 2  # two chunks, one more token each
        for share, _, read in ranks:  # half the rows each (of each row, its two chunks)
            assert read == 3 * (BATCH // 2) * row, (layout, share)  # 1 B a token
        assert alone == 3 * BATCH * (SEQ + 1)
        assert 0.45 < ranks[0][2] / alone * cp < 0.6


def test_prefetch_hides_a_source_slower_than_nothing(corpus, monkeypatch):
    """A source sleeping 0.8x the step per batch: the loop waits <= 5% of a step (median of
    20 steps) with prefetch, and most of that sleep without it."""
    monkeypatch.setenv(SLEEP_ENV, "0.8")

    def waits(prefetch, steps):
        records = run_training(_cfg(data=str(corpus["a"]), steps=steps, prefetch=prefetch))
        return [r["data_wait_s"] / r["step_time_s"] for r in records[2:]]

    assert statistics.median(waits(2, 22)) <= 0.05
    assert statistics.median(waits(0, 7)) > 0.3  # the hook sleeps: prefetch is what hides it


def test_loader_errors_are_one_line_and_close_stops_a_waiting_thread():
    def read(step):
        if step == 3:
            raise KeyError("gone")
        return step

    with Loader(read, range(0, 6), prefetch=2) as loader:
        assert [loader.get(s)[0] for s in range(3)] == [0, 1, 2]
        with pytest.raises(ParaxisError, match="^reading the batch of step 3 failed: KeyError"):
            loader.get(3)
    loader = Loader(lambda step: step, range(0, 1000), prefetch=2).__enter__()
    time.sleep(0.05)  # the thread fills the queue and waits to put the next batch
    assert "paraxis-loader" in [thread.name for thread in threading.enumerate()]
    began = time.perf_counter()
    loader.close()
    assert time.perf_counter() - began < 1
    assert "paraxis-loader" not in [thread.name for thread in threading.enumerate()]
    assert not [t for t in threading.enumerate() if t.name == "paraxis-loader"]


def test_resume_is_bit_identical_from_jsonl_and_from_a_blend(corpus, tmp_path):
    def train(data, folder, **options):
        return [r["loss"] for r in run_training(_cfg(data=data, checkpoint_dir=str(
            tmp_path / folder), **options))]

    for name, data in (("jsonl", str(corpus["b"])),
                       ("blend", f"{corpus['a']}:0.7,{corpus['b_prepared']}:0.3")):
        straight = train(data, f"{name}/straight")
        assert train(data, f"{name}/split", exit_after=2) == straight[:2], name
        assert train(data, f"{name}/split", resume="auto") == straight[2:], name
    other = f"{corpus['a']}:0.5,{corpus['b_prepared']}:0.5"
    with pytest.raises(ParaxisError, match="^resuming .* with --data .*--allow-resume-changes"):
        run_training(_cfg(data=other, checkpoint_dir=str(tmp_path / "blend" / "split"),
                          resume="auto", steps=6))
    assert len(train(other, "blend/split", resume="auto", steps=5,
                     allow_resume_changes=True)) == 1


def test_a_blend_draws_its_proportions_the_same_every_time(corpus):
    spec = f"{corpus['a_prepared']}:0.7,{corpus['b_prepared']}:0.3"
    blend = load_blend(spec)
    letters = []
    for step in range(200):
        x, _ = read_share(blend, step, BATCH, SEQ, 0, Share())
        for row in x:
            kinds = set(bytes(row.astype(np.uint8)).decode()) - {" ", "\0"}
            assert kinds in ({"a"}, {"b"}), kinds  # a row comes from one source
            letters.append(kinds.pop())
    assert letters.count("a") / len(letters) == pytest.approx(0.7, abs=0.03)
    again = load_blend(spec).positions(11, BATCH, SEQ, 0)
    assert all(np.array_equal(p, q) for p, q in zip(blend.positions(11, BATCH, SEQ, 0)[1:],
                                                     again[1:], strict=True))
    one = load_blend(f"{corpus['b_prepared']}:1")  # one source draws as before blends:
    tokens = np.asarray(one.sources[0].tokens)  # the draw written out as it was then
    split_at = int(len(tokens) * 0.95)
    starts = np.random.default_rng([0, 4, 0]).integers(0, split_at - SEQ - 1, size=BATCH)
    assert np.array_equal(read_share(one, 4, BATCH, SEQ, 0, Share())[0],
                          np.stack([tokens[s:s + SEQ] for s in starts]).astype(np.int64))
    assert parse_blend("x.jsonl:3,y:1") == [("x.jsonl", 0.75), ("y", 0.25)]


def test_val_data_is_what_val_loss_measures(corpus):
    blend = load_blend(str(corpus["b"]))
    blend.val = load_blend(str(corpus["val"]))
    x, _ = read_share(blend, 0, BATCH, SEQ, 0, Share(), split="val")
    assert set(bytes(x.astype(np.uint8).ravel()).decode()) <= {"z", "\0"}

    def run(**flags):
        records = run_training(_cfg(data=str(corpus["b"]), steps=2, eval_every=2,
                                    eval_batches=1, **flags))
        return [r["loss"] for r in records], [r["val_loss"] for r in records if "val_loss" in r]

    train_z, val_z = run(val_data=str(corpus["val"]))
    train_a, val_a = run(val_data=str(corpus["a"]))
    _, val_tail = run()
    assert train_z == train_a  # the held-out set does not touch training
    assert val_z != val_a and val_z != val_tail and len(val_z) == 1


@pytest.mark.parametrize("data, message", [
    ("{a}:0,{b}:1", "blend weight 0 of .*a is not a positive number"),
    ("{a}:-1,{b}:2", "blend weight -1 of .*a is not a positive number"),
    ("{a}:nan,{b}:1", "blend weight nan of .*a is not a positive number"),
    ("{a}:heavy,{b}:1", "blend weight 'heavy' of .*a is not a number; write PATH:WEIGHT"),
    ("{a}:abc", "blend weight 'abc' of .*a is not a number"),
    ("{a}/missing.jsonl", "data .*missing.jsonl does not exist; give an existing .bin token "
                          "file, text file or folder, JSONL or Parquet source"),
    ("{a},{b}:1", "blend item '.*a' of --data .* has no weight; write PATH:WEIGHT"),
    ("{a}:0.5,{a}/missing.jsonl:0.5", "data .*missing.jsonl does not exist"),
])
def test_bad_blends_are_one_line(corpus, capsys, data, message):
    data = data.format(a=corpus["a"], b=corpus["b"])
    assert main(["train", "--data", data, "--steps", "1", "--quiet", "--device", "cpu"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1, error
    assert re.search(message, error), error


def test_bad_val_data_and_prefetch_are_one_line(corpus, capsys, monkeypatch):
    for argv, message in ((["--val-data", "nowhere.jsonl", "--eval-every", "1"],
                           "data nowhere.jsonl does not exist"),
                          (["--prefetch", "-1"], "--prefetch -1 must be >= 0")):
        assert main(["train", "--data", str(corpus["b"]), "--steps", "1", "--quiet",
                     "--device", "cpu", *argv]) == 2
        error = capsys.readouterr().err
        assert message in error and error.count("\n") == 1, error
    monkeypatch.setenv(SLEEP_ENV, "slow")
    assert main(["train", "--steps", "1", "--quiet", "--device", "cpu"]) == 2
    assert f"{SLEEP_ENV}=slow (a test hook)" in capsys.readouterr().err
