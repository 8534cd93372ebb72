"""dp=2 x tp=2 with ZeRO-1 (the data-parallel engine on tensor-parallel shards) trains like
one device: same losses and global gradient norms over 4 steps, through the torchrun CLI."""

import pytest

from paraxis.dist.testing import train_records
from paraxis.train.run_file import read_run_file


def test_dp2_tp2_zero1_with_sequence_parallel_matches_one_device(tmp_path):
    # One run (4 torchrun ranks cost ~50 s on 2 cores); plain TP was checked too when written.
    sequence_parallel = ["--sequence-parallel"]
    common = ["--model", "tiny", "--steps", "4", "--global-batch", "4", "--seq-len", "32",
              "--device", "cpu", "--quiet"]
    runs = {"one": train_records(common, tmp_path / "one.jsonl"),
            "dp_tp": train_records([*common, "--dp", "2", "--tp", "2", "--zero", "1",
                                    *sequence_parallel], tmp_path / "dp_tp.jsonl", nproc=4)}
    for one, dp_tp in zip(runs["one"], runs["dp_tp"], strict=True):
        assert dp_tp["loss"] == pytest.approx(one["loss"], rel=1e-5)
        assert dp_tp["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)
    # the torchrun job's config.toml (written last) replays with `paraxis train --config`
    # on as many ranks: it records nproc = 4, not each rank's own 1
    assert read_run_file(tmp_path / "config.toml").launch.nproc == 4
