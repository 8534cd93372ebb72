"""The stage partition's search: exact by dynamic programming for real models, a bottleneck
search past `DP_BLOCKS` blocks that finds the same largest part in about linear time."""

import random
import time

from paraxis.spec import partition
from paraxis.spec.model_config import PRESETS


def _largest(costs: list[float], bounds: list[int], first: float, last: float) -> float:
    parts = len(bounds) - 1
    return max(sum(costs[a:b]) + (first if i == 0 else 0.0) + (last if i == parts - 1 else 0.0)
               for i, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False)))


def test_the_bottleneck_search_finds_the_dynamic_programme_s_largest_part():
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(2, 60)
        parts = rng.randint(2, min(n, 8))
        costs = [rng.uniform(0.5, 2.0) for _ in range(n)]
        first, last = rng.uniform(0, 3), rng.uniform(0, 3)
        exact = partition._min_max_split(costs, parts, first, last)
        prefix = [0.0]
        for cost in costs:
            prefix.append(prefix[-1] + cost)
        fast = partition._bottleneck_split(prefix, parts, first, last)
        assert fast[0] == 0 and fast[-1] == n and len(fast) == parts + 1
        assert all(a < b for a, b in zip(fast, fast[1:], strict=False)), fast
        assert abs(_largest(costs, fast, first, last) - _largest(costs, exact, first, last)) \
            <= 1e-9 * _largest(costs, exact, first, last)


def test_a_hundred_thousand_blocks_split_in_well_under_a_second():
    # (ModelConfig itself caps a model at MAX_LAYERS; the search is timed on its own)
    started = time.perf_counter()
    bounds = partition._min_max_split([1.0] * 100_000, 4, 0.5, 0.5)
    assert time.perf_counter() - started < 1.0
    sizes = [b - a for a, b in zip(bounds, bounds[1:], strict=False)]
    assert sum(sizes) == 100_000 and max(sizes) - min(sizes) <= 2, sizes


def test_the_largest_model_a_config_takes_splits_by_the_exact_search_quickly():
    started = time.perf_counter()
    split = partition.partition_layers(PRESETS["tiny"].replace(n_layers=512), 8, 1)
    assert time.perf_counter() - started < 5.0
    assert sum(len(part) for part in split.parts) == 512
