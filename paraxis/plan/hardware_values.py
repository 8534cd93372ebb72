"""The numbers a hardware description may hold: one check for a file's values and the
flags' (`hardware.build_cluster`), so a quoted number, a negative bandwidth or a zero
efficiency is one line naming the key, not a traceback or a price below zero."""

from __future__ import annotations

import math

from paraxis.errors import ParaxisError

# Fractions of a datasheet figure a kernel or collective reaches: above 0, at most 1.
FRACTIONS = ("matmul_efficiency", "link_efficiency", "hbm_efficiency")
# Rates, sizes and counts that must be above 0 (0 would divide by zero or hold nothing).
POSITIVE = ("peak_flops", "memory_bytes", "nvlink_bandwidth_Bps", "hbm_bandwidth_Bps",
            "inter_node_bandwidth_Bps", "nodes", "gpus_per_node")


def check_values(values: dict[str, object], kinds: dict[str, str]) -> None:
    """Raise one line for the first value of `values` that is not of its field's kind
    (`kinds`: field name -> "float", "int", ...) or out of its range; 0 stays allowed where
    it means "not measured" or "none" (latencies, gemm_half_width, nics_per_node...)."""
    for key, value in values.items():
        kind = kinds.get(key)
        if kind not in ("float", "int"):
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) \
                or not math.isfinite(value):
            raise ParaxisError(f"hardware {key} = {value!r} must be a number; "
                               + (f"write it without quotes: {key} = {value}"
                                  if _reads_as_number(value) else "give one"))
        if kind == "int" and value != int(value):
            raise ParaxisError(f"hardware {key} = {value!r} must be a whole number")
        if key in FRACTIONS and not 0 < value <= 1:
            raise ParaxisError(f"hardware {key} = {value!r} is the achieved share of a "
                               "datasheet figure: give a number above 0 and at most 1")
        if key in POSITIVE and value <= 0:
            raise ParaxisError(f"hardware {key} = {value!r} must be above 0")
        if value < 0:
            raise ParaxisError(f"hardware {key} = {value!r} must not be negative (0: none)")


def _reads_as_number(value: object) -> bool:
    try:
        return isinstance(value, str) and math.isfinite(float(value))
    except ValueError:
        return False
