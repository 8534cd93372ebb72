"""A hardware profile for a CPU run on this machine, found or measured in seconds.

A forecast of a CPU run must be priced on this CPU, not on a GPU preset. The profile is,
first found: one already in the run's folder, or the committed `docs/hardware-profile.json`,
when either was measured on this CPU model with this many cores, at the run's model's
shapes (a tiny model's GEMMs and dispatch are not a larger one's) and timed collectives on
the run's rank count; else a short calibration (one rank's kernels at the run's own layer
shapes; the collectives on the run's rank count at four message sizes, five where the
model's gradients pass 1 MiB; the cores as many busy ranks as the run has get: about 5-30 s,
load permitting), saved in the run's folder for the next report (`save_profile`: a run
folder that cannot be written is left as it is, and the profile kept in a temporary file for
this report alone). `paraxis demo` calibrates just before its run; the report after it
probes the cores and times the compute and the collectives again and prices with the means,
as the load (and a shared VM's speed) may change while a run runs. Both record the share
of CPU time a VM's host took meanwhile (`calibration.cpu_steal`, paraxis/files/host_steal.py).
"""

from __future__ import annotations

import atexit
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from paraxis.files.host import write_whole
from paraxis.files.host_steal import DISTURBED_STEAL, StealMeter
from paraxis.files.model_file import load_model_config
from paraxis.spec.errors import ParaxisError
from paraxis.train.calibrate.measure import (
    DEFAULT_SIZES_KB,
    compute_rates,
    cpu_cores,
    cpu_model_name,
)
from paraxis.train.calibrate.profile import link_fields

COMMITTED = Path(__file__).resolve().parents[3] / "docs" / "hardware-profile.json"
PROFILE_NAME = "hardware-profile.json"
# Bytes, latency- to bandwidth-bound. A small model's TP all-reduces are latency-bound: with
# fewer sizes or repeats, gloo's noise can fit alpha to 0 and price them 6x too cheap.
QUICK_SIZES = (4 * 1024, 32 * 1024, 256 * 1024, 1024 * 1024)
QUICK_REPEATS = 5
PROBE_S = 2.0  # seconds the busy ranks run to see how many cores our ranks get


@dataclass(frozen=True)
class FoundProfile:
    path: Path
    how: str  # "committed", "cached" (an earlier calibration for a run of this shape), or
    # "calibrated" (now)
    cpu: str  # the CPU model it was measured on
    cores: int
    seconds: float  # how long the calibration took (0 where none ran now)
    unwritable: Path | None = None  # the run folder it could not be saved in (`save_profile`)

    def describe(self) -> str:
        """One sentence for the report: which profile, and why it applies."""
        unsaved = "" if self.unwritable is None else \
            f", not saved: {self.unwritable} cannot be written"
        return self._which() + unsaved

    def _which(self) -> str:
        if self.how == "committed":
            return (f"the committed profile {self.path.name} (measured on this CPU, "
                    f"{self.cpu}, {self.cores} cores)")
        if self.how == "calibrated":
            return (f"a short calibration of this machine ({self.cpu}, {self.cores} cores) "
                    f"made now in {self.seconds:.0f} s")
        return (f"a short calibration of this machine ({self.cpu}, {self.cores} cores) made "
                f"in {self.seconds:.0f} s for a run of this model on as many ranks, kept in "
                f"{self.unwritable or self.path.parent} (the cores the ranks get, the compute "
                "rates and the collectives: the means of its timings before and after that "
                "run)")


def calibration_steal(path: str | Path) -> float | None:
    """The largest share of CPU time a VM's host took during the timings the profile at
    `path` prices with (paraxis/files/host_steal.py): of those before and after a run, the ones
    `after_weight` let count (a disturbed timing set aside for a quiet one is not what the
    forecast rests on); None where none was recorded."""
    try:
        calibration = json.loads(Path(path).read_text()).get("calibration", {})
    except (OSError, ValueError):
        return None
    shares = list(calibration.get("cpu_steal", []))
    weight = calibration.get("after_run_weight")
    if len(shares) == 2 and weight in (0.0, 1.0):
        shares = [shares[int(weight)]]  # only the timings that counted
    shares = [share for share in shares if share is not None]
    return max(shares) if shares else None


def matches(path: Path, cpu: str, cores: int, ranks: int, model: str) -> bool:
    """Whether the profile at `path` was measured on this CPU, at `model`'s shapes, with
    the run's rank count."""
    try:
        profile = json.loads(path.read_text())
        return _matches(profile, cpu, cores, ranks, model)
    except (OSError, ValueError, AttributeError, KeyError, TypeError, ParaxisError):
        return False  # unreadable, or not a profile: not this run's


def _matches(profile: dict, cpu: str, cores: int, ranks: int, model: str) -> bool:
    """`matches` for a profile read (a malformed one raises a lookup or type error)."""
    device = profile.get("calibration", {}).get("device", {})
    timed = profile.get("cluster", {}).get("collectives", {}).get("all_reduce", {})
    shapes = profile.get("calibration", {}).get("compute", {}).get("shapes_from", {})
    raw = profile.get("calibration", {}).get("collectives", {})  # what a re-timing reads
    # the model by what it holds (a model file of the same name in another project, or
    # edited since, is another model; the same one spelt ./m.json or by its run's saved
    # model.json is this one), by its text in a profile made before shapes were kept
    shape = shapes.get("shape")
    return (device.get("type") == "cpu" and device.get("model") == cpu
            and (shape == load_model_config(model).shape_key() if shape
                 else shapes.get("model") == model)
            and device.get("cores") == cores
            and "matmul" in profile["calibration"]["compute"]
            and (ranks < 2 or (str(ranks) in timed and "all_reduce" in raw.get(str(ranks), {})
                               and str(ranks) in profile["cluster"].get("sync_wait_s", {}))))


def quick_sizes(model: str) -> list[int]:
    """QUICK_SIZES, and where `model`'s fp32 gradients (the DP sync's message, in 25 MB
    buckets) are larger, that size too, up to the largest size `paraxis calibrate` times:
    fits do not extrapolate well (`measure.DEFAULT_SIZES_KB`)."""
    gradients = min(4 * load_model_config(model).num_params(), max(DEFAULT_SIZES_KB) * 1024)
    return [*QUICK_SIZES, *([gradients] if gradients > max(QUICK_SIZES) else [])]


def _rates_again(shapes_from: dict) -> dict[str, float]:
    """The compute rates a quick calibration measured, timed again (the profile's fields)."""
    return compute_rates(shapes_from["model"], shapes_from["tokens"], shapes_from["seq_len"],
                         QUICK_REPEATS)


def _collectives_again(profile: dict, ranks: int) -> dict:
    """The profile's collectives and sync waits timed again on `ranks` ranks
    (`collective_body`'s {"times", "sync_wait_s", "sync_wait_curve_s", "scalar_call_s"})."""
    from paraxis.train.calibrate.measure import (  # lazy: a test patches measure.collectives_again
        collectives_again,
    )

    again = collectives_again(profile, ranks, QUICK_REPEATS)
    profile["calibration"]["collectives_after_run"] = {str(ranks): again}
    return again


def _price_collectives(profile: dict, ranks: int, again: dict, after: float) -> None:
    """Refit the profile's links from each point's timings before and after the run,
    weighted `1 - after` and `after` (a quick profile times one rank count: all its fits
    are refitted)."""
    def mix(before: float, later: float) -> float:
        return (1 - after) * before + after * later

    before = profile["calibration"]["collectives"][str(ranks)]
    times = {op: {n: [[size, mix(s, s_again)] for (size, s), (_, s_again) in zip(
        points, again["times"][op][n], strict=True)] for n, points in by_group.items()}
        for op, by_group in before.items()}
    waits = profile["cluster"].get("sync_wait_s", {}).get(str(ranks), {})
    means = {n: mix(waits.get(n, wait), wait) for n, wait in again["sync_wait_s"].items()}
    calls = profile["cluster"].get("scalar_call_s", {}).get(str(ranks), {})
    call_means = {n: mix(calls.get(n, call), call)
                  for n, call in again.get("scalar_call_s", {}).items()}
    curves = profile["cluster"].get("sync_wait_curve_s", {}).get(str(ranks), {})
    # the curves point by point, where both were timed at the same segments; a group without
    # such a pair keeps the flat figure alone (a curve of the later timing would carry none
    # of the weights)
    curve_means = {n: [[c, mix(w_before, w)] for (c, w_before), (_, w) in zip(
        curves[n], later, strict=True)]
        for n, later in again.get("sync_wait_curve_s", {}).items()
        if [c for c, _ in curves.get(n, [])] == [c for c, _ in later]}
    gpu, cluster = link_fields({ranks: times}, {ranks: means},
                               {ranks: call_means} if call_means else None,
                               {ranks: curve_means} if curve_means else None)
    profile["gpu"].update(gpu)
    profile["cluster"].update(cluster)
    if not curve_means:  # no comparable pair: no curve, not the cached one unmixed
        profile["cluster"].pop("sync_wait_curve_s", None)


def after_weight(before_steal: float | None, after_steal: float | None) -> float:
    """How much the timings after a run count against those before it: half each, unless
    the host of a VM took more than DISTURBED_STEAL of the CPU during one of them and not
    during the other (paraxis/files/host_steal.py): then only the undisturbed ones count."""
    disturbed = [share is not None and share > DISTURBED_STEAL
                 for share in (before_steal, after_steal)]
    if disturbed == [True, False]:
        return 1.0
    if disturbed == [False, True]:
        return 0.0
    return 0.5


def save_profile(profile: dict, path: Path) -> Path:
    """Write `profile` at `path` and return where it is. Where `path` cannot be written after
    all (a full disk, a read-only file system), into a temporary file this process removes when
    it exits: the report goes on uncached, and nothing of the user's is changed."""
    text = json.dumps(profile, indent=2) + "\n"
    try:
        write_whole(path, text)
        return path
    except OSError:
        pass
    try:
        handle, name = tempfile.mkstemp(prefix="paraxis-", suffix=f"-{path.name}")
        with os.fdopen(handle, "w") as file:
            file.write(text)
    except OSError as error:
        raise ParaxisError(f"cannot save the calibration of this CPU in {path.parent} nor in "
                           f"a temporary folder ({error.strerror}); free some space, or give "
                           "--hardware (a `paraxis calibrate` profile)") from None
    atexit.register(Path(name).unlink, missing_ok=True)
    return Path(name)


def profile_for_cpu_run(ranks: int, folder: str | Path, model: str = "tiny",
                        seq_len: int = 128) -> FoundProfile:
    """The profile a CPU run of `ranks` ranks of `model` is forecast with (module docstring)."""
    from paraxis.train.calibrate.measure import (  # lazy: tests patch these in measure
        available_cores,
        calibrate,
    )

    cpu, cores = cpu_model_name(), cpu_cores()
    if matches(COMMITTED, cpu, cores, ranks, model):
        return FoundProfile(COMMITTED, "committed", cpu, cores, 0.0)
    cached = Path(folder) / PROFILE_NAME
    if matches(cached, cpu, cores, ranks, model):
        profile = json.loads(cached.read_text())
        calibration = profile["calibration"]
        probes = calibration.setdefault("core_probes",
                                        [profile["cluster"]["available_cores"]])
        if len(probes) == 1:
            # Made before the run (paraxis demo): the load, and a shared VM's speed, may
            # have changed while it ran, so probe the cores and time the compute again after
            # it and price with the means (as bench.predicted_vs_measured does). The first
            # reuse of any cached profile does this once (--layout auto's cache too); later
            # ones reuse the means.
            # A VM's host may take CPU time during either timing: only undisturbed ones
            # count where one of them was (`after_weight`).
            with StealMeter() as meter:
                probes.append(available_cores(cores, PROBE_S, ranks))
                after = _rates_again(calibration["compute"]["shapes_from"])
                again = _collectives_again(profile, ranks) if ranks > 1 else None
            steals = calibration.setdefault("cpu_steal", [None])
            steals.append(meter.share)
            weight = after_weight(steals[0], meter.share)
            calibration["after_run_weight"] = weight
            profile["cluster"]["available_cores"] = (1 - weight) * probes[0] + weight * probes[1]
            calibration["compute_after_run"] = after
            profile["gpu"].update({k: (1 - weight) * profile["gpu"][k] + weight * v
                                   for k, v in after.items()})
            if again is not None:
                _price_collectives(profile, ranks, again, weight)
            kept = save_profile(profile, cached)
            return FoundProfile(kept, "cached", cpu, cores, calibration.get("seconds", 0.0),
                                None if kept == cached else cached.parent)
        return FoundProfile(cached, "cached", cpu, cores, calibration.get("seconds", 0.0))
    started = time.perf_counter()
    with StealMeter() as meter:
        profile = calibrate([ranks], quick_sizes(model), model=model, tokens=16 * seq_len,
                            seq_len=seq_len, repeats=QUICK_REPEATS, device="cpu",
                            busy_s=PROBE_S, log=lambda *_: None, busy_ranks=ranks)
    profile["calibration"]["cpu_steal"] = [meter.share]
    kept = save_profile(profile, cached)
    return FoundProfile(kept, "calibrated", cpu, cores, time.perf_counter() - started,
                        None if kept == cached else cached.parent)
