"""The small collectives paraxis's runtime makes once a step, besides its layers' calls,
the pipeline's messages and the gradient sync, and what they cost.

Each moves a few bytes, so each costs its latency: tens of microseconds on a GPU, nothing
beside a step of seconds. On CPU ranks that share a few cores each is a millisecond or
more with its sync wait (`sync.sync_wait`), and a small model's step has a few dozen
milliseconds of compute: in `paraxis demo`'s dp=2 x tp=2 x pp=2 they are 7 calls, about
a tenth of the step, which the planner left out until they were found (docs/planner.md).

One list, in the order a training step makes them (`tests/test_step_calls.py` counts
them on real ranks, layout by layout, against this list):

- the loss, broadcast from the stage that computed it over the pipeline
  (pipeline_parallel/engine.py) and averaged over the data-parallel replicas
  (data_parallel/engine.py `reduce_loss`);
- a tied embedding's gradient, summed between the first and the last stage where they are
  two ranks (pipeline_parallel/tied.py);
- with sequence parallelism, the partial gradients of the replicated parameters it applies
  to sequence shards (norms, row-parallel biases, positions), summed over the TP group in
  one call after the gradient sync (parallel/tensor/partial.py `sum_partial_grads`; priced
  as a small call: a Llama 2 70B's 161 norms are 5 MB of fp32 gradients, 0.1 ms on NVLink);
  the routers' too where experts are split over tp (etp > 1), with SP or without; and the
  routers' and experts' where each tp rank runs its own sequence shard through them (their
  bytes are priced apart: `experts.shard_grad_sum_seconds`, an estimate's `tp_grads`);
- the gradient norm for clipping: summed over the TP group, over the replicas where ZeRO
  shards gradients, over the pipeline (dist/params.py `global_norm_squared`); expert
  gradients over their own group;
- a mixture of experts' routing metrics: the aux loss over the replicas (and over tp where
  each tp rank routes its own sequence shard), the expert token counts and the aux loss over
  the pipeline (metrics.py `moe_step_metrics`);
- the stop flag, over the whole world (dist/preemption.py `StopRequest.agreed`).

Not in the list: fp16's overflow flag (a max over tp, replicas and pp; the planner's
`Precision` does not tell fp16 from bf16), packed data's target count (one all-reduce over
the replicas), and what only logging steps do (every rank's peak memory).
"""

from __future__ import annotations

import functools
import math

from paraxis.plan.comm import Link, axis_link, group_link, group_ranks
from paraxis.plan.context import replica_link
from paraxis.plan.hardware import Cluster
from paraxis.plan.sync_wait import nearest_measured, sync_wait
from paraxis.spec.expert_placement import experts_on_sequence_shards
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import ModelConfig
from paraxis.spec.schedules import head_stage


def step_calls(cfg: ModelConfig, layout: Layout, cluster: Cluster
               ) -> list[tuple[str, int, Link]]:
    """(what, group size, link) of each call in the module docstring's list, for `layout`."""
    replicas = layout.dp * layout.cp
    calls: list[tuple[str, int, Link]] = []

    def add(what: str, n: int, link: Link | None) -> None:
        if n > 1 and link is not None:
            calls.append((what, n, link))

    pp = axis_link(layout, "pp", cluster) if layout.pp > 1 else None
    replica = replica_link(layout, cluster) if replicas > 1 else None
    add("loss broadcast", layout.pp, pp)
    add("loss mean", replicas, replica)
    if cfg.tied_embeddings and layout.pp > 1 and head_stage(layout.pp, layout.placement) != 0:
        ends = group_ranks(layout, "pp")
        add("tied embedding gradient", 2, group_link([ends[0], ends[-1]], cluster))
    tp = axis_link(layout, "tp", cluster) if layout.tp > 1 else None
    if layout.sequence_parallel or (cfg.is_moe and layout.etp > 1):
        add("partial gradients over tp", layout.tp, tp)
    add("norm over tp", layout.tp, tp)
    if layout.zero >= 1:
        add("norm over replicas", replicas, replica)
    if cfg.is_moe and layout.ep > 1:
        add("expert norm", replicas if layout.zero >= 1 else layout.ep, replica)
    add("norm over pp", layout.pp, pp)
    if cfg.is_moe:
        add("aux loss over replicas", replicas, replica)
        if experts_on_sequence_shards(layout.tp, layout.sequence_parallel, layout.etp,
                                      cfg.capacity_factor):
            add("aux loss over tp", layout.tp, tp)
        add("expert counts over pp", layout.pp, pp)
        add("aux loss over pp", layout.pp, pp)
    world = layout.world_size
    add("stop flag", world, _world_link(cluster, world) if world > 1 else None)
    return calls


def _world_link(cluster: Cluster, world: int) -> Link:
    # A search prices thousands of layouts of one world. A Cluster's equality leaves out its
    # calibrated fits (dicts), so the cache is keyed on those dicts too: two profiles of one
    # machine (before and after a run) must not share a link.
    return _cached_world_link(cluster, world, id(cluster.collectives), id(cluster.sync_wait_s),
                              id(cluster.scalar_call_s), id(cluster.sync_wait_curve_s))


@functools.lru_cache(maxsize=256)  # its keys hold the clusters, so the ids stay theirs
def _cached_world_link(cluster: Cluster, world: int, *fits: int) -> Link:
    return group_link(list(range(world)), cluster)


def scalar_call_time(n: int, link: Link, cluster: Cluster) -> float:
    """Seconds of one call of a few bytes over a group of `n` on `link` in a step (the
    loss's broadcast too): on CPU ranks inside a node, the one-element all-reduce the
    calibration timed (`Cluster.scalar_call_s`) plus the call's sync wait. Elsewhere (and
    for a profile without that figure) a tree's latency: the call's fixed cost and
    2 log2(n) hops, up and down (NCCL takes its tree for small messages across nodes,
    Sanders et al. 2009's double binary tree; a ring's 2(n-1) hops would charge 3072 GPUs
    about 6000 latencies for eight bytes)."""
    measured = nearest_measured(cluster.scalar_call_s, cluster, n)
    if measured is not None and not link.crosses_nodes:
        return measured + sync_wait(cluster, n)
    _, latency = link.cost("all_reduce")
    return link.call_latency_s + 2 * math.ceil(math.log2(n)) * latency


def step_calls_time(cfg: ModelConfig, layout: Layout, cluster: Cluster) -> float:
    """Seconds a step spends in `step_calls`: each on the critical path, one after another
    (the step cannot go on before it returns)."""
    return sum(scalar_call_time(n, link, cluster)
               for _, n, link in step_calls(cfg, layout, cluster))
