"""Calibration: measure this machine and write the hardware profile the planner reads
(`paraxis calibrate`, then `paraxis plan --hardware profile.json`).

fit.py (the alpha-beta fit) and profile.py (the profile document) are pure Python;
kernels.py (GEMM, attention, elementwise rates, shared cores), collectives.py (timed
collectives) run torch; the command is `paraxis/commands/calibrate.py`.
"""
