"""`paraxis lab`: write the course's seven simulators, and two beyond it, as one
self-contained HTML page.

The page is a template (page.html, widgets.html) with its scripts (core.js; one file a part
of the course: scaling_data_tensor.js, pipelines_zero_grid.js, context_experts.js) and the
library's figures (`facts`, `schedule_facts`, `grid_facts`, `context_facts`, `expert_facts`)
inlined:
no server, no network, no external URL. The JSON is escaped so that no "</" can end the
script element early.
"""

from __future__ import annotations

import json
from importlib.resources import files
from pathlib import Path

from paraxis.show.lab.context_facts import context_facts
from paraxis.show.lab.expert_facts import expert_facts
from paraxis.show.lab.facts import dp_facts, ring_facts, scaling_facts, tp_facts, zero_facts
from paraxis.show.lab.grid_facts import grid_facts
from paraxis.show.lab.schedule_facts import schedule_facts
from paraxis.spec.errors import ParaxisError

PAGE_NAME = "lab.html"
SCRIPTS = ("core.js", "scaling_data_tensor.js", "pipelines_zero_grid.js",
           "context_experts.js")


def lab_data() -> dict:
    """Everything the widgets look up, keyed by widget."""
    return {"scaling": scaling_facts(), "dp": dp_facts(), "ring": ring_facts(),
            "tp": tp_facts(), "pipeline": schedule_facts(), "zero": zero_facts(),
            "grid": grid_facts(), "context": context_facts(), "experts": expert_facts()}


def _asset(name: str) -> str:
    return files("paraxis.show.lab").joinpath(name).read_text(encoding="utf-8")


def build_page(data: dict | None = None) -> str:
    """The page's HTML text."""
    payload = json.dumps(lab_data() if data is None else data, separators=(",", ":"))
    payload = payload.replace("</", "<\\/")
    scripts = "\n".join(_asset(name) for name in SCRIPTS)
    return (_asset("page.html").replace("<!--WIDGETS-->", _asset("widgets.html"))
            .replace("/*DATA*/", payload).replace("/*SCRIPTS*/", scripts))


def write_lab(out: str | Path, data: dict | None = None) -> Path:
    """Write the page (with `data`, default `lab_data()`) to `out`/lab.html, creating
    `out`, and return its path."""
    folder = Path(out)
    if folder.exists() and not folder.is_dir():
        raise ParaxisError(f"--out {folder} is a file; give a folder to write {PAGE_NAME} into")
    path = folder / PAGE_NAME
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path.write_text(build_page(data), encoding="utf-8")
    except OSError as error:
        raise ParaxisError(f"cannot write {path}: {error.strerror}; choose another --out") \
            from error
    return path
