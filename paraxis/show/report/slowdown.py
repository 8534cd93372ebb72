"""Why throughput fell after a move: two runs' measured tokens/s (where there are runs), the
planner's price of each side, the step's parts that grew, and the groups whose collectives
now cross nodes or a slower link; then the likely cause and what to do.

    lines = diagnose_slowdown(Side(...before...), Side(...after...), best_after)
    for label, sentence in lines: print(f"{label}: {sentence}")

The planner's figures are `cost.evaluate`'s (`Estimate.time`, the parts of a step), set side
by side by `plan/attribution.py`; each link is described as the planner's defence describes
it (`explain.link_speed`).
"""

from __future__ import annotations

from dataclasses import dataclass

from paraxis.plan.attribution import (
    GroupMove,
    PartChange,
    group_moves,
    part_changes,
    per_gpu_change,
)
from paraxis.plan.cost import Estimate
from paraxis.plan.explain import link_speed
from paraxis.plan.hardware import Cluster
from paraxis.show.report.text import duration, rate

NOTABLE = 0.005  # a part whose change is under this share of the step before is left out


@dataclass(frozen=True)
class Side:
    """One side of the move: the hardware, the planner's price there, and what a run
    measured there (None: a what-if, no run)."""

    hardware: str  # "128 x a100-80gb (dgx-a100: 16 nodes of 8)"
    cluster: Cluster
    estimate: Estimate
    measured_tokens_per_s: float | None = None
    source: str = ""  # where the measured figure comes from

    @property
    def gpus(self) -> int:
        return self.estimate.layout.world_size


def _per_gpu(tokens_per_s: float, gpus: int) -> str:
    return f"{tokens_per_s:,.0f} tokens/s ({tokens_per_s / gpus:,.0f} per GPU)"


def measured_sentence(before: Side, after: Side) -> tuple[str, float] | None:
    if before.measured_tokens_per_s is None or after.measured_tokens_per_s is None:
        return None
    change = (after.measured_tokens_per_s / after.gpus) / (
        before.measured_tokens_per_s / before.gpus) - 1
    return (f"before {_per_gpu(before.measured_tokens_per_s, before.gpus)} on {before.gpus} "
            f"GPUs, after {_per_gpu(after.measured_tokens_per_s, after.gpus)} on {after.gpus}: "
            f"{change:+.1%} per GPU (measured: the median after the warm-up steps of "
            f"{before.source} and {after.source}).", change)


def forecast_sentence(before: Side, after: Side, measured: float | None) -> str:
    b, a = before.estimate, after.estimate
    same = b.layout == a.layout
    said = (f"{'the layout ' + str(b.layout) if same else 'before, ' + str(b.layout)} on "
            f"{before.hardware} takes {duration(b.step_time_s)} a step, "
            f"{_per_gpu(b.tokens_per_s, before.gpus)}; "
            f"{'' if same else str(a.layout) + ' '}on {after.hardware} "
            f"{duration(a.step_time_s)}, {_per_gpu(a.tokens_per_s, after.gpus)}: "
            f"{per_gpu_change(b, a):+.1%} per GPU (the planner's forecast)")
    if measured is not None and measured < 0:
        share = max(per_gpu_change(b, a) / measured, 0.0)  # a forecast rise explains none
        said += (f", {share:.0%} of the measured drop; the rest is what the model leaves out "
                 "(stragglers, data loading, congestion from other jobs)" if share < 0.8
                 else f", {share:.0%} of the measured drop")
    return said + "."


def parts_sentence(changes: list[PartChange], before: Estimate, scaled: bool) -> str:
    notable = [c for c in changes if abs(c.change_s) >= NOTABLE * before.step_time_s]
    unit = ("seconds per step, the after side's at the before side's GPUs and tokens per "
            "step" if scaled else "seconds per step")
    shown = ", ".join(f"{c.part} {c.before_s:.3g} -> {c.after_s:.3g} s ({c.change_s:+.3g})"
                      for c in notable)
    still = [c.part for c in changes if c not in notable and c.before_s > NOTABLE
             * before.step_time_s]
    tail = f"; {', '.join(still)} unchanged" if still else ""
    return (f"{shown or 'no part changes'}{tail} (the planner's forecast, {unit}; exposed "
            "time, which adds up to the step).")


def group_sentence(move: GroupMove, change: PartChange, before: Side, after: Side) -> str:
    name = move.axis.upper() if move.axis != "dp copies" else "DP copies"
    degree = (f"{move.degree_before}" if move.degree_before == move.degree_after
              else f"{move.degree_before} -> {move.degree_after}")
    new = move.after
    assert new is not None
    if move.now_crosses_nodes:
        where = (f"now spans {new.nodes} nodes of {after.cluster.gpus_per_node}, with "
                 f"{new.per_node} member(s) per node")
    else:
        where = "now runs on a slower link"
    was = ("inside one node" if move.before is not None and not move.before.crosses_nodes
           else "across nodes")
    old = (f"{was} at {link_speed(move.before, before.cluster)}" if move.before is not None
           else "nowhere (no such group before)")
    return (f"the {name}={degree} group ({move.calls}) {where}: it ran {old}; now at "
            f"{link_speed(new, after.cluster)}; its exposed time {change.before_s:.3g} -> "
            f"{change.after_s:.3g} s a step (the planner's forecast).")


ADVICE = {
    "tp": "keep TP inside a node (tp <= {per_node}, the GPUs of one node), and put pipeline "
          "or data parallelism across nodes instead",
    "cp": "keep the CP group inside a node",
    "ep": "keep the EP group inside a node, or dispatch once per node (DeepEP's "
          "expert_dispatch = \"per_node\")",
    "pp": "cross fewer nodes with stage boundaries (a lower pp), or send larger, fewer "
          "activations (a larger micro-batch)",
    "dp": "send less over the network each step: more microbatches per step (gradient "
          "accumulation) sync once for all of them, hybrid sharding keeps ZeRO's per-layer "
          "traffic inside a node, and pipeline stages across nodes leave fewer DP ranks",
    "dp copies": "fewer copies across nodes (a larger dp_shard), or more microbatches per "
                 "step",
}
PART_CAUSE = {
    "compute": "the GPUs compute slower (their peak FLOP/s or efficiency); the layout's "
               "communication is not the cause",
    "bubble": "the pipeline's bubble grew: each replica runs fewer microbatches",
    "optimizer": "the optimizer step grew: each GPU holds more of the model's states",
    "tp_grads": "the experts' gradient sum over tp grew (whole experts on sequence shards "
                "all-reduce their gradients over tp after the sync)",
    "step_calls": "the step's small calls (loss, gradient norm) pay more latency",
}


def cause(changes: list[PartChange], moves: list[GroupMove], after: Side,
          best: Estimate | None, measured: float | None = None) -> tuple[str, str]:
    """(the likely cause, what to do): the part that grew most, and its group if it moved;
    `measured`: the measured change per GPU, where two runs give one."""
    top = changes[0]
    if top.change_s <= 0 and measured is not None and measured < 0:
        return ("the planner forecasts no part of the step to grow: the drop measured is "
                "outside its model (stragglers, data loading, other jobs on the network).",
                "compare the runs' step-time spreads and data waits (metrics.jsonl: "
                "step_time_s, data_wait_s).")
    if top.change_s <= 0:
        return ("none: the planner forecasts no part of the step to grow"
                + (f", and the run after is {measured:+.1%} per GPU (measured)"
                   if measured is not None else "") + ".", "nothing to fix here.")
    by_part = {c.part: c for c in changes}
    moved = [m for m in moves if m.part == top.part and m.slower]
    step_after = sum(c.after_s for c in changes)  # the after step, on the before side's scale
    share = f"{top.change_s:+.3g} s a step, {top.change_s / step_after:.0%} of the step after"
    if moved:
        move = moved[0]
        new = move.after
        assert new is not None
        name = f"{move.axis.upper() if move.axis != 'dp copies' else 'DP copies'}"
        if move.now_crosses_nodes:
            reason = (f"the {name}={move.degree_after} group now spans {new.nodes} nodes, so "
                      f"the network carries {move.calls} ({share})")
        else:
            old = move.before.cost("all_reduce")[0] if move.before else 0.0
            reason = (f"the {name}={move.degree_after} group now runs on a slower link (a "
                      f"ring reaches {rate(new.cost('all_reduce')[0])} where it reached "
                      f"{rate(old)}), which carries {move.calls} ({share})")
        others = [(m, by_part[m.part]) for m in moves if m.slower and m.part != top.part
                  and by_part[m.part].change_s >= NOTABLE * step_after]
        reason += "".join(f"; with it the {m.axis.upper()}={m.degree_after} group "
                          f"({c.change_s:+.3g} s)" for m, c in others) + "."
        fix = ADVICE[move.axis].format(per_node=after.cluster.gpus_per_node)
    else:
        reason = (PART_CAUSE.get(top.part, f"the {top.part} part of the step grew")
                  + f" ({share}).")
        fix = "price the layouts for the new cluster again"
    if best is not None:
        gain = best.tokens_per_s / after.estimate.tokens_per_s - 1
        fix += (f"; the planner's best layout for {after.hardware}, {best.layout}, forecasts "
                f"{best.tokens_per_s:,.0f} tokens/s ({gain:+.0%} over this layout there; "
                "`paraxis plan` defends it)")
    return reason, fix + "."


def diagnose_slowdown(before: Side, after: Side, best: Estimate | None
                      ) -> list[tuple[str, str]]:
    """(label, sentence) pairs, the likely cause and what to do last; `best`: the planner's
    pick for the after side's hardware, the fix it offers."""
    b, a = before.estimate, after.estimate
    lines = []
    measured = measured_sentence(before, after)
    if measured is not None:
        lines.append(("Measured", measured[0]))
    lines.append(("Forecast", forecast_sentence(before, after,
                                                measured[1] if measured else None)))
    changes = part_changes(b, a)
    scaled = b.layout.world_size != a.layout.world_size or abs(
        b.tokens_per_s * b.step_time_s - a.tokens_per_s * a.step_time_s) > 0.5
    lines.append(("Where the time went", parts_sentence(changes, b, scaled)))
    moves = group_moves(b.layout, before.cluster, a.layout, after.cluster)
    by_part = {c.part: c for c in changes}
    for move in sorted((m for m in moves if m.slower),
                       key=lambda m: -by_part[m.part].change_s):
        lines.append(("Collectives", group_sentence(move, by_part[move.part], before, after)))
    if not any(m.slower for m in moves):
        lines.append(("Collectives", "no group crosses more nodes or a slower link than "
                                     "before (the planner's links)."))
    reason, fix = cause(changes, moves, after, best, measured[1] if measured else None)
    lines += [("Likely cause", reason), ("What to do", fix)]
    return lines
