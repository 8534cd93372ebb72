"""dp=2 x tp=2 with ZeRO-1 (the data-parallel engine on tensor-parallel shards) trains like
one device: same losses and global gradient norms over 4 steps, through the torchrun CLI."""

import json

import pytest

from paraxis.cli import main
from paraxis.dist.testing import one_thread
from paraxis.train.run_file import read_run_file


def test_dp2_tp2_zero1_with_sequence_parallel_matches_one_device(dp2_tp2_job, tmp_path):
    # One torchrun job, shared with test_two_hosts (conftest.dp2_tp2_job); plain TP was
    # checked too when written. One device is the same command here, in this process.
    metrics = tmp_path / "one.jsonl"
    with one_thread():
        assert main(["train", *dp2_tp2_job.common, "--metrics-file", str(metrics)]) == 0
    one_device = [json.loads(line) for line in metrics.read_text().splitlines()]
    for one, dp_tp in zip(one_device, dp2_tp2_job.records, strict=True):
        assert dp_tp["loss"] == pytest.approx(one["loss"], rel=1e-5)
        assert dp_tp["grad_norm"] == pytest.approx(one["grad_norm"], rel=1e-5)
    # the torchrun job's config.toml replays with `paraxis train --config` on as many ranks:
    # it records nproc = 4, not each rank's own 1
    assert read_run_file(dp2_tp2_job.folder / "config.toml").launch.nproc == 4
