"""Which collective carries each of the runtime's sums and gathers on each kind of backend,
torch-free: the runtime posts it (`paraxis.dist.collectives.reduce_scatter_into`,
`paraxis.engine.data_parallel.flat`), the planner prices it (`plan.comm.scatter_time`,
`plan.comm.zero_time`).

NCCL's collectives are used as they are: its reduce-scatter sums in its ring as it moves the
parts, its all-gather writes each part in place, and neither allocates. gloo's (and so CPU
ranks', and CUDA ranks that share GPUs through it) are another matter: its reduce-scatter
is slower than its all-reduce of the whole buffer and three times its own all-to-all, and
its reduce-scatter and all-gather each allocate a temporary as large as the full buffer.
There, two forms carry them, by what the caller can spare:

- Activations (sequence parallelism's reduce-scatters, the all-gather context parallelism's
  dK/dV): each rank's parts travel by an all-to-all and every owner adds the ones it receives
  in rank order. The same bytes leave each rank, and the sum's order no longer depends on the
  algorithm.
- ZeRO's gradient buckets and parameter gathers: an all-reduce of the flat buffer in place,
  zero-filled around this rank's part to gather (x + 0 + ... + 0 is x, exactly), then read
  at this rank's part to reduce-scatter. No second buffer, and as fast.

On 16 MB over 4 ranks of a 2-core VM the all-to-all form with its owner's sum took 21-25 ms,
the in-place all-reduce 20-21, gloo's reduce-scatter 34 and its all-to-all alone 9-11
(`python -m tools.probes.memory_probes --only collectives`, three runs).
"""

from __future__ import annotations


def reduce_scatter_form(through_host: bool) -> str:
    """The collective that carries a reduce-scatter of activations: "reduce_scatter", or
    "all_to_all" (its parts summed by their owner) where the group runs on gloo's host-side
    algorithms."""
    return "all_to_all" if through_host else "reduce_scatter"


def zero_form(op: str, through_host: bool) -> str:
    """The collective that carries ZeRO's `op` ("reduce_scatter" of gradients, "all_gather"
    of parameters) of a flat buffer: `op` itself, or an in-place "all_reduce" of the whole
    buffer where the group runs on gloo's host-side algorithms."""
    if op not in ("reduce_scatter", "all_gather"):
        raise ValueError(f"ZeRO runs no {op!r}; its collectives are reduce_scatter and "
                         "all_gather")
    return "all_reduce" if through_host else op
