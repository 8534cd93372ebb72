"""The report's words: readable units, the plan and the planner's defence of it."""

from __future__ import annotations

from paraxis.plan.attribution import priced_link, sync_group_words
from paraxis.plan.cost import STEP_PARTS
from paraxis.plan.ranking import EQUAL_TIMES
from paraxis.show.report.plan import Plan
from paraxis.show.viz.html import esc, table
from paraxis.spec.layout import Layout


def size(value: float) -> str:
    """Bytes as MB below 1 GB, else GB (decimal, as datasheets count)."""
    return f"{value / 1e9:.3g} GB" if value >= 1e9 else f"{value / 1e6:.3g} MB"


def duration(value: float) -> str:
    """Seconds in the unit that keeps 1-4 digits before the point."""
    if value >= 1:
        return f"{value:.4g} s"
    if value >= 1e-3 or value == 0:
        return f"{value * 1e3:.4g} ms"
    return f"{value * 1e6:.4g} µs"


def rate(bytes_per_s: float) -> str:
    """A bandwidth in GB/s from 1 GB/s up, else MB/s."""
    if bytes_per_s >= 1e9:
        return f"{bytes_per_s / 1e9:.3g} GB/s"
    return f"{bytes_per_s / 1e6:.3g} MB/s"


def times(ratio: float, more: str = "faster", less: str = "slower") -> str:
    """A ratio as a reader says it: "1.8x faster", "2.5x slower", "1.01x slower", "as fast"
    (three digits below 2x, so a ratio near one does not read "1x slower")."""
    if abs(ratio - 1) < 0.005:
        return "as fast"
    factor, word = (ratio, more) if ratio > 1 else (1 / ratio, less)
    return f"{factor:.3g}x {word}" if factor < 2 else f"{factor:.2g}x {word}"


def layout_text(layout: Layout) -> str:
    """Layout text that a table cell can wrap after each comma."""
    return str(layout).replace(",", ", ")


def plan_section(plan: Plan) -> str:
    e, cfg, cluster, hw = plan.estimate, plan.cfg, plan.cluster, plan.hardware
    memory = plan.memory
    device = hw.device
    inputs = table(["input", "value"], [
        ("model", f"{cfg.name} ({cfg.style}, {cfg.num_params() / 1e6:,.1f} M parameters, "
                  f"{cfg.n_layers} layers, d_model {cfg.d_model})"),
        ("hardware", f"{hw.ranks(cluster.world_size)}, {size(cluster.gpu.memory_bytes)} per "
                     f"{device}" + ("" if hw.cpu else f" ({cluster.nodes} node(s) of "
                                                      f"{cluster.gpus_per_node})")),
        ("prices from", hw.source),
        ("batch", f"{plan.inputs.global_batch} sequences of {plan.seq_len} tokens per step, "
                  f"{plan.inputs.precision} precision"),
    ])
    rows = [(k, size(v)) for k, v in memory.items() if k not in ("stage", "total")]
    memory_table = table(["component", f"per {device} (busiest stage)"], rows + [
        ("total", f"{size(memory['total'])} of {size(e.memory_limit_bytes)}")])
    time = table(["part of the step (time not hidden behind compute)", "time", "share"],
                 [(k.replace("_", " "), duration(e.time[k]), f"{e.time[k] / e.step_time_s:.0%}")
                  for k in STEP_PARTS if e.time[k] > 0]
                 + [("step", duration(e.step_time_s), "100%")])
    who = {"planner": "chosen by the planner (the fastest layout that fits, where layouts "
                      f"within {EQUAL_TIMES:.1%} of each other count as equal and the simpler "
                      "goes first)",
           "auto": "chosen by the planner when the run started (--layout auto)",
           "user": "given by the user"}[plan.chosen_by]
    fits = '<span class="good">fits</span>' if e.fits else '<span class="bad">does not fit</span>'
    return (f"{inputs}<p class=\"callout\">Layout <code>{esc(plan.layout)}</code>, {esc(who)}"
            f": {fits} in memory; predicted {e.tokens_per_s:,.0f} tokens/s, step "
            f"{duration(e.step_time_s)}, MFU {e.mfu:.1%} (micro-batch {e.micro_batch} "
            f"sequences).</p><h3>Memory per {device}</h3>{memory_table}"
            f"<h3>Step time</h3>{time}")


def defence_section(plan: Plan) -> str:
    result, e = plan.search, plan.estimate
    if result is None:
        return "<p>The planner's search found no layout that satisfies the rules.</p>"
    parts = [f"<p>The planner priced {result.considered} layouts for "
             f"{plan.hardware.ranks(plan.cluster.world_size)}: {len(result.ranked)} fit, "
             f"{len(result.too_big)} do not fit in memory, "
             f"{len(result.rule_breakers)} break a rule; {result.skipped} more were skipped "
             "unpriced, their floor (pipeline, optimizer step and small calls) slower than "
             "every layout shown.</p>"]
    rows = [(i + 1, layout_text(c.layout), duration(c.step_time_s), f"{c.tokens_per_s:,.0f}",
             f"{c.mfu:.1%}", size(plan.device_memory(c)["total"]))
            for i, c in enumerate(result.top(6))]
    parts.append("<h3>Fastest layouts that fit</h3>" + table(
        ["rank", "layout", "step", "tokens/s", "MFU", f"memory/{plan.hardware.device}"],
        rows) + f"<p>Ranked fastest first, where steps within {EQUAL_TIMES:.1%} of each other "
        "count as equal and the simpler layout (fewer model-parallel ranks, lower ZeRO stage, "
        "less recomputation) goes first: the model cannot tell such layouts apart.</p>")
    if plan.chosen_by in ("user", "auto") and result.ranked:
        best = result.ranked[0]
        ratio = e.step_time_s / best.step_time_s
        how = ("was given by hand" if plan.chosen_by == "user" else
               "was --layout auto's pick on the profile timed before the run; priced again on "
               "the means of its timings before and after the run")
        parts.append(f"<p>The layout shown {how}; the planner's best, "
                     f"<code>{esc(best.layout)}</code>, is predicted {times(ratio)} than "
                     "it.</p>" if ratio > 1.005 else
                     f"<p>The layout shown {how}; it is as fast as the planner's best.</p>")
    # fastest first; faster by more than the ranking's equal-times margin, as it ranks
    faster = [r for r in result.too_big
              if r.estimate is not None
              and r.estimate.step_time_s < e.step_time_s * (1 - EQUAL_TIMES)]
    if faster:
        parts.append("<h3>Faster, but too big</h3>" + table(
            ["layout", "would take", "why not"],
            [(layout_text(r.layout), duration(r.estimate.step_time_s), r.reason)
             for r in faster[:4] if r.estimate is not None]))
    elif result.too_big:
        parts.append(f"<p>No layout predicted faster than this one (by more than "
                     f"{EQUAL_TIMES:.1%}) was left out for memory: the {len(result.too_big)} "
                     "that do not fit would all be slower.</p>")
    reasons: dict[str, str] = {}
    for r in result.rule_breakers:
        reasons.setdefault(r.reason, str(r.layout))
    if reasons:
        parts.append("<h3>Ruled out</h3>" + table(
            ["example layout", "rule"],
            [(lay.replace(",", ", "), why) for why, lay in list(reasons.items())[:5]]))
    links = []
    for axis in ("tp", "cp", "ep", "pp", "dp"):
        link = priced_link(plan.layout, axis, plan.cluster)
        if link is not None:
            where = "crosses nodes (network)" if link.crosses_nodes else "stays in a node"
            sync = sync_group_words(plan.layout) if axis == "dp" else ""
            links.append(f"{axis} group of {getattr(plan.layout, axis)}{sync} {where}, "
                         f"{rate(link.bandwidth_Bps)}")
    if links or e.notes:
        parts.append("<h3>Why this shape</h3><ul>" + "".join(
            f"<li>{esc(x)}</li>" for x in links + e.notes) + "</ul>")
    return "".join(parts)
