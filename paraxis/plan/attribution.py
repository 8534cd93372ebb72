"""Why one priced step is slower than another: its parts side by side, and the groups whose
collectives run on another link.

    changes = part_changes(before, after)        # compute, tp, pp, dp, ... before and after
    moves = group_moves(before.layout, old, after.layout, new)   # each group's link, both sides

Two runs may differ in GPUs and in tokens per step (a bigger cluster, a larger batch). Each
part of `after` is then scaled to `before`'s GPUs and tokens per step: seconds x GPUs / tokens
is the GPU time one token costs, so the parts' changes add up to the change in throughput per
GPU, and on the same GPUs and batch they are plain seconds per step.
"""

from __future__ import annotations

from dataclasses import dataclass

from paraxis.plan.comm import Link, axis_link, tp_collectives_per_layer
from paraxis.plan.context import copies_link, zero_link
from paraxis.plan.cost import STEP_PARTS, Estimate
from paraxis.plan.experts import ep_link
from paraxis.plan.hardware import Cluster
from paraxis.spec.layout import Layout

# the groups whose collectives `cost.evaluate` prices, with the part of the step each lands in
GROUP_PARTS = {"tp": "tp", "cp": "cp", "ep": "ep", "pp": "pp", "dp": "dp", "dp copies": "dp"}
# a link this much slower than before counts as slower (below it: rounding of the same link)
SLOWER = 0.01


def tokens_per_step(estimate: Estimate) -> float:
    return estimate.tokens_per_s * estimate.step_time_s


def scale(before: Estimate, after: Estimate) -> float:
    """What one second of `after`'s step costs at `before`'s GPUs and tokens per step."""
    return (after.layout.world_size / before.layout.world_size
            * tokens_per_step(before) / tokens_per_step(after))


def per_gpu_change(before: Estimate, after: Estimate) -> float:
    """After's throughput per GPU over before's, less one (-0.4: 40% fewer tokens/s a GPU)."""
    return before.step_time_s / (after.step_time_s * scale(before, after)) - 1


@dataclass(frozen=True)
class PartChange:
    part: str  # one of cost.STEP_PARTS
    before_s: float
    after_s: float  # scaled to before's GPUs and tokens per step (module docstring)

    @property
    def change_s(self) -> float:
        return self.after_s - self.before_s


def part_changes(before: Estimate, after: Estimate) -> list[PartChange]:
    """Every part of the step (exposed time: they add up to the step), largest rise first."""
    factor = scale(before, after)
    changes = [PartChange(part, before.time[part], after.time[part] * factor)
               for part in STEP_PARTS]
    return sorted(changes, key=lambda change: -change.change_s)


@dataclass(frozen=True)
class GroupMove:
    """One parallel group's link before and after (degree 1 on a side: no link there)."""

    axis: str  # tp, cp, ep, pp, dp, or "dp copies" (hybrid sharding's all-reduce across)
    degree_before: int
    degree_after: int
    before: Link | None
    after: Link | None
    calls: str  # the collectives it runs, in words

    @property
    def part(self) -> str:
        return GROUP_PARTS[self.axis]

    @property
    def now_crosses_nodes(self) -> bool:
        return (self.after is not None and self.after.crosses_nodes
                and (self.before is None or not self.before.crosses_nodes))

    @property
    def slower(self) -> bool:
        """On a slower link than before, or newly across nodes."""
        if self.after is None or self.before is None:
            return self.now_crosses_nodes
        return (self.now_crosses_nodes
                or self.after.cost("all_reduce")[0]
                < (1 - SLOWER) * self.before.cost("all_reduce")[0]
                or self.after.nodes > self.before.nodes)


def collectives(layout: Layout, axis: str) -> str:
    """The collectives a group of `axis` runs, as the planner prices them."""
    if axis == "tp":
        per_pass = tp_collectives_per_layer(layout.sequence_parallel)["forward"]
        names = " and ".join(name.replace("_", "-") + "s" for name, count in per_pass.items()
                             if count)
        return f"its {names} of every layer"
    if axis == "dp":
        calls = {0: "its gradient all-reduce", 1: "its gradient reduce-scatter and parameter "
                 "all-gather (ZeRO-1)", 2: "its gradient reduce-scatter and parameter "
                 "all-gather (ZeRO-2)", 3: "its parameter all-gathers and gradient "
                 "reduce-scatters of every layer (ZeRO-3)"}[layout.zero]
        return calls + sync_group_words(layout)
    return {"cp": "its K/V exchange of every attention layer",
            "ep": "its all-to-alls of every MoE block",
            "pp": "its activation and gradient sends between stages",
            "dp copies": "its all-reduce of each gradient shard across the copies"}[axis]


def sync_group_words(layout: Layout) -> str:
    """Where the gradient sync's group (`context.zero_link`) is not the dp axis: its ranks."""
    if layout.hybrid:
        cp = f" x cp = {layout.zero_ranks}" if layout.cp > 1 else ""
        return f", sharded over its dp_shard={layout.shard_size}{cp} ranks"
    if layout.cp > 1:
        return f", over the dp x cp = {layout.zero_ranks} ranks holding each parameter"
    return ""


def degree(layout: Layout, axis: str) -> int:
    """Ranks in one group of `axis` ("dp copies": the copies of each shard)."""
    return layout.replicas if axis == "dp copies" else getattr(layout, axis)


def priced_link(layout: Layout, axis: str, cluster: Cluster) -> Link | None:
    """The link the planner prices `axis`'s collectives on (None where it has none)."""
    if axis == "dp copies":
        return copies_link(layout, cluster)
    if getattr(layout, axis) == 1:
        return None
    if axis == "ep":
        return ep_link(layout, cluster)
    if axis == "dp":  # gradients sync over the dp x cp ranks holding a parameter
        return zero_link(layout, cluster)
    return axis_link(layout, axis, cluster)


def group_moves(before: Layout, before_cluster: Cluster, after: Layout,
                after_cluster: Cluster) -> list[GroupMove]:
    """Each group of either layout, with its link on each side."""
    moves = []
    for axis in GROUP_PARTS:
        old, new = (priced_link(before, axis, before_cluster),
                    priced_link(after, axis, after_cluster))
        if old is None and new is None:
            continue
        moves.append(GroupMove(axis, degree(before, axis), degree(after, axis), old, new,
                               collectives(after if new else before, axis)))
    return moves
