"""How the runtime runs a reduce-scatter of activations on each kind of backend, torch-free:
the runtime posts it (`paraxis.dist.collectives.reduce_scatter_into`), the planner prices it
(`plan.comm.scatter_time`).

NCCL's reduce-scatter sums in its ring as it moves the parts. gloo's is slower than its
all-reduce of the whole buffer and three times its own all-to-all, so on gloo, and on CUDA
ranks that share GPUs through it, each rank's parts travel by an all-to-all and every owner
adds the ones it receives in rank order: the same bytes leave each rank, and the sum's order
no longer depends on the algorithm. With that sum, 16 MB over 4 ranks of a 2-core VM took
21-25 ms where gloo's reduce-scatter took 34, its all-to-all alone 9-11 and its in-place
all-reduce 20-21 (`python -m tools.probes.memory_probes --only collectives`, three runs).
Sequence parallelism's reduce-scatters and the all-gather context parallelism's dK/dV run
this way. ZeRO's gradient buckets do not: on gloo they are summed in place by an all-reduce
(`engine/data_parallel/flat.py`), as fast here and with no second buffer.
"""

from __future__ import annotations


def reduce_scatter_form(through_host: bool) -> str:
    """The collective that carries a reduce-scatter: "reduce_scatter", or "all_to_all" (its
    parts summed by their owner) where the group runs on gloo's host-side algorithms."""
    return "all_to_all" if through_host else "reduce_scatter"
