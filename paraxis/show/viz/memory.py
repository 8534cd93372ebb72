"""Memory charts: per-GPU bytes by component, against the GPU's capacity.

The numbers come from the planner (`paraxis.plan.memory`), the one place the ZeRO rules
live; this module only draws them.
"""

from __future__ import annotations

import textwrap

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from paraxis.plan.memory import stage_states
from paraxis.show.viz.style import OKABE_ITO, new_figure
from paraxis.spec.precision import MIXED_ADAM, Precision

COMPONENT_COLOUR = {"params": OKABE_ITO["blue"], "grads": OKABE_ITO["orange"],
                    "optimizer": OKABE_ITO["green"], "activations": OKABE_ITO["purple"],
                    "buffers": OKABE_ITO["sky"], "reserved": OKABE_ITO["grey"]}
COMPONENT_HATCH = {"params": "", "grads": "//", "optimizer": "\\\\", "activations": "..",
                   "buffers": "xx", "reserved": "--"}
COMPONENT_LABEL = {"params": "parameters", "grads": "gradients",
                   "optimizer": "optimizer states (fp32 copy, Adam m and v)",
                   "activations": "activations", "buffers": "comm / gather buffers",
                   "reserved": "CUDA context + fragmentation"}


def component_label(component: str, device: str = "GPU") -> str:
    """The legend's name for a memory component; a CPU rank reserves no CUDA context but
    its process baseline (interpreter, PyTorch, gloo: what a calibration measures)."""
    if component == "reserved" and device != "GPU":
        return "process baseline (interpreter, PyTorch, gloo)"
    return COMPONENT_LABEL[component]


def unit_for(max_bytes: float) -> tuple[str, float]:
    """GB from 1 GB up, else MB (decimal units, as GPU datasheets use): the units a reader
    compares with a device's capacity; a small model's states read as 0.25 MB, not 250 kB."""
    return ("GB", 1e9) if max_bytes >= 1e9 else ("MB", 1e6)


def _stacked_bars(ax: Axes, labels: list[str], rows: list[dict[str, float]],
                  components: list[str], capacity_bytes: float | None,
                  capacity_label: str, device: str = "GPU") -> None:
    totals = [sum(r[c] for c in components) for r in rows]
    peak = max(totals + [0.0])
    unit, scale = unit_for(peak)
    bottoms = [0.0] * len(rows)
    for component in components:
        heights = [r[component] / scale for r in rows]
        ax.bar(labels, heights, bottom=bottoms, color=COMPONENT_COLOUR[component],
               hatch=COMPONENT_HATCH[component], edgecolor="white", linewidth=0.8,
               label=component_label(component, device))
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    for x, total in enumerate(totals):
        ax.text(x, total / scale, f"{total / scale:.3g} {unit}", ha="center", va="bottom",
                fontsize=9, fontweight="bold")
    ax.set_ylabel(f"memory per {device} ({unit})")
    top = peak / scale * 1.18 if peak else 1.0
    if capacity_bytes is not None:
        cap = capacity_bytes / scale
        # A capacity far above the bars would squash them flat: say it in words instead.
        if cap <= 4 * peak / scale:
            ax.axhline(cap, color=OKABE_ITO["vermillion"], linestyle="--", linewidth=2,
                       label=capacity_label)
            top = max(top, cap * 1.1)
        else:  # said in words, above the bars (the legend sits outside the axes)
            cap_unit, cap_scale = unit_for(capacity_bytes)
            ax.text(0.99, 0.98, f"{capacity_label}: {capacity_bytes / cap_scale:.3g} "
                    f"{cap_unit}, far above every bar", transform=ax.transAxes, ha="right",
                    va="top", fontsize=8, color=OKABE_ITO["vermillion"])
            top = peak / scale * 1.3 if peak else 1.0
    ax.set_ylim(0, top)
    ax.grid(axis="y", color="#dddddd", linewidth=0.6)
    ax.set_axisbelow(True)


def _capacity_label(name: str, device: str) -> str:
    """ "a100-80gb capacity" for a GPU; a CPU rank's share of RAM is named as it is."""
    return f"{name} capacity" if device == "GPU" else name


def zero_rows(num_params: int, ranks: int, precision: Precision = MIXED_ADAM,
              expert_params: int = 0, ep: int = 1) -> list[dict[str, float]]:
    """Model states per rank under ZeRO 0-3 (`memory.stage_states`): `num_params` replicated
    over `ranks`, `expert_params` of routed experts over ranks / ep."""
    return [dict(stage_states(num_params, expert_params, ranks, ep, zero, precision))
            for zero in range(4)]


def plot_zero_memory(num_params: int, ranks: int, capacity_bytes: float | None = None,
                     gpu_name: str = "GPU", precision: Precision = MIXED_ADAM,
                     model_name: str = "model", device: str = "GPU", expert_params: int = 0,
                     ep: int = 1) -> Figure:
    """Model-state bytes per GPU under ZeRO 0-3 (`zero_rows`) for `num_params` parameters
    sharded over `ranks` (a layout's `zero_ranks`) and `expert_params` of routed experts over
    ranks / ep, with the GPU's capacity line. `device` names what one rank runs on in the
    labels: "GPU", or "rank" for CPU ranks sharing a machine's memory."""
    fig, ax = new_figure(9.5, 4.6)
    components = ["params", "grads", "optimizer"]
    _stacked_bars(ax, ["ZeRO-0\n(replicate all)", "ZeRO-1\n(shard optimizer)",
                       "ZeRO-2\n(+ gradients)", "ZeRO-3\n(+ parameters)"],
                  zero_rows(num_params, ranks, precision, expert_params, ep), components,
                  capacity_bytes, _capacity_label(gpu_name, device), device)
    experts = f"; routed experts' over {ranks // ep}" if expert_params else ""
    ax.set_xlabel(f"ZeRO stage (states sharded over {ranks} ranks{experts})")
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles[::-1], labels[::-1], loc="outside right upper", fontsize=8)
    per_param = f"{precision.param_bytes:g}+{precision.grad_bytes:g}+" \
                f"{precision.optimizer_bytes:g} B/param"
    ax.set_title(f"{model_name}: {(num_params + expert_params) / 1e6:,.1f} M params, "
                 f"{per_param}",
                 loc="left", fontsize=9, fontweight="normal")
    fig.suptitle(f"Model-state memory per {device} under ZeRO 0-3", x=0.01, ha="left")
    return fig


def plot_stage_memory(rows: list[dict[str, float]], capacity_bytes: float | None,
                      gpu_name: str, layout_text: str, labels: list[str] | None = None,
                      device: str = "GPU") -> Figure:
    """One stacked bar per pipeline stage from the planner's per-stage rows (components:
    whichever of params, grads, optimizer, activations, buffers, reserved they carry)."""
    components = [c for c in COMPONENT_COLOUR if any(c in r for r in rows)]
    fig, ax = new_figure(max(8.5, 1.2 * len(rows) + 6), 4.6)
    _stacked_bars(ax, labels or [f"stage {i}" for i in range(len(rows))],
                  [{c: r.get(c, 0.0) for c in components} for r in rows], components,
                  capacity_bytes, _capacity_label(gpu_name, device), device)
    ax.set_xlabel("pipeline stage (the first adds the embedding, the last the head and logits)")
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles[::-1], labels[::-1], loc="outside right upper", fontsize=8)
    ax.set_title(textwrap.fill(f"layout {layout_text}", 70), loc="left", fontsize=9,
                 fontweight="normal")
    fig.suptitle(f"Memory per {device} on each pipeline stage", x=0.01, ha="left")
    return fig
