"""A simulated pipeline timeline as text, for the terminal (`paraxis schedule`).

The matplotlib drawing of the same timeline is `paraxis.show.viz.timeline`; this one needs no
matplotlib: one row per stage, one cell per time slot.
"""

from __future__ import annotations

from paraxis.spec.schedules import COMPUTE, Action, Timeline

# Cells a row holds at most: costs of very different sizes would otherwise ask for millions.
MAX_SLOTS = 400


def render_timeline(timeline: Timeline, slot: float | None = None) -> str:
    """One row per stage, one cell per time slot: F3 = forward of microbatch 3, B3 its
    backward, a/b/.. the chunk when there are several, '.' idle. `slot` defaults to the
    shortest compute, so every compute fills whole cells; or to a `MAX_SLOTS`th of the step
    where that would be wider, every compute then at least one cell."""
    compute = [e for stage in timeline.events for e in stage if e.action.kind in COMPUTE]
    if not compute:
        return ""
    slot = slot or max(min(e.end - e.start for e in compute), timeline.makespan / MAX_SLOTS)
    chunks = max(e.action.chunk for e in compute) + 1
    width = max(len(_label(e.action, chunks)) for e in compute) + 1
    slots = max(1, round(timeline.makespan / slot))
    rows = []
    for index, stage in enumerate(timeline.events):
        cells = [".".ljust(width)] * slots
        for event in stage:
            if event.action.kind not in COMPUTE:
                continue
            start = min(round(event.start / slot), slots - 1)
            for t in range(start, max(start + 1, min(round(event.end / slot), slots))):
                cells[t] = _label(event.action, chunks).ljust(width)
        rows.append(f"stage {index} | " + "".join(cells).rstrip())
    return "\n".join(rows)


def _label(action: Action, chunks: int) -> str:
    suffix = chr(ord("a") + action.chunk) if chunks > 1 else ""
    return f"{action.kind}{action.microbatch}{suffix}"
