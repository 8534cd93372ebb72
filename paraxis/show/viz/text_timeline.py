"""A simulated pipeline timeline as text, for the terminal (`paraxis schedule`).

The matplotlib drawing of the same timeline is `paraxis.show.viz.timeline`; this one needs no
matplotlib: one row per stage, one cell per time slot.
"""

from __future__ import annotations

import math
from fractions import Fraction

from paraxis.spec.schedules import COMPUTE, Action, Timeline

# Cells a row holds at most: costs of very different sizes would otherwise ask for millions.
MAX_SLOTS = 400
# Cells the shortest action may take for the others to be drawn at their exact cost; costs
# without a common divisor that large (a model's stage times) get a cell of the shortest.
CELLS_PER_ACTION = 4


def render_timeline(timeline: Timeline, slot: float | None = None) -> str:
    """One row per stage, one cell per time slot: F3 = forward of microbatch 3, B3 its
    backward, a/b/.. the chunk when there are several, '.' idle. `slot` defaults to the
    longest time that every compute's start and end are whole multiples of, so each action
    fills cells in proportion to its cost; where that would cut the shortest action into more
    than `CELLS_PER_ACTION` cells, to the shortest action's time, and where the step would take
    more than `MAX_SLOTS` cells, to a `MAX_SLOTS`th of it. Those two round; a last line counts
    the actions another one hid."""
    compute = [e for stage in timeline.events for e in stage if e.action.kind in COMPUTE]
    if not compute:
        return ""
    if slot is None:
        shortest = min(e.end - e.start for e in compute)
        common = common_divisor([t for e in compute for t in (e.start, e.end)]) or 0.0
        exact = shortest / CELLS_PER_ACTION <= common <= shortest  # (read to a thousandth)
        slot = max(common if exact else shortest, timeline.makespan / MAX_SLOTS)
    chunks = max(e.action.chunk for e in compute) + 1
    width = max(len(_label(e.action, chunks)) for e in compute) + 1
    slots = max(1, round(timeline.makespan / slot))
    rows, hidden = [], 0
    for index, stage in enumerate(timeline.events):
        cells: list[str | None] = [None] * slots
        drawn = [e for e in stage if e.action.kind in COMPUTE]
        # the longest first: where a cell is longer than an action, the action stays in view
        for event in sorted(drawn, key=lambda e: e.start - e.end):
            start = min(round(event.start / slot), slots - 1)
            end = max(start + 1, min(round(event.end / slot), slots))
            cells[start:end] = [_label(event.action, chunks)] * (end - start)
        hidden += len({_label(e.action, chunks) for e in drawn} - set(cells))
        rows.append(f"stage {index} | " + "".join((c or ".").ljust(width) for c in cells).rstrip())
    if hidden:
        rows.append(f"({hidden} action(s) shorter than a cell of {slot:.3g} hidden by another; "
                    "--json lists every one)")
    return "\n".join(rows)


def common_divisor(times: list[float]) -> float | None:
    """The longest duration that every time is a whole multiple of, each time read to a
    thousandth of its unit (None when all are zero)."""
    exact = [Fraction(t).limit_denominator(1000) for t in times]
    scale = math.lcm(*(f.denominator for f in exact))
    step = math.gcd(*(int(f * scale) for f in exact))
    return step / scale if step else None


def _label(action: Action, chunks: int) -> str:
    suffix = chr(ord("a") + action.chunk) if chunks > 1 else ""
    return f"{action.kind}{action.microbatch}{suffix}"
