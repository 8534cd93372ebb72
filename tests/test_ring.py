"""Ring all-reduce: the simulator's bookkeeping, and a real gloo ring that must match it."""

import random

import pytest
import torch
import torch.distributed as dist

from paraxis.dist.ring import ring_all_reduce
from paraxis.dist.testing import RankContext, run_on_ranks
from paraxis.plan.ring_steps import (
    ALL_GATHER,
    REDUCE_SCATTER,
    chunk_bounds,
    ring_all_reduce_time_s,
    simulate_ring,
)
from paraxis.spec.errors import ParaxisError


def _inputs(ranks: int, size: int, seed: int) -> list[list[float]]:
    rng = random.Random(seed)
    return [[rng.uniform(-1, 1) for _ in range(size)] for _ in range(ranks)]


@pytest.mark.parametrize("ranks,size", [(2, 2), (4, 4), (4, 10), (5, 23)])
def test_simulator_phases_ownership_and_sum(ranks, size):
    sim = simulate_ring(ranks, [[float(r * 100 + i) for i in range(size)] for r in range(ranks)])
    assert len(sim.steps) == 2 * (ranks - 1)
    assert [s.phase for s in sim.steps] == [REDUCE_SCATTER] * (ranks - 1) + [ALL_GATHER] * (
        ranks - 1)
    after_rs = sim.steps[ranks - 2]
    for r in range(ranks):  # reduce-scatter leaves rank r owning the full chunk (r+1) mod N
        full = [c for c in range(ranks) if len(after_rs.contributors[r][c]) == ranks]
        assert full == [(r + 1) % ranks]
    expected = [float(sum(r * 100 + i for r in range(ranks))) for i in range(size)]
    assert sim.result == [expected] * ranks
    assert all(len(o) == ranks for row in sim.steps[-1].contributors for o in row)
    # Each rank sends one chunk per step: 2(N-1) chunks, i.e. 2(N-1)X/N bytes when N | size.
    chunk_bytes = [(b - a) * 4 for a, b in chunk_bounds(size, ranks)]
    for step in sim.steps:
        assert sorted(step.bytes_sent) == sorted(chunk_bytes[t.chunk] for t in step.transfers)
    if size % ranks == 0:
        assert sim.bytes_sent_per_rank == 2 * (ranks - 1) * size * 4 // ranks


def test_cost_formula_matches_the_seed_worked_example():
    # Seed chapter 2: N=8, X=2 GB, B=25 GB/s -> 2*7*2/(8*25) = 0.14 s.
    assert ring_all_reduce_time_s(2e9, 8, 25e9) == pytest.approx(0.14)
    assert ring_all_reduce_time_s(2e9, 8, 25e9, latency_s=1e-3) == pytest.approx(0.154)
    assert ring_all_reduce_time_s(2e9, 1, 25e9) == 0.0


def test_simulator_refuses_vectors_shorter_than_the_ring():
    with pytest.raises(ParaxisError, match="--size 4"):
        simulate_ring(4, size=3)


def _real_ring(ctx: RankContext,
               cases: list[tuple[int, int]]) -> list[tuple[list[list[float]], list[float], bool]]:
    rank = dist.get_rank()
    out = []
    for size, seed in cases:
        mine = torch.tensor(_inputs(dist.get_world_size(), size, seed)[rank], dtype=torch.float64)
        reference = mine.clone()
        states = ring_all_reduce(mine, record=True)
        dist.all_reduce(reference)
        out.append(([s.tolist() for s in states], mine.tolist(),
                     torch.allclose(mine, reference, rtol=0, atol=1e-12)))
    return out


@pytest.mark.slow
def test_real_gloo_ring_matches_the_simulator_step_by_step():
    cases = [(4, 0), (10, 1), (37, 2)]  # even chunks, uneven chunks, longer vector
    per_rank = run_on_ranks(4, _real_ring, cases)
    for case_index, (size, seed) in enumerate(cases):
        sim = simulate_ring(4, _inputs(4, size, seed), bytes_per_element=8)
        for rank in range(4):
            states, result, same_as_all_reduce = per_rank[rank][case_index]
            assert len(states) == len(sim.steps) == 6
            for step, state in zip(sim.steps, states, strict=True):
                # bit-exact: the same float64 additions in the same order
                assert state == [x for chunk in step.values[rank] for x in chunk], (
                    f"size {size}, rank {rank}, step {step.index}")
            assert result == sim.result[rank]
            assert same_as_all_reduce


def _integer_ring(ctx: RankContext) -> list[float]:
    t = torch.arange(6, dtype=torch.float32) * (dist.get_rank() + 1)
    expected = t.clone()
    dist.all_reduce(expected)
    ring_all_reduce(t)
    assert torch.equal(t, expected)
    return t.tolist()


@pytest.mark.slow
def test_real_ring_equals_dist_all_reduce_exactly_on_integers():
    assert run_on_ranks(4, _integer_ring) == [[float(i * 10) for i in range(6)]] * 4


def test_piped_output_keeps_each_line_whole(capsys):
    """Piped to a log (not a terminal), rich folded lines at 80 columns: the cost line was
    cut in two between "α = 0" and "µs"."""
    from paraxis.cli import main

    assert main(["ring", "--ranks", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    cost = [line for line in lines if line.startswith("time T = ")]
    assert len(cost) == 1 and cost[0].rstrip().endswith("µs"), cost
