"""paraxis: train one model across many devices, and understand how.

The package's folders are its layers, lowest first: spec, files, data, plan (no torch), then
dist, kernels, parallel, model, engine, parallelize, train, show, commands and cli
(docs/architecture.md; pyproject.toml's import-linter contracts keep them).
"""

__version__ = "0.1.0"
