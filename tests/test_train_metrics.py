"""What a run reports: held-out loss on every layout, MFU from the planner's formula,
TensorBoard events, and metrics that continue across a resume."""

from __future__ import annotations

import json

import pytest
import torch

from paraxis.dist.testing import RankContext, run_on_ranks
from paraxis.files.model_file import load_model_config
from paraxis.plan.compute import model_flops_per_token
from paraxis.train.config import RunConfig
from paraxis.train.loop import run_training


def _cfg(layout: str = "dp=1", **options) -> RunConfig:
    options = {"model": "tiny", "steps": 3, "global_batch": 8, "seq_len": 32, "quiet": True,
               "eval_every": 3, "eval_batches": 2, **options}
    return RunConfig.from_flags(layout=layout, **options)


def _val_loss(ctx: RankContext) -> float:
    return run_training(_cfg(str(ctx.layout)))[-1]["val_loss"]


@pytest.mark.slow
def test_held_out_loss_is_the_same_on_every_layout():
    layouts = ["dp=2,pp=2,microbatches=2", "dp=2,tp=2,zero=3", "tp=2,pp=2,schedule=gpipe"]
    parallel = [by_rank[0] for by_rank in run_on_ranks(layouts, _val_loss, timeout_s=170)]
    single = run_training(_cfg())[-1]["val_loss"]
    torch.testing.assert_close(torch.tensor(parallel), torch.tensor([single] * 3), rtol=1e-5,
                               atol=0)


def test_mfu_uses_the_planners_flops(tmp_path):
    records = run_training(_cfg(peak_tflops=1.0, tensorboard=str(tmp_path / "tb"),
                                metrics_file=str(tmp_path / "m.jsonl")))
    flops = model_flops_per_token(load_model_config("tiny"), 32)
    for record in records:
        assert record["mfu"] == pytest.approx(flops * record["tokens_per_s"] / 1e12)
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))


def test_metrics_continue_across_a_resume(tmp_path):
    options = {"steps": 4, "eval_every": 0, "metrics_file": str(tmp_path / "m.jsonl"),
               "checkpoint_dir": str(tmp_path / "ckpt")}
    run_training(_cfg(exit_after=2, **options))
    run_training(_cfg(resume="auto", **options))
    lines = (tmp_path / "m.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [0, 1, 2, 3]
