"""Training: the run config and run files, its checks, the loop, resume and ownership,
metrics, `--layout auto`, and calibration of this machine."""
