"""Ranks sharing GPUs (`--share-gpu`, paraxis/dist/shared_gpu.py): every call paraxis makes
goes through the staged group and gives gloo's result, and a run trains the same numbers as
over gloo. On CPU ranks the group copies nothing; on a GPU machine the same calls stage CUDA
tensors (tools/probes/shared_gpu.py runs every axis there; docs/gpu/README.md)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from paraxis.dist.collectives import (
    all_gather_single,
    reduce_scatter_into,
    reduce_scatter_single,
)
from paraxis.dist.launch import cuda_ranks_problem
from paraxis.dist.shared_gpu import BACKEND
from paraxis.dist.testing import (
    RankContext,
    flag_args,
    gpu_count,
    run_distributed,
    run_on_ranks,
    train_records,
)


def _every_call(on_gpu: bool = False) -> dict[str, bool]:
    """Each call paraxis makes (dist/, engine/, parallel/), checked against its sum or copy
    worked out here; a sub-group too, and the p2p calls both batched and alone. `on_gpu`:
    every tensor on this rank's GPU."""
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_default_device(f"cuda:{torch.cuda.current_device()}" if on_gpu else "cpu")
    mine = torch.arange(6, dtype=torch.float32) + 10 * rank
    every = [torch.arange(6, dtype=torch.float32) + 10 * r for r in range(world)]
    ok = {"backend": dist.get_backend() == BACKEND}
    total = mine.clone()
    dist.all_reduce(total)
    ok["all_reduce"] = torch.equal(total, sum(every))
    pair = dist.new_group([0, 1])
    total = mine.clone()
    work = dist.all_reduce(total, group=pair, async_op=True)
    work.wait()
    ok["all_reduce in a sub-group"] = torch.equal(total, every[0] + every[1])
    parts = [torch.empty(6) for _ in range(world)]
    dist.all_gather(parts, mine)
    ok["all_gather"] = all(torch.equal(p, e) for p, e in zip(parts, every, strict=True))
    full = torch.empty(6 * world)
    all_gather_single(full, mine)
    ok["all_gather_single"] = torch.equal(full, torch.cat(every))
    shard = torch.empty(6 // world)
    reduce_scatter_single(shard, mine)
    ok["reduce_scatter_single"] = torch.equal(shard, sum(every).chunk(world)[rank])
    # the activations' reduce-scatter as paraxis carries it here (an all-to-all, each owner
    # adding its parts in rank order: spec.collectives), waited for and alone
    summed = torch.empty(6 // world)
    reduce_scatter_into(summed, mine)
    later = torch.empty(6 // world)
    handle = reduce_scatter_into(later, mine * 3, async_op=True)
    handle.wait()
    ok["reduce_scatter_into"] = (torch.equal(summed, sum(every).chunk(world)[rank])
                                 and torch.equal(later, (3 * sum(every)).chunk(world)[rank]))
    swapped = torch.empty(6)
    dist.all_to_all_single(swapped, mine)
    ok["all_to_all_single"] = torch.equal(
        swapped, torch.cat([e.chunk(world)[rank] for e in every]))
    sends = [[1, 5], [4, 2]][rank]  # rows this rank sends to ranks 0 and 1
    receives = [[1, 4], [5, 2]][rank]  # and takes from them
    received = torch.empty(sum(receives))
    dist.all_to_all_single(received, mine, receives, sends)
    expected = [every[0][:1], every[1][:4]] if rank == 0 else [every[0][1:6], every[1][4:6]]
    ok["all_to_all_single with splits"] = torch.equal(received, torch.cat(expected))
    gathered = [torch.empty(6) for _ in range(world)] if rank == 0 else None
    dist.gather(mine, gathered, dst=0)  # what gather_object (the run's trace) calls
    ok["gather"] = rank != 0 or all(torch.equal(g, e) for g, e in zip(gathered, every,
                                                                        strict=True))
    shared = mine.clone()
    dist.broadcast(shared, src=1)
    ok["broadcast"] = torch.equal(shared, every[1])
    peer = 1 - rank
    incoming = torch.empty(6)
    for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, mine.clone(), peer),
                                        dist.P2POp(dist.irecv, incoming, peer)]):
        work.wait()
    ok["batch_isend_irecv"] = torch.equal(incoming, every[peer])
    alone = torch.empty(6)
    sent, got = dist.isend(mine * 2, peer, tag=3), dist.irecv(alone, peer, tag=3)
    sent.wait()
    got.wait()
    ok["isend / irecv"] = torch.equal(alone, every[peer] * 2)
    dist.barrier()
    return ok


def test_every_call_paraxis_makes_gives_its_result_through_gloo() -> None:
    for rank, checks in enumerate(run_distributed(_every_call, 2, share_gpu=True)):
        assert all(checks.values()), (rank, [name for name, ok in checks.items() if not ok])


@pytest.mark.skipif(gpu_count() == 0, reason="needs a CUDA GPU (the ranks share it)")
def test_every_call_stages_cuda_tensors_on_one_gpu() -> None:
    results = run_distributed(_every_call, 2, args=(True,), device="cuda", share_gpu=True)
    for rank, checks in enumerate(results):
        assert all(checks.values()), (rank, [name for name, ok in checks.items() if not ok])


def _losses_over_gloo(ctx: RankContext, flags: dict) -> list[float]:
    from paraxis.train.config import RunConfig
    from paraxis.train.loop import run_training

    records = run_training(RunConfig.from_flags(**flags, quiet=True, layout=str(ctx.layout)))
    return [r["loss"] for r in records if "loss" in r]


def test_a_run_trains_the_same_numbers_as_over_gloo(tmp_path) -> None:
    # data parallel with sharded states (its gathers and reductions) and a pipeline (its
    # sends and receives); TP's calls are _every_call's. `paraxis train --share-gpu` as a
    # user runs it, against the same run on ranks forked here over plain gloo.
    layout = "dp=2,pp=2,zero=1,microbatches=2"
    flags = dict(model="tiny", steps=2, global_batch=8, seq_len=32, device="cpu", log_every=1)
    shared = train_records([*flag_args(flags), "--layout", layout, "--share-gpu"],
                           tmp_path / "shared.jsonl", nproc=4)
    gloo = run_on_ranks(layout, _losses_over_gloo, flags)[0]
    assert gloo and gloo == [r["loss"] for r in shared if "loss" in r]


def test_more_cuda_ranks_than_gpus_run_when_they_share() -> None:
    assert cuda_ranks_problem(4, "cuda", 1, None, share_gpu=True) is None
    assert cuda_ranks_problem(2, "cuda:0", 1, None, share_gpu=True) is None
    assert "--share-gpu" in cuda_ranks_problem(4, "cuda", 1, None)
    assert "shows no CUDA GPU" in cuda_ranks_problem(2, "cuda", 0, None, share_gpu=True)
