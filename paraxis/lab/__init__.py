"""The lab: the course's seven simulators as one interactive, self-contained HTML page.

    paraxis lab --out DIR        # writes DIR/lab.html; open it from disk

Widgets: the scaling gap, data parallelism, ring all-reduce, a tensor-parallel MLP, pipeline
schedules (every kind, a slow stage), the ZeRO calculator and the 3D grid. Their figures
are the library's: computed here over every slider setting and embedded (`facts`,
`schedule_facts`, `grid_facts`), or computed in the page by pure functions that
tests/test_lab.py checks against the library in a real browser (`browser`).
"""

from paraxis.lab.page import build_page, lab_data, write_lab

__all__ = ["build_page", "lab_data", "write_lab"]
