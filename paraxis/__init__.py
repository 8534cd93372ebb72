"""paraxis: train one model across many devices, and understand how.

The package's folders are its layers, lowest first: spec, files, data, plan (no torch), then
dist, parallel, model, engine, parallelize, train, show and commands (docs/architecture.md).
"""

__version__ = "0.1.0"
