"""Plain facts, no torch: errors, units, the Layout, model shapes, precision policies, kernel
facts, the stage partition, context-parallel balance, expert placement and the pipeline
schedules. Every layer above reads them; they import nothing of paraxis above them."""
