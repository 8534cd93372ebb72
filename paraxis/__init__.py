"""paraxis: train one model across many devices, and understand how.

The pure-Python parts (layout, model shapes, planner, schedules) import without torch; the
runtime (`paraxis.runtime`, `paraxis.model.transformer`) needs torch.
"""

__version__ = "0.1.0"
