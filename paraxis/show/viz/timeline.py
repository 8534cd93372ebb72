"""Pipeline timelines: one lane per pipeline stage, a bar per forward/backward/message.

Simulated timelines (from `paraxis.spec.schedules.simulate`) and measured ones (the runtime's
trace) are drawn from the same event dicts (see `paraxis.files.trace`), so predicted and
measured sit side by side in the same form.
"""

from __future__ import annotations

from dataclasses import dataclass

from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.patheffects import withStroke

from paraxis.files.trace import COMPUTE_KINDS, check_events, event_label
from paraxis.show.viz.style import KIND_COLOUR, KIND_HATCH, KIND_LABEL, new_figure


@dataclass(frozen=True)
class TimelinePanel:
    title: str
    events: list[dict]  # paraxis trace events (rank, stage, kind, microbatch, chunk, s)
    bubble_fraction: float | None = None  # shown in the title when given


def plot_timelines(panels: list[TimelinePanel], title: str, share_time: bool = True,
                   time_unit: str = "ms") -> Figure:
    """Panels stacked top to bottom; `share_time` puts them on one time axis so the shorter
    schedule is visibly shorter. `time_unit`: s, ms, us, or "forward units" when the events
    are in multiples of one forward pass rather than seconds."""
    if time_unit == "auto":  # seconds once a step runs past 10 s, else milliseconds
        longest = max((e["end_s"] - e["start_s"] for p in panels for e in p.events), default=0)
        ends = [max((e["end_s"] for e in p.events), default=0) -
                min((e["start_s"] for e in p.events), default=0) for p in panels]
        time_unit = "s" if max(ends + [longest]) > 10 else "ms"
    scale = {"s": 1.0, "ms": 1e3, "us": 1e6}.get(time_unit, 1.0)
    height = sum(0.55 * max(len({e["stage"] for e in p.events}), 1) + 0.9 for p in panels)
    fig, axes = new_figure(11, max(2.5, height + 0.6), nrows=len(panels), sharex=share_time,
                           squeeze=False)
    kinds_seen: set[str] = set()
    spans = [_span(check_events(p.events)) * scale or 1.0 for p in panels]
    for ax, panel, span in zip(axes[:, 0], panels, spans, strict=True):
        events = check_events(panel.events)
        origin = min((e["start_s"] for e in events), default=0.0)
        # Panels on one time axis are drawn at the scale of the longest: label by that.
        span = max(spans) if share_time else span
        stages = sorted({e["stage"] for e in events})
        for e in events:
            kinds_seen.add(e["kind"])
            lane = stages.index(e["stage"])
            start = (e["start_s"] - origin) * scale
            width = (e["end_s"] - e["start_s"]) * scale
            compute = e["kind"] in COMPUTE_KINDS
            # Compute fills the lane; messages are a thin strip under it, so a send that
            # overlaps compute does not hide it.
            bottom, bar_height = (lane - 0.4, 0.62) if compute else (lane + 0.26, 0.14)
            # Odd model chunks (interleaved schedules) are paler, so chunk 0 and 1 separate.
            ax.broken_barh([(start, width)], (bottom, bar_height),
                           facecolors=KIND_COLOUR[e["kind"]], hatch=KIND_HATCH[e["kind"]],
                           edgecolor="white", linewidth=0.6,
                           alpha=0.6 if e.get("chunk", 0) % 2 else 1.0)
            label = event_label(e)
            # Only label bars wide enough for the text (about 0.8% of the axis per char).
            if compute and width >= span * 0.008 * (len(label) + 1):
                # A stroke in the bar's colour clears the hatch behind the label.
                ax.text(start + width / 2, lane - 0.09, label, ha="center",
                        va="center", fontsize=7, color="white", clip_on=True,
                        path_effects=[withStroke(linewidth=2.5,
                                                 foreground=KIND_COLOUR[e["kind"]])])
        ax.set_yticks(range(len(stages)), [f"stage {s}" for s in stages])
        ax.set_ylim(len(stages) - 0.5 if stages else 0.5, -0.6)
        ax.set_ylabel("pipeline stage")
        bubble = "" if panel.bubble_fraction is None \
            else f"bubble {panel.bubble_fraction:.0%} · "
        ax.set_title(f"{bubble}{panel.title}", loc="left")
        ax.grid(axis="x", color="#dddddd", linewidth=0.6)
        ax.set_axisbelow(True)
        ax.tick_params(axis="x", labelbottom=True)
        ax.set_xlabel(f"time ({time_unit})")
    order = [k for k in ("F", "B", "W", "send", "recv") if k in kinds_seen]
    handles = [Patch(facecolor=KIND_COLOUR[k], hatch=KIND_HATCH[k], edgecolor="white",
                     label=KIND_LABEL[k]) for k in order if k != "recv" or "send" not in order]
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles),
               title="label: kind + microbatch (.chunk, paler = chunk 1); white gap = idle",
               title_fontsize=8)
    fig.suptitle(title, x=0.01, ha="left")
    return fig


def _span(events: list[dict]) -> float:
    """Seconds from the first start to the last end."""
    if not events:
        return 0.0
    return max(e["end_s"] for e in events) - min(e["start_s"] for e in events)
