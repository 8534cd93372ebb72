"""A simulated pipeline timeline as text, for the terminal (`paraxis schedule`).

The matplotlib drawing of the same timeline is `paraxis.show.viz.timeline`; this one needs no
matplotlib: one row per stage, one cell per time slot.
"""

from __future__ import annotations

from paraxis.spec.schedules import COMPUTE, Action, Timeline


def render_timeline(timeline: Timeline, slot: float | None = None) -> str:
    """One row per stage, one cell per time slot: F3 = forward of microbatch 3, B3 its
    backward, a/b/.. the chunk when there are several, '.' idle. `slot` defaults to the
    shortest compute, so every compute fills whole cells."""
    compute = [e for stage in timeline.events for e in stage if e.action.kind in COMPUTE]
    if not compute:
        return ""
    slot = slot or min(e.end - e.start for e in compute)
    chunks = max(e.action.chunk for e in compute) + 1
    width = max(len(_label(e.action, chunks)) for e in compute) + 1
    slots = round(timeline.makespan / slot)
    rows = []
    for index, stage in enumerate(timeline.events):
        cells = [".".ljust(width)] * slots
        for event in stage:
            if event.action.kind not in COMPUTE:
                continue
            for t in range(round(event.start / slot), round(event.end / slot)):
                cells[t] = _label(event.action, chunks).ljust(width)
        rows.append(f"stage {index} | " + "".join(cells).rstrip())
    return "\n".join(rows)


def _label(action: Action, chunks: int) -> str:
    suffix = chr(ord("a") + action.chunk) if chunks > 1 else ""
    return f"{action.kind}{action.microbatch}{suffix}"
