"""Calibration: measure this machine (GEMMs, attention, elementwise kernels, collectives) and
write the hardware profile the planner reads (`paraxis calibrate`, then
`paraxis plan --hardware profile.json`). fit.py and profile.py are pure Python; measure.py
and command.py run torch."""
