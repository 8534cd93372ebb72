"""The befores of the predicted-vs-measured bench's before/afters: the profile (and the
figures measured around a run) as the planner priced them before each change to the CPU
model, so every row is priced both ways on the same measurements."""

from __future__ import annotations


def without_sync(profile: dict) -> dict:
    """The profile as priced before the planner charged synchronising calls their wait
    (`Cluster.sync_wait_s`)."""
    return {**profile, "cluster": {k: v for k, v in profile["cluster"].items()
                                   if k not in ("sync_wait_s", "sync_wait_curve_s")}}


def flat_sync(profile: dict) -> dict:
    """The profile priced without the sync-wait curve: every call's sync wait the one figure timed
    after the calibration's own segment (`Cluster.sync_wait_s`), not read off the curve at
    the compute before the call (`Cluster.sync_wait_curve_s`, plan/sync_wait.py)."""
    return {**profile, "cluster": {k: v for k, v in profile["cluster"].items()
                                   if k != "sync_wait_curve_s"}}


def backward_at_forward_segment(profile: dict) -> dict:
    """The profile with the planner's former pricing of the backward: the backward's calls (a
    TP layer's backward collectives, a stage's gradient send) read off the sync-wait curve
    after the forward's segment, not after the backward's (`Cluster.backward_segments`)."""
    return {**profile, "cluster": {**profile["cluster"], "backward_segments": 1.0}}


SMALL_SIZES_BYTES = 4 * 1024 * 1024


def refitted(profile: dict, timings: dict) -> dict:
    """The profile with its collectives' fits made on `timings` ({ranks: {op: {group:
    points}}}) instead of its own."""
    from paraxis.train.calibrate.profile import fit_collectives

    fits = fit_collectives(timings)
    table = {op: {world: {n: fit.to_dict() for n, fit in by_group.items()}
                  for world, by_group in by_world.items()} for op, by_world in fits.items()}
    return {**profile, "cluster": {**profile["cluster"], "collectives": table}}


def small_sizes(profile: dict) -> dict:
    """The profile with its collectives refitted on its own times up to 4 MiB, the sizes
    the calibration stopped at before: the former method on this calibration's points, not
    the former profile (whose fit priced an 8-rank 26 MB all-reduce at 22 ms; refitted so,
    this run's prices it at 88 ms, its full fit at 100 ms). The generic link fields
    (nvlink_bandwidth_Bps, intra_node_latency_s) stay the full fit's; the bench's layouts
    price every group from its own fit."""
    timings = {int(world): {op: {n: [p for p in points if p[0] <= SMALL_SIZES_BYTES]
                                 for n, points in by_group.items()}
                            for op, by_group in ops.items()}
               for world, ops in profile["calibration"]["collectives"].items()}
    return refitted(profile, timings)


def slowest_rank(profile: dict) -> dict:
    """The profile with its collectives fitted on the world's slowest rank's times, as the
    calibration formerly priced them (the same batches, kept beside the groups'
    mean: calibration["collectives_slowest"]). The generic link fields stay the mean's; the
    bench's layouts price every group from its own fit."""
    timings = {int(world): ops
               for world, ops in profile["calibration"]["collectives_slowest"].items()}
    return refitted(profile, timings)


# The befores of the bench's before/afters: {key: (what the price left out, the profile and
# the figures measured around the run as priced without it)}. Each row is priced on each.
BEFORES = {
    # priced in bench.predicted_vs_measured.add_befores: the step less its calls' part
    "without_step_calls": ("without the step's own small calls", None),
    "without_sync": ("without the sync waits", lambda p, now: (without_sync(p), now)),
    "small_sizes": ("with collectives fitted on messages up to 4 MiB",
                    lambda p, now: (small_sizes(p), now)),
    "slowest_rank": ("with collectives timed at the world's slowest rank",
                     lambda p, now: (slowest_rank(p), now)),
    "flat_sync": ("with every call's sync wait the one timed after the calibration's "
                  "segment", lambda p, now: (flat_sync(p), now)),
    "forward_segment": ("with the backward's calls read after the forward's segment",
                        lambda p, now: (backward_at_forward_segment(p), now)),
    "calibration_rates": ("at the calibration's compute rates (not those measured again "
                          "around the run)",
                          lambda p, now: (p, {"available_cores": now["available_cores"]})),
}
