"""`paraxis train --nproc N` launches its own ranks and trains like one process."""

import json
import subprocess
import sys

import pytest

from paraxis.train.config import RunConfig
from paraxis.train.loop import run_training

COMMON = ["--model", "tiny", "--steps", "3", "--global-batch", "4", "--seq-len", "32",
          "--device", "cpu", "--quiet"]


def test_nproc_2_zero_1_matches_the_single_process_run(tmp_path):
    metrics = tmp_path / "m.jsonl"
    result = subprocess.run([sys.executable, "-m", "paraxis", "train", "--nproc", "2", "--dp",
                             "2", "--zero", "1", *COMMON, "--metrics-file", str(metrics)],
                            capture_output=True, text=True, timeout=150)
    assert result.returncode == 0, result.stderr[-3000:]
    launched = [json.loads(line)["loss"] for line in metrics.read_text().splitlines()]
    single = run_training(RunConfig.from_flags(model="tiny", steps=3, global_batch=4,
                                               seq_len=32, device="cpu", quiet=True))
    assert launched == pytest.approx([r["loss"] for r in single], rel=1e-5)


def test_nproc_with_a_layout_of_another_size_is_one_line():
    result = subprocess.run([sys.executable, "-m", "paraxis", "train", "--nproc", "2", "--dp",
                             "4", *COMMON], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "paraxis: error: dp*tp*pp = 4*1*1 = 4 but the world has 2 ranks; choose degrees whose "
        "product is 2"]
