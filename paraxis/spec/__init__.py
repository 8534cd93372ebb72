"""Plain facts, no torch: errors, units, options, the Layout and its checks against a model,
model shapes and presets, precision policies and their bytes, AdamW's defaults, kernel
facts, the stage partition, context-parallel balance, expert placement and the pipeline
schedules. Every layer above reads them; they import nothing of paraxis above them."""
