"""The planner prices the small calls a training step makes besides its layers', the
pipeline's and the gradient sync's (plan/step_calls.py): the list must be the runtime's.

Real training runs (`run_training`, the loop `paraxis train` runs) on 8 gloo ranks, every
wait recorded where it is made (`WATCH.on_wait`), one step in the middle of the run.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

from paraxis.plan.hardware import Cluster, get_gpu
from paraxis.plan.step_calls import step_calls, step_calls_time
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import PRESETS

PACKAGE = Path(__file__).resolve().parents[1] / "paraxis"
# Where the calls priced elsewhere are made: a layer's TP, CP and EP collectives, an MoE
# block's routing counts (`experts.routing_calls_seconds`) and the vocab-parallel loss (per
# microbatch), the pipeline's messages, the gradient sync and ZeRO's parameter gathers.
PRICED_ELSEWHERE = ("parallel/tensor/comm.py", "parallel/tensor/cross_entropy.py",
                    "parallel/tensor/apply.py", "parallel/context/",
                    "parallel/experts/expert_parallel.py", "parallel/experts/layer.py",
                    "dist/all_to_all.py", "engine/pipeline_parallel/executor.py",
                    "engine/data_parallel/buckets.py", "engine/data_parallel/zero.py",
                    "engine/data_parallel/engine.py all_gather")
RUNS = [  # (model, layout): one launch of 8 ranks runs them all
    ("tiny", "dp=2,tp=2,pp=2,zero=1,microbatches=2,schedule=1f1b"),  # paraxis demo's
    ("tiny", "dp=8"),
    ("tiny", "dp=4,tp=2,zero=3"),
    ("tiny-llama", "dp=2,cp=2,tp=2,zero=2"),
    ("tiny", "dp=2,pp=4,microbatches=4,schedule=1f1b"),
    ("tiny", "dp=4,pp=2,microbatches=4,schedule=interleaved,virtual_stages=2"),
    ("tiny", "dp=4,pp=2,microbatches=2,schedule=zb-v"),  # the head on stage 0: no tied call
    ("tiny-moe", "dp=4,pp=2,ep=2,zero=1,microbatches=2,schedule=1f1b"),
    # SP's partial gradients: one sum over tp a step, after the sync (ZeRO-2: on the shards)
    ("tiny", "dp=2,tp=2,pp=2,zero=2,microbatches=2,schedule=1f1b,sequence_parallel=true"),
    # experts split over tp: the routers' partial gradients summed without SP, the experts'
    # norm summed over tp in the sharded norm's call
    ("tiny-moe", "dp=4,tp=2,ep=2,etp=2,zero=1"),
    # whole experts on SP's sequence shards: their gradients join the partial sum over tp,
    # and the aux loss is averaged over tp
    ("tiny-moe", "dp=4,tp=2,ep=2,zero=1,sequence_parallel=true"),
]
RECORDED_STEP = 1  # of 3: not the first, nor a logging step (0 and the last)


def _site(frame, op: str) -> str:
    """The file, under paraxis/, of the code that called WATCH.waiting, and the op."""
    return f"{Path(frame.f_code.co_filename).resolve().relative_to(PACKAGE)} {op}"


def _calls_of_one_step(runs: list[tuple[str, str]]) -> list[list[tuple[str, int]]]:
    """On every rank: each run's (call site, group size) of every wait in RECORDED_STEP."""
    import torch.distributed as dist

    from paraxis.dist.watchdog import WATCH
    from paraxis.train.config import RunConfig
    from paraxis.train.loop import run_training

    by_run = []
    for model, layout in runs:
        seen: list[tuple[str, int]] = []

        def record(seen=seen) -> None:
            if WATCH.step == RECORDED_STEP:
                size = dist.get_world_size(WATCH.group)  # None: the world
                seen.append((_site(sys._getframe(2), WATCH.op), size))

        WATCH.on_wait = record
        try:
            run_training(RunConfig.from_flags(model=model, layout=layout, steps=3,
                                              global_batch=16, seq_len=32, quiet=True,
                                              device="cpu", log_every=2))
        finally:
            WATCH.on_wait = None
        by_run.append(seen)
    return by_run


@pytest.fixture(scope="module")
def recorded() -> list[list[list[tuple[str, int]]]]:
    from paraxis.dist.testing import run_distributed

    return run_distributed(_calls_of_one_step, 8, (RUNS,), timeout_s=300)


@pytest.mark.parametrize("index", range(len(RUNS)), ids=[f"{m}:{t}" for m, t in RUNS])
def test_the_step_calls_the_planner_prices_are_the_runtimes(recorded, index):
    model, text = RUNS[index]
    layout = Layout.parse(text)
    cluster = Cluster(get_gpu("a100-80gb"), 1, 8)
    priced = Counter(n for _, n, _ in step_calls(PRESETS[model], layout, cluster))
    busiest: Counter = Counter()
    for rank, by_run in enumerate(recorded):
        sites = by_run[index]
        assert any(s.startswith(PRICED_ELSEWHERE) for s, _ in sites), sites  # the sync, at least
        own = Counter(n for s, n in sites if not s.startswith(PRICED_ELSEWHERE))
        message = (f"rank {rank}: the runtime's step calls (group sizes) "
                   f"{sorted(own.elements())}, priced {sorted(priced.elements())}; sites "
                   f"{sorted(set(sites))}")
        # No rank makes a call the list leaves out. A middle stage is in no tied pair, and
        # waits for it at its next call; under ZeRO a rank whose shard holds none of SP's
        # partial gradients (they follow the matrices in each unit: FlatUnit) sums none.
        assert not own - priced, message
        busiest |= own
    # and every call on the list is made, the most any rank makes of each
    assert busiest == priced, f"the ranks' calls {sorted(busiest.elements())}, priced " \
                              f"{sorted(priced.elements())}"


def test_a_gpus_step_calls_cost_microseconds_a_cpus_milliseconds():
    demo = Layout.parse(RUNS[0][1])
    gpu = step_calls_time(PRESETS["tiny"], demo, Cluster(get_gpu("a100-80gb"), 1, 8))
    assert 0 < gpu < 200e-6
    cpu = Cluster(get_gpu("a100-80gb"), 1, 8, cores_per_node=2,
                  sync_wait_s={"8": {"2": 0.5e-3, "8": 1.5e-3}},
                  scalar_call_s={"8": {"2": 1.0e-3, "8": 2.1e-3}})
    # six calls over pairs, one over the world: each its one-element call plus its wait
    assert step_calls_time(PRESETS["tiny"], demo, cpu) == pytest.approx(
        6 * (1.0e-3 + 0.5e-3) + (2.1e-3 + 1.5e-3))


def test_clusters_that_differ_only_in_their_fits_do_not_share_a_priced_link():
    # A Cluster's equality leaves its calibrated dicts out: a cache keyed on it alone once
    # priced a second profile's world call with the first's wait.
    demo = Layout.parse(RUNS[0][1])
    times = [step_calls_time(PRESETS["tiny"], demo, Cluster(
        get_gpu("a100-80gb"), 1, 8, cores_per_node=2, sync_wait_s={"8": {"2": w, "8": w}},
        scalar_call_s={"8": {"2": 1.0e-3, "8": 2.1e-3}})) for w in (0.5e-3, 1.5e-3)]
    assert times[1] - times[0] == pytest.approx(7 * 1.0e-3)  # 7 calls, each 1 ms more
