"""The planner against published runs: the fitted ones, the held-out ones, and the fits."""
