"""`paraxis train --pp ...` end to end under torchrun, and its one-line errors."""

import subprocess
import sys

import pytest

from paraxis.dist.testing import train_records
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import PRESETS
from paraxis.train.config import RunConfig
from paraxis.train.loop import run_training

COMMON = ["--model", "tiny", "--steps", "3", "--global-batch", "8", "--seq-len", "32",
          "--device", "cpu", "--quiet"]


def test_torchrun_pipeline_training_matches_one_device(tmp_path):
    records = train_records([*COMMON, "--pp", "2", "--schedule", "1f1b", "--microbatches", "4",
                             "--recompute", "selective"], tmp_path / "pp.jsonl", nproc=2,
                            timeout_s=120)
    piped = [r["loss"] for r in records]
    single = run_training(RunConfig.from_flags(model="tiny", steps=3, global_batch=8,
                                               seq_len=32, device="cpu", quiet=True,
                                               microbatches=4))
    assert piped == pytest.approx([r["loss"] for r in single], rel=1e-5)


def test_bad_pipeline_input_is_one_line():
    result = subprocess.run([sys.executable, "-m", "paraxis", "train", *COMMON, "--pp", "4",
                             "--schedule", "interleaved", "--virtual", "2",
                             "--microbatches", "6"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "multiple of pp (4); use microbatches=8" in result.stderr
    with pytest.raises(ParaxisError, match="4 layers cannot fill") as error:
        Layout(pp=8).validate(world_size=8, model=PRESETS["tiny"])
    assert "\n" not in str(error.value)
