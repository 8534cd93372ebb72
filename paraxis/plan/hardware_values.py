"""The numbers a hardware description may hold: one check for a file's values and the
flags' (`hardware.build_cluster`), so a quoted number, a negative bandwidth or a zero
efficiency is one line naming the key, not a traceback or a price below zero; and one for
a file's shape (`hardware.load_hardware_file`): its calibrated tables nested as
`paraxis calibrate` writes them."""

from __future__ import annotations

import math
from pathlib import Path
from typing import NoReturn, TypeGuard

from paraxis.spec.errors import ParaxisError
from paraxis.spec.model_config import finite

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
        if kind == "bool" and not isinstance(value, bool):
            raise ParaxisError(f"hardware {key} = {value!r} must be true or false (without "
                               "quotes)")
        if kind == "str" and not isinstance(value, str):
            raise ParaxisError(f"hardware {key} = {value!r} must be text")
        if kind not in ("float", "int"):
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) \
                or not finite(value):
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
        least = SMALLEST.get(key)
        if least is not None and 0 < value < least[0]:  # 0: none, or not measured
            raise ParaxisError(f"hardware {key} = {value!r} is below {least[0]:g} {least[1]}, "
                               "no machine's; give the figure measured")


# The least a real machine has of each rate: a figure under it is a typo or a unit slip
# (1e-300 B/s prices a step of 1e307 s). A phone's CPU core does about 1 GFLOP/s.
SMALLEST = {"peak_flops": (1e6, "FLOP/s"), "attention_flops": (1e6, "FLOP/s"),
            "hbm_bandwidth_Bps": (1e6, "B/s"), "nvlink_bandwidth_Bps": (1e3, "B/s"),
            "inter_node_bandwidth_Bps": (1e3, "B/s"), "available_cores": (0.05, "cores")}


def _reads_as_number(value: object) -> bool:
    try:
        return isinstance(value, str) and math.isfinite(float(value))
    except ValueError:
        return False


# The calibrated tables of a hardware file (`paraxis calibrate` writes them, see
# calibrate/profile.link_fields), each measured per [ranks on the node][group size], and
# what one measurement in them is. "collectives" holds one such table per op.
COUNT_TABLES = {
    "sync_wait_s": "seconds >= 0",
    "scalar_call_s": "seconds >= 0",
    "sync_wait_curve_s": "a list of [segment_s, wait_s] pairs, seconds >= 0",
}
FIT = '{"alpha_s": seconds >= 0, "bandwidth_Bps": bytes/s > 0}'
# The ops a fit may price: comm.COLLECTIVES, named again here because comm imports
# hardware, which imports this module (tests/test_hardware_file_errors.py keeps them equal).
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "send_recv", "all_to_all")


# What `paraxis calibrate` writes (train/calibrate/profile.build_profile): its version, and
# the keys a profile always holds. A profile missing one would be completed from the GPU
# preset beneath it (an A100's 80 GiB and 312 TFLOP/s for a CPU rank), so it is refused.
PROFILE_SCHEMA = "paraxis.hardware-profile/1"
PROFILE_KEYS = {"gpu": ("name", "peak_flops", "hbm_bandwidth_Bps", "memory_bytes"),
                "cluster": ("gpus_per_node", "cores_per_node")}


def check_profile(path: Path, data: object) -> None:
    """Where `data` is a calibration profile (it records its calibration or schema): of
    this version, with every key calibrate writes."""
    if not isinstance(data, dict) or ("calibration" not in data and "schema" not in data):
        return
    again = f"re-run `paraxis calibrate --out {path}`"
    if data.get("schema") != PROFILE_SCHEMA:
        raise ParaxisError(f"hardware file {path} is a profile of schema "
                           f"{data.get('schema')!r}, not {PROFILE_SCHEMA!r} (another paraxis "
                           f"version's); {again}")
    for table, keys in PROFILE_KEYS.items():
        held = data.get(table)
        missing = [key for key in keys if not (isinstance(held, dict) and key in held)]
        if missing:
            raise ParaxisError(f"hardware file {path}: a calibration profile without "
                               f"{table}.{missing[0]}, which calibrate always writes (the "
                               f"preset beneath would price it); {again}")


def check_structure(path: Path, data: object) -> None:
    """Raise one line naming `path` and the key where a parsed hardware file is not shaped
    as the planner reads it: the file is one object of keys, and each calibrated table it
    holds (top level, or under "gpu"/"cluster") has the shape `paraxis calibrate` writes,
    so a hand-edited or truncated profile is refused here, not a traceback deep in a price."""
    if not isinstance(data, dict):
        raise ParaxisError(f"hardware file {path} holds {_kind(data)}, not an object of keys "
                           '(such as {"gpu": "a100-80gb", "nodes": 2}); write one object, or '
                           f"re-run `paraxis calibrate --out {path}`")
    # the calibration's record is not priced, but `paraxis report` reads its device
    record = _expect_object(path, "calibration", data.get("calibration", {}), "of measurements")
    _expect_object(path, "calibration.device", record.get("device", {}), "describing it")
    for prefix, section in (("", data), ("gpu.", data.get("gpu")),
                            ("cluster.", data.get("cluster"))):
        if not isinstance(section, dict):
            continue  # a preset's name ("gpu": "a100-80gb"); a stray "cluster" is unknown
        if "collectives" in section:
            _check_collectives(path, f"{prefix}collectives", section["collectives"])
        for name, expected in COUNT_TABLES.items():
            if name in section:
                for where, entry in _by_counts(path, f"{prefix}{name}", section[name]):
                    if name == "sync_wait_curve_s":
                        _check_curve(path, where, entry)
                    else:
                        _check_seconds(path, where, entry, expected)


def _check_collectives(path: Path, where: str, table: object) -> None:
    """`collectives[op][ranks on the node][group size]` -> a fit (FIT)."""
    for op, by_ranks in _expect_object(path, where, table, "{op: {ranks: {group: fit}}}").items():
        if op not in COLLECTIVES:
            _refuse(path, f"{where}.{op}", f"is not a collective; use {', '.join(COLLECTIVES)}")
        for fit_at, entry in _by_counts(path, f"{where}.{op}", by_ranks):
            fit = _expect_object(path, fit_at, entry, FIT)
            for key in ("alpha_s", "bandwidth_Bps"):
                if key not in fit:
                    _refuse(path, fit_at, f"has no {key}; expected {FIT}")
            alpha, bandwidth = fit["alpha_s"], fit["bandwidth_Bps"]
            if not (_is_number(alpha) and alpha >= 0):
                _refuse(path, f"{fit_at}.alpha_s", f"= {alpha!r} must be a number >= 0 "
                        "(seconds per ring step)")
            if not (_is_number(bandwidth) and bandwidth > 0):
                _refuse(path, f"{fit_at}.bandwidth_Bps", f"= {bandwidth!r} must be a number "
                        "> 0 (bytes/s)")


def _by_counts(path: Path, where: str, table: object) -> list[tuple[str, object]]:
    """The (key path, entry) pairs of a [ranks on the node][group size] table, after checking
    both levels are objects keyed by whole numbers >= 1 (the planner picks the nearest)."""
    entries = []
    for ranks, by_group in _expect_object(path, where, table, "{ranks: {group: ...}}").items():
        _expect_count(path, f"{where}.{ranks}", ranks, "ranks on the node")
        for group, entry in _expect_object(path, f"{where}.{ranks}", by_group,
                                           "{group size: ...}").items():
            _expect_count(path, f"{where}.{ranks}.{group}", group, "ranks in the group")
            entries.append((f"{where}.{ranks}.{group}", entry))
    return entries


def _check_seconds(path: Path, where: str, value: object, expected: str) -> None:
    if not (_is_number(value) and value >= 0):
        _refuse(path, where, f"= {value!r} must be {expected}")


def _check_curve(path: Path, where: str, curve: object) -> None:
    """[[segment_s, wait_s], ...]: the wait after each length of compute."""
    expected = COUNT_TABLES["sync_wait_curve_s"]
    if not isinstance(curve, list):
        _refuse(path, where, f"is {_kind(curve)}; expected {expected}")
    for i, point in enumerate(curve):
        if not (isinstance(point, list) and len(point) == 2
                and all(_is_number(x) and x >= 0 for x in point)):
            _refuse(path, f"{where}[{i}]", f"= {point!r} is not a pair of seconds >= 0; "
                    f"expected {expected}")


def _expect_object(path: Path, where: str, value: object, shape: str) -> dict[str, object]:
    """`value` itself where it is an object (a JSON object, a TOML table); else refused."""
    if not isinstance(value, dict):
        _refuse(path, where, f"is {_kind(value)}; expected an object {shape}")
    return value


def _expect_count(path: Path, where: str, key: str, what: str) -> None:
    """A table key that counts ranks: a whole number >= 1, written as text ("8")."""
    if not (key.isascii() and key.isdigit() and int(key) >= 1):
        _refuse(path, where, f"is not a count of {what} (a whole number >= 1, such as \"8\")")


def _refuse(path: Path, where: str, problem: str) -> NoReturn:
    raise ParaxisError(f"hardware file {path}: {where} {problem}; fix or delete it, or "
                       f"re-run `paraxis calibrate --out {path}`")


def _is_number(value: object) -> TypeGuard[int | float]:
    """A finite int or float (not a bool, not a quoted number)."""
    return (not isinstance(value, bool) and isinstance(value, int | float)
            and finite(value))


def _kind(value: object) -> str:
    """What a parsed JSON/TOML value is, in the file's words."""
    if isinstance(value, bool):
        return f"a true/false ({value!r})"
    if isinstance(value, int | float):
        return f"a number ({value!r})"
    names = {list: "a list", str: "a string", dict: "an object", type(None): "null"}
    return names.get(type(value), f"a {type(value).__name__}")
