"""The rivals a defence names: the nearest layouts, the best of each family, and the ties.

A pick is only defended against real alternatives: the next layouts of other shapes, and
the best layout that fits in each family a reader would propose instead (ZeRO-3, TP = the
node size, no pipeline, no TP), never a straw man that cannot fit. Where rivals lie within
the validated error band (`uncertainty.py`) the defence says it is a tie, and what would
decide it.
"""

from __future__ import annotations

from collections.abc import Callable

from paraxis.plan.cost import Estimate
from paraxis.plan.hardware import Cluster
from paraxis.plan.prune import families, rival_shape
from paraxis.plan.ranking import EQUAL_TIMES, group_numbers, simpler_by
from paraxis.plan.search import SearchResult
from paraxis.plan.uncertainty import (
    GPU_BAND,
    HELD_OUT_GPU_BAND,
    ErrorBand,
    decider,
    step_range,
    ties,
)
from paraxis.spec.units import seconds

Price = Callable[[Estimate, Cluster], float]


def _shape(estimate: Estimate) -> tuple[int, ...]:
    return rival_shape(estimate.layout)


def _versus(rival: Estimate, best: Estimate, band: ErrorBand) -> str:
    slower = rival.step_time_s / best.step_time_s - 1
    verdict = "within" if slower <= band.rms else "outside"
    shown = f"{slower:+.2%}" if abs(slower) < 0.01 else f"{slower:+.1%}"  # 0.48% is not 0.5%
    return f"{shown} ({verdict} the ±{band.rms:.1%} band)"


def _overhead(estimate: Estimate) -> str:
    worst = max(("tp", "cp", "ep", "pp", "dp", "bubble"), key=lambda k: estimate.time[k])
    return (f"its largest overhead is {worst} "
            f"{seconds(estimate.time[worst], estimate.step_time_s)} s")


def prediction_lines(best: Estimate, result: SearchResult | None, band: ErrorBand,
                     cluster: Cluster, price: Price) -> list[str]:
    """The step time with its validated range; then the tie, if any, and its decider."""
    low, high = step_range(best, band)
    lines = [f"Prediction: {best.step_time_s:.3g} s per step, {low:.3g}-{high:.3g} s at the "
             f"{band.name} ±{band.rms:.1%} ({band.over}, {band.source}; largest "
             f"{band.largest:.0%})."]
    if band.held_out:  # a GPU: the held-out error of all GPUs, and the fit's own
        held = HELD_OUT_GPU_BAND
        lines.append(f"Held out: on {held.runs} published runs never fitted the RMS error is "
                     f"{held.rms:.0%} (largest {held.largest:.0%}, {held.source}); on the "
                     f"{GPU_BAND.runs} runs it was fitted on, {GPU_BAND.rms:.1%}.")
    if result is None:
        return lines
    tied = ties(best, result.ranked, band)
    others = [e for e in tied if _shape(e) != _shape(best)]
    variants = len(tied) - len(others)
    same = (f"; {variants} variant{'s' if variants > 1 else ''} of its own shape (microbatch "
            f"size, schedule, recompute) {'are' if variants > 1 else 'is'} too") if variants else ""
    if not others:
        following = next((e for e in result.ranked if _shape(e) != _shape(best)), None)
        if following is not None:
            lines.append(f"No tie between shapes: the nearest other (dp, cp, ep, tp, pp, zero) is "
                         f"{following.layout}, {_versus(following, best, band)}{same}.")
        return lines
    shapes = {_shape(e) for e in others}
    text = ", ".join(f"{e.layout} {e.step_time_s / best.step_time_s - 1:+.1%}"
                     for e in others[:2])
    lines.append(f"Tie: {len(shapes)} other (dp, cp, ep, tp, pp, zero) shapes are predicted within "
                 f"±{band.rms:.1%} of it ({text}){same}; the model cannot rank them.")
    lines.append(_decider_line(best, others[:3], cluster, price))
    return lines


def _decider_line(best: Estimate, rivals: list[Estimate], cluster: Cluster,
                  price: Price) -> str:
    """The first tied rival a single parameter reorders with the best, and by how much."""
    for rival in rivals:
        found = decider(best, rival, cluster, price)
        if found is not None:
            meaning, factor = found
            change = f"{1 - factor:.1%} lower" if factor < 1 else f"{factor - 1:.1%} higher"
            return (f"What would decide: the order of it and {rival.layout} flips if the "
                    f"{meaning} were {change} than the preset's (x{factor:.2f}); measure it "
                    "(paraxis calibrate) to break the tie.")
    return (f"No single hardware parameter within x2/3-x3/2 of the preset reorders it and "
            f"{rivals[0].layout}: they differ by structure (bubble, memory), not by a rate.")


def nearest_rivals(best: Estimate, result: SearchResult, band: ErrorBand,
                   count: int) -> list[str]:
    lines, seen = [], {_shape(best)}
    group = group_numbers(result.ranked)
    fastest = min((e.step_time_s for e in result.ranked), default=best.step_time_s)
    for rival in result.ranked:
        if _shape(rival) in seen:
            continue
        seen.add(_shape(rival))
        # a rival in the pick's group of equal times lost on simplicity, not on time
        tied = id(best) in group and group.get(id(rival)) == group[id(best)]
        simpler = simpler_by(best, rival) if tied else ""
        why = (f"ranked as fast (within {EQUAL_TIMES:.1%}), where the simpler layout goes "
               f"first ({simpler})" if simpler else _overhead(rival))
        if not tied and rival.step_time_s <= best.step_time_s * (1 + EQUAL_TIMES):
            # within 0.5% of the pick, yet outside its group (`ranking.equal_groups`), which
            # starts at the fastest
            why += (f" (within {EQUAL_TIMES:.1%} of this layout but not of the fastest "
                    f"priced, {seconds(fastest, best.step_time_s)} s, where the ranking's "
                    "group of equal times starts)")
        lines.append(f"Rejected {rival.layout}: {_versus(rival, best, band)}, "
                     f"{seconds(rival.step_time_s, best.step_time_s)} s vs "
                     f"{seconds(best.step_time_s, best.step_time_s)} s; {why}.")
        if len(seen) > count:
            break
    return lines


def family_rivals(best: Estimate, result: SearchResult, band: ErrorBand, node: int,
                  said: list[str]) -> list[str]:
    """The best fitting layout of each family `best` is not in (one line per layout, naming
    every family it leads); where none fits, the family's layout closest to fitting."""
    lines: list[str] = []
    leaders: dict[int, tuple[Estimate, list[str]]] = {}
    for name, member in families(node):
        if member(best.layout):
            continue
        rival = next((e for e in result.ranked if member(e.layout)), None)
        if rival is not None:
            leaders.setdefault(id(rival), (rival, []))[1].append(name)
            continue
        misses = [r for r in result.too_big if r.estimate is not None and member(r.layout)]
        if misses:
            closest = min(misses, key=lambda r: r.estimate.memory["total"])  # type: ignore[union-attr]
            lines.append(f"No layout {name} fits: the closest, {closest.layout}, "
                         f"{closest.reason}.")
    for rival, names in leaders.values():
        if f"with TP = {node}" in names:
            lines.append(_node_sized_tp(best, rival, band, node, names))
        elif not any(str(rival.layout) in line for line in said):
            lines.append(f"Best layout {' and '.join(names)}: {rival.layout}, "
                         f"{_versus(rival, best, band)}; {_overhead(rival)}.")
    return lines


def _node_sized_tp(best: Estimate, rival: Estimate, band: ErrorBand, node: int,
                   names: list[str]) -> str:
    """The rule of thumb (TP = GPUs per node; Narayanan et al. 2021 Takeaway #1), priced."""
    also = [name for name in names if name != f"with TP = {node}"]
    text = (f"Rejected TP={node} (the whole node, the usual rule) at best {rival.layout}"
            f"{' (also the best ' + ' and '.join(also) + ')' if also else ''}: "
            f"{_versus(rival, best, band)}; its TP collectives put "
            f"{seconds(rival.time['tp'], best.step_time_s)} s on the critical path vs "
            f"{seconds(best.time['tp'], best.step_time_s)} s")
    if best.layout.tp < node:
        text += (f", because each GPU does 1/{node} of a microbatch but still moves (t-1)/t "
                 "of its activations")
    return text + "."
