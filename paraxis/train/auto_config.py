"""The run config's [auto] section: `--layout auto`, or `layout = "auto"` atop a run file.

The planner then picks the layout on this machine's calibrated profile before the ranks
start (`paraxis.train.auto_layout`); the config the run saves holds the layout it picked, with
`enabled = false` and the planner's step time for it, so the run can be repeated as it ran.
Pure Python, like the rest of the config.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from paraxis.spec.errors import ParaxisError
from paraxis.spec.options import option


@dataclass(frozen=True)
class AutoSection:
    enabled: bool = option(False, "let the planner choose the layout on this machine's "
                           "calibrated profile (what --layout auto sets)", "--auto-layout")
    memory_gb: float | None = option(None, "memory per rank the auto layout must fit in, as "
                                     "the planner forecasts it: tensors and the process "
                                     "baseline, not the data or the loop's own buffers "
                                     "(default: the profile's share of this machine's)",
                                     "--memory-gb")
    predicted_step_s: float | None = option(None, "the planner's step time for the layout "
                                            "that runs (set by --layout auto; each metrics "
                                            "record carries it)", "--predicted-step-s")


def take_layout(flags: dict[str, Any], current: Any) -> Any:
    """Pop the layout from `flags` (RunConfig.with_flags): "auto" turns auto on and leaves
    the default Layout for the planner to replace; any other layout given turns it off (a
    command line's layout wins over a run file's auto)."""
    if "layout" not in flags:
        return current
    layout = flags.pop("layout")
    auto = isinstance(layout, str) and layout.strip() == "auto"
    flags.setdefault("auto_layout", auto)
    return type(current)() if auto else layout


def expand_run_file(doc: dict[str, Any]) -> dict[str, Any]:
    """A run file's `layout = "auto"` (a top-level key, so atop the file) as the [auto]
    section's `enabled = true`; any other document as it is."""
    if doc.get("layout") != "auto":
        return doc
    return {**doc, "layout": {}, "auto": {**doc.get("auto", {}), "enabled": True}}


def check_no_layout_flags(layout_flags: list[str]) -> None:
    """Auto chooses every layout field: one given beside it would be silently dropped."""
    if layout_flags:
        given = ", ".join(f"--{key.replace('_', '-')}" for key in layout_flags)
        raise ParaxisError(f"--layout auto chooses every layout field; leave out {given} "
                           "(or give the whole layout instead of auto)")
