"""The distributed test harness: real gloo ranks, errors surfaced, no hangs."""

import time

import pytest
import torch
import torch.distributed as dist

from paraxis.testing import RankFailed, distributed, run_distributed


def _sum_of_ranks() -> float:
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    return t.item()


@pytest.mark.parametrize("world", [4, 8])
def test_all_reduce_of_rank_ids(world):
    assert run_distributed(_sum_of_ranks, world) == [world * (world - 1) / 2] * world


def _rank_two_fails() -> None:
    if dist.get_rank() == 2:
        raise ValueError("rank two is broken")
    dist.barrier()  # the others would wait here forever


def test_failing_rank_fails_the_caller_with_its_error():
    started = time.monotonic()
    with pytest.raises(RankFailed, match="rank 2 failed(.|\n)*rank two is broken"):
        run_distributed(_rank_two_fails, 4, timeout_s=60)
    assert time.monotonic() - started < 30


def _one_rank_hangs() -> None:
    if dist.get_rank() == 0:
        time.sleep(3600)


def test_hang_becomes_a_failure():
    with pytest.raises(RankFailed, match=r"rank\(s\) \[0, 1\] did not finish"):
        run_distributed(_one_rank_hangs, 2, timeout_s=8)


@distributed(world_size=2)
def test_decorator_runs_the_body_on_every_rank():
    assert dist.get_world_size() == 2
    assert torch.get_num_threads() == 1
