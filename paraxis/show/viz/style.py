"""Shared look of every picture, and turning a figure into bytes the report can embed."""

from __future__ import annotations

import base64
import io

import matplotlib

matplotlib.use("Agg")  # files only: works on servers and in tests without a display

from matplotlib.figure import Figure  # noqa: E402 - after choosing the backend

# Okabe & Ito 2008, "Color Universal Design": distinguishable with every common colour
# vision deficiency, and dark enough to show on white paper.
OKABE_ITO = {
    "orange": "#E69F00", "sky": "#56B4E9", "green": "#009E73", "yellow": "#F0E442",
    "blue": "#0072B2", "vermillion": "#D55E00", "purple": "#CC79A7", "grey": "#999999",
    "black": "#000000",
}
# One meaning per colour across all pictures: forward blue, backward vermillion, comms grey.
KIND_COLOUR = {"F": OKABE_ITO["blue"], "B": OKABE_ITO["vermillion"],
               "W": OKABE_ITO["purple"], "send": OKABE_ITO["grey"], "recv": OKABE_ITO["grey"]}
KIND_HATCH = {"F": "", "B": "//", "W": "xx", "send": "..", "recv": ".."}
KIND_LABEL = {"F": "forward", "B": "backward", "W": "weight-grad",
              "send": "send / recv (incl. waiting)", "recv": "send / recv (incl. waiting)"}
AXIS_COLOUR = {"dp": OKABE_ITO["blue"], "tp": OKABE_ITO["green"], "pp": OKABE_ITO["orange"],
               "cp": OKABE_ITO["purple"]}
RANK_COLOURS = [OKABE_ITO[c] for c in ("blue", "orange", "green", "vermillion", "purple",
                                       "sky", "yellow", "grey")]

# Figures always draw on white with black text: the report puts them on white cards, so
# they read the same on a dark page, on a light page and on paper.
RC = {
    "figure.facecolor": "white", "axes.facecolor": "white", "savefig.facecolor": "white",
    "text.color": "black", "axes.labelcolor": "black", "xtick.color": "black",
    "ytick.color": "black", "axes.edgecolor": "#333333", "font.size": 10,
    "axes.titlesize": 11, "axes.titleweight": "bold", "figure.titlesize": 13,
    "figure.titleweight": "bold", "legend.fontsize": 9, "legend.framealpha": 0.9,
    "svg.fonttype": "path", "hatch.linewidth": 0.6, "hatch.color": "white",
}


# Titles and labels read rcParams when they are created, after `new_figure` returns, so the
# style is set for the process (only code that draws paraxis pictures imports this module).
matplotlib.rcParams.update(RC)


def new_figure(width_in: float, height_in: float, **subplots: object) -> tuple[Figure, object]:
    """A figure and its axes with the shared style (layout="constrained" keeps labels in).
    Not pyplot's: nothing keeps it once its caller lets go (a report draws dozens)."""
    fig = Figure(figsize=(width_in, height_in), layout="constrained")
    return fig, fig.subplots(**subplots)


def figure_bytes(fig: Figure, fmt: str = "svg", dpi: int = 120) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format=fmt, dpi=dpi)
    return buffer.getvalue()


def figure_data_uri(fig: Figure, fmt: str = "png") -> str:
    """The figure as a data: URI. PNG by default: a quarter of the SVG's bytes for timelines
    with many bars, and no fonts needed to view it (SVG keeps text as paths for the same)."""
    mime = {"svg": "image/svg+xml", "png": "image/png"}[fmt]
    return f"data:{mime};base64,{base64.b64encode(figure_bytes(fig, fmt)).decode('ascii')}"


def save_figure(fig: Figure, path: str, dpi: int = 110) -> None:
    fmt = path.rsplit(".", 1)[-1]
    with open(path, "wb") as out:
        out.write(figure_bytes(fig, fmt, dpi))
