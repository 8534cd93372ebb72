"""A training run next to its prediction: loss, throughput and peak memory per step.

Measured figures come from the run's metrics.jsonl (`paraxis train --metrics-file`);
predicted ones from the planner's `Estimate`.
"""

from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from paraxis.show.viz.memory import unit_for
from paraxis.show.viz.style import OKABE_ITO, new_figure


def plot_run(records: list[dict], predicted_tokens_per_s: float | None,
             predicted_label: str, predicted_memory_bytes: float | None = None,
             device: str = "GPU") -> Figure:
    """Loss, throughput and peak memory per step; the forecast as dashed lines. `device`
    names what a rank runs on ("GPU", or "rank" for CPU ranks)."""
    fig, axes = new_figure(12, 3.8, ncols=3)
    steps = [r["step"] for r in records]
    loss_ax, speed_ax, mem_ax = axes
    loss_ax.plot(steps, [r["loss"] for r in records], color=OKABE_ITO["blue"], label="loss")
    loss_ax.set_xlabel("step")
    loss_ax.set_ylabel("cross-entropy loss (nats/token)")
    loss_ax.set_title("Training loss")

    speed_ax.plot(steps, [r["tokens_per_s"] for r in records], color=OKABE_ITO["green"],
                  label="measured throughput")
    if predicted_tokens_per_s:
        speed_ax.axhline(predicted_tokens_per_s, color=OKABE_ITO["vermillion"], linestyle="--",
                         label=f"predicted ({predicted_label})")
        measured = [r["tokens_per_s"] for r in records]
        if max(measured + [predicted_tokens_per_s]) > 10 * min(measured):
            speed_ax.set_yscale("log")  # a forecast for other hardware: orders apart
    speed_ax.set_xlabel("step")
    speed_ax.set_ylabel("throughput (tokens/s)")
    speed_ax.set_title("Throughput, measured vs predicted")

    peak = [r.get("peak_mem_bytes", 0) for r in records]
    top = max(peak + [predicted_memory_bytes or 0])
    unit, scale = unit_for(top)
    mem_ax.plot(steps, [p / scale for p in peak], color=OKABE_ITO["purple"],
                label="measured peak (rank 0)")
    if predicted_memory_bytes:
        mem_ax.axhline(predicted_memory_bytes / scale, color=OKABE_ITO["vermillion"],
                       linestyle="--", label=f"predicted ({predicted_label})")
    mem_ax.set_ylim(0, top / scale * 1.15 if top else 1)
    mem_ax.set_xlabel("step")
    mem_ax.set_ylabel(f"peak memory ({unit})")
    mem_ax.set_title(f"Peak memory per {device}")
    # One legend under the panels: inside them it would hide the measured lines. The
    # forecast lines share one style, so one entry names both.
    handles, labels = [], []
    for ax in (speed_ax, mem_ax):
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if label not in labels:
                handles.append(handle)
                labels.append(label)
    fig.legend(handles, labels, loc="outside lower center", ncols=len(handles), fontsize=8)
    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
        ax.grid(color="#dddddd", linewidth=0.6)
        ax.set_axisbelow(True)
    fig.suptitle(f"The run: {len(records)} steps", x=0.01, ha="left")
    return fig
