"""Pure-Python simulators (no torch): what the runtime does, step by step."""
