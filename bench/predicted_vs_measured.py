"""The planner's predicted step time next to the measured one, layout by layout.

One model, one global batch, one calibrated hardware profile (`paraxis calibrate`, run by
`python -m bench` just before); each layout trains on real ranks (gloo, one thread each)
through the same engines `paraxis train` builds, and its median step time after warm-up (the
slowest rank's) is set beside `paraxis.plan.cost.evaluate` for that layout on that profile.

What a shared machine changes is measured again around each layout (the mean of a probe
just before and one just after the run): how many cores our ranks get
(`paraxis.train.calibrate.measure.available_cores`; on a quiet machine the core count every time)
and how fast they compute (`bench.calibration.rates_now`; a shared VM's speed drifts between
a calibration and a run). Nothing is fitted to a layout's measured time. The re-timed rates
guard against such drift; they are noisy too. In the run at a5f9256 (AMD EPYC, no drift to
speak of: 72-90 GFLOP/s over its layouts, its calibration 78) the calibration's own rates
priced the 44 layouts better (mean |error| 7.6% against 8.2%); in a run on an Intel
Xeon (115-155 GFLOP/s over the layouts, its calibration 153, the `now` of each row in
docs/benchmarks.json) the re-timed ones did (9.7% against 12.2%). The before/after lines
under the table give both.
"""

from __future__ import annotations

import math
import statistics

import torch

from bench.befores import BEFORES, SMALL_SIZES_BYTES
from bench.common import engine_step, measure_steps
from paraxis.dist.testing import run_distributed
from paraxis.files.host_steal import DISTURBED_STEAL
from paraxis.plan.cost import PREDICTION_SHARE, PREDICTION_TOLERANCE, Estimate, evaluate
from paraxis.plan.hardware import build_cluster
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import PRESETS, ModelConfig
from paraxis.spec.precision import FP32_ADAM

# Hidden 256, 8 layers (so 2, 4 and 8 stages and 2 chunks per stage divide them evenly).
MODEL = PRESETS["small-llama"].replace(name="small-llama-8", n_layers=8)
QUICK_MODEL = PRESETS["tiny-llama"].replace(name="tiny-llama-8", n_layers=8)
LAYOUTS = [
    "dp=1",
    "dp=2",
    "dp=2,zero=3",
    "dp=4,zero=2,microbatches=2",
    "tp=2",
    "tp=2,sp=true",
    "pp=2,microbatches=4,schedule=1f1b",
    "pp=2,microbatches=8,schedule=gpipe",
    "pp=4,microbatches=8,schedule=interleaved,virtual_stages=2",
    "dp=2,tp=2",
    "dp=2,tp=2,pp=2,zero=1,microbatches=4,schedule=1f1b",
    "dp=8",
]
# A check of the CPU model: eight layouts first measured after a fix to it (commit
# 9af132c, a calibrated profile priced its GEMMs with the A100's shape term), listed here
# before they ran, so the fix cannot have been tuned on them. Errors are reported apart.
AFTER_FIX = [
    "dp=2,zero=1",
    "tp=4",
    "pp=4,microbatches=8,schedule=1f1b",
    "dp=4,tp=2",
    "tp=2,pp=2,microbatches=4,schedule=1f1b",
    "dp=2,pp=2,microbatches=4,schedule=gpipe",
    "dp=4,zero=3",
    "pp=8,microbatches=8,schedule=1f1b",
]
# Eight more, listed before the CPU model charged synchronising calls their wait between
# compute (`Cluster.sync_wait_s`, measured by `paraxis calibrate`): reported apart again.
AFTER_SYNC = [
    "dp=4",
    "dp=2,tp=2,zero=1",
    "tp=4,sp=true",
    "pp=2,microbatches=2,schedule=1f1b",
    "dp=2,pp=4,microbatches=4,schedule=1f1b",
    "tp=2,pp=4,microbatches=8,schedule=1f1b",
    "dp=8,zero=3",
    "pp=4,microbatches=4,schedule=gpipe",
]
# Eight more, listed before the calibration timed collectives up to 32 MiB (past the DP
# sync's 25 MB gradient bucket; it stopped at 4 MiB and the fits extrapolated): reported
# apart.
AFTER_SIZES = [
    "dp=4,zero=1",
    "dp=8,zero=1",
    "dp=2,zero=2,microbatches=2",
    "dp=4,pp=2,microbatches=4,schedule=1f1b",
    "dp=2,tp=4",
    "dp=2,tp=2,pp=2,microbatches=4,schedule=gpipe",
    "pp=2,microbatches=16,schedule=1f1b",
    "dp=4,zero=3,microbatches=2",
]
# Eight more, listed before the bench priced each layout at the compute rates measured
# again around it (a shared VM's cores change speed between the calibration and a run):
# reported apart.
AFTER_RATES = [
    "dp=2,tp=2,sp=true",
    "dp=4,zero=2,microbatches=4",
    "pp=2,microbatches=8,schedule=interleaved,virtual_stages=2",
    "dp=2,pp=2,microbatches=8,schedule=1f1b",
    "tp=2,pp=2,microbatches=8,schedule=gpipe",
    "dp=2,zero=3,microbatches=2",
    "dp=8,zero=2",
    "dp=2,tp=2,pp=2,zero=1,microbatches=8,schedule=1f1b",
]
# Eight more, listed before the planner priced the step's own small calls (the loss, the
# gradient norm, the stop flag: plan/step_calls.py) and the calibration timed a one-element
# call per group (`Cluster.scalar_call_s`): reported apart.
AFTER_CALLS = [
    "dp=2,tp=4,zero=1",
    "dp=4,tp=2,zero=1",
    "tp=2,sp=true,pp=2,microbatches=4,schedule=1f1b",
    "dp=2,pp=2,microbatches=2,schedule=1f1b",
    "dp=4,zero=1,microbatches=2",
    "pp=4,microbatches=16,schedule=1f1b",
    "dp=2,tp=2,pp=2,zero=2,microbatches=4,schedule=1f1b",
    "dp=2,tp=2,pp=2,microbatches=8,schedule=interleaved,virtual_stages=2",
]
# Eight more, listed before they first ran: after the runtime's ZeRO-2/3 reduce every
# microbatch (engine/data_parallel/buckets.py) and each row records the CPU time a VM's host took
# (column steal, paraxis/files/host_steal.py): reported apart.
AFTER_STEAL = [
    "dp=2,zero=2,microbatches=4",
    "dp=8,zero=3,microbatches=2",
    "tp=2,pp=2,microbatches=2,schedule=1f1b",
    "dp=2,tp=2,zero=3",
    "pp=2,microbatches=4,schedule=gpipe",
    "dp=2,pp=4,microbatches=8,schedule=interleaved,virtual_stages=2",
    "tp=4,pp=2,microbatches=4,schedule=1f1b",
    "dp=4,tp=2,zero=2,microbatches=2",
]
# Eight more, listed before the calibration priced a collective at the mean of the groups
# that run it at once (each group's time its slowest member's) instead of the slowest rank
# of the world's: reported apart.
AFTER_MEAN = [
    "dp=2,tp=2,pp=2,zero=1,microbatches=2,schedule=1f1b",
    "tp=2,pp=4,microbatches=4,schedule=1f1b",
    "dp=4,tp=2,zero=3",
    "dp=2,tp=2,zero=2,microbatches=2",
    "dp=2,tp=4,zero=2",
    "dp=4,pp=2,microbatches=4,schedule=gpipe",
    "tp=4,pp=2,microbatches=8,schedule=interleaved,virtual_stages=2",
    "dp=8,zero=1,microbatches=2",
]
# Eight more, listed before the planner read each call's sync wait at the compute before it
# (a TP call after half a layer's forward on its rank, a send after a chunk's forward:
# plan/sync_wait.py) from a curve the calibration times, instead of one figure after half a
# layer at the calibration's 2048 tokens: reported apart.
AFTER_SEGMENT = [
    "tp=2,pp=2,microbatches=8,schedule=1f1b",
    "tp=4,pp=2,microbatches=2,schedule=1f1b",
    "dp=2,tp=4,sp=true",
    "dp=4,tp=2,microbatches=2",
    "dp=2,tp=2,pp=2,microbatches=2,schedule=gpipe",
    "pp=8,microbatches=16,schedule=1f1b",
    "tp=2,pp=4,microbatches=8,schedule=interleaved,virtual_stages=2",
    "dp=2,pp=2,microbatches=4,schedule=interleaved,virtual_stages=2",
]
# Eight more, listed before the planner read the backward's calls (a TP layer's backward
# collectives, a stage's gradient send) after the backward's compute before them, twice the
# forward's, instead of after the forward's segment: reported apart.
AFTER_BACKWARD = [
    "dp=2,tp=4,microbatches=2",
    "tp=4,microbatches=2",
    "dp=2,tp=2,microbatches=4",
    "tp=2,sp=true,pp=2,microbatches=8,schedule=1f1b",
    "tp=2,pp=2,microbatches=4,schedule=gpipe",
    "tp=4,pp=2,microbatches=8,schedule=1f1b",
    "pp=4,microbatches=8,schedule=gpipe",
    "dp=2,tp=2,pp=2,microbatches=4,schedule=1f1b",
]
QUICK_LAYOUTS = ["dp=1", "tp=2", "pp=2,microbatches=4,schedule=1f1b"]
# `python -m bench --layouts first,after_mean` runs these groups only (default: all)
GROUP_LAYOUTS = {"first": LAYOUTS, "after_fix": AFTER_FIX, "after_sync": AFTER_SYNC,
                 "after_sizes": AFTER_SIZES, "after_rates": AFTER_RATES,
                 "after_calls": AFTER_CALLS, "after_steal": AFTER_STEAL,
                 "after_mean": AFTER_MEAN, "after_segment": AFTER_SEGMENT,
                 "after_backward": AFTER_BACKWARD}


def setting(quick: bool) -> dict:
    if quick:
        return {"quick": True, "model": QUICK_MODEL, "global_batch": 8, "seq_len": 32,
                "steps": 2,
                "warmup": 1, "repeats": 1}
    return {"quick": False, "model": MODEL, "global_batch": 16, "seq_len": 128, "steps": 5,
            "warmup": 2, "repeats": 3}


def train_body(cfg: ModelConfig, layout: Layout, global_batch: int, seq_len: int, steps: int,
               warmup: int) -> dict:
    """On every rank: build the engine `paraxis train` would, time its steps (the training
    loop's, stop flag included: rows before `AFTER_CALLS` timed them without it) on a fixed
    batch."""
    from paraxis.dist.groups import build_groups
    from paraxis.dist.preemption import StopRequest
    from paraxis.parallelize import build_engine

    groups = build_groups(layout)
    engine = build_engine(cfg, layout, groups, "cpu", seed=0, seq_len=seq_len)
    tokens = torch.randint(0, cfg.vocab_size, (global_batch, seq_len + 1),
                           generator=torch.Generator().manual_seed(0))
    per_dp = global_batch // layout.dp  # this dp rank's rows, as the training loop slices
    rows = slice(groups.dp_rank * per_dp, (groups.dp_rank + 1) * per_dp)
    x, y = tokens[rows, :-1].contiguous(), tokens[rows, 1:].contiguous()
    step = engine_step(engine, x, y, clip=1.0)
    with StopRequest() as stop:

        def train_step() -> None:  # paraxis train ends every step on the stop flag
            step()
            stop.agreed(torch.device("cpu"))

        return measure_steps(train_step, steps, warmup)


def measure(cfg: ModelConfig, layout: Layout, s: dict) -> tuple[float, float]:
    """(step seconds, cores used): the median over repeats of the slowest rank's median
    step time, and of the CPU seconds all ranks used per step over that time (how many
    cores the run actually had: the profiling figure behind a miss on a shared machine)."""
    steps, cores = [], []
    for _ in range(s["repeats"]):
        per_rank = run_distributed(
            train_body, layout.world_size,
            (cfg, layout, s["global_batch"], s["seq_len"], s["steps"], s["warmup"]),
            timeout_s=900)
        slowest = max(r["step_time_s"] for r in per_rank)
        steps.append(slowest)
        cores.append(sum(r["cpu_time_s"] for r in per_rank) / slowest)
    return statistics.median(steps), statistics.median(cores)


def predict(cfg: ModelConfig, layout: Layout, profile: dict, global_batch: int,
            seq_len: int, now: dict | None = None) -> Estimate:
    """The planner's estimate for `layout` on the calibrated machine, fp32 Adam as run;
    `now`: what was measured again around the run, in place of the profile's
    ({"available_cores"}, and the compute rates' fields: `bench.calibration.rates_now`)."""
    overrides = {**profile_overrides(profile), **(now or {})}
    cluster = build_cluster(gpus=layout.world_size, overrides=overrides)
    return evaluate(cfg, layout, cluster, seq_len, global_batch, FP32_ADAM)


def add_befores(row: dict, layout: Layout, cfg: ModelConfig, profile: dict,
                global_batch: int, seq_len: int) -> dict:
    """`row` (of `layout`) with its step predicted on each of BEFORES, and those errors."""
    before = {}
    now = row.get("now", {"available_cores": row["available_cores"]})
    timed = profile["calibration"]["collectives"]
    largest = max(p[0] for ops in timed.values() for by_group in ops.values()
                  for points in by_group.values() for p in points)
    for key, (_, change) in BEFORES.items():
        if key == "without_step_calls":  # the term adds to the step and enters nothing else
            seconds = row["predicted_step_s"] - row["predicted_parts_s"]["step_calls"]
            before[key] = {"predicted_s": seconds,
                           "error": seconds / row["measured_step_s"] - 1}
            continue
        if key == "small_sizes" and largest <= SMALL_SIZES_BYTES:
            continue  # a profile that never timed larger messages has no before
        if key == "slowest_rank" and "collectives_slowest" not in profile["calibration"]:
            continue  # calibrated before the groups' mean: its times are the slowest rank's
        if key in ("flat_sync", "forward_segment") and \
                "sync_wait_curve_s" not in profile["cluster"]:
            continue  # calibrated before the curve: its waits are the flat figure's
        if key == "calibration_rates" and "peak_flops" not in now:
            continue  # no rates were measured again
        priced_profile, priced_now = change(profile, now)
        seconds = predict(cfg, layout, priced_profile, global_batch, seq_len,
                          priced_now).step_time_s
        before[key] = {"predicted_s": seconds, "error": seconds / row["measured_step_s"] - 1}
    return {**row, "before": before}


def profile_overrides(profile: dict) -> dict:
    """The flat overrides build_cluster takes, from a profile document (hardware.py schema)."""
    return {**profile["gpu"], **profile["cluster"]}


def cores_now(quick: bool) -> float:
    """The cores our ranks get right now (see the module docstring)."""
    from paraxis.train.calibrate.measure import available_cores

    return available_cores(busy_s=0.3 if quick else 2.0)


def measure_around(cfg: ModelConfig, layout: Layout, s: dict) -> tuple[float, float, float]:
    """(step seconds, cores used, cores available): `measure`, between two core probes."""
    before = cores_now(s["quick"])
    seconds, used = measure(cfg, layout, s)
    return seconds, used, (before + cores_now(s["quick"])) / 2


def measure_now(cfg: ModelConfig, layout: Layout, s: dict
                ) -> tuple[float, float, dict, dict]:
    """(step seconds, cores used, now, steal): `measure` between two probes of the cores and
    of the compute rates; now holds the means of each pair (the profile's fields they
    replace); steal, the share of CPU time a VM's host took during the steps' runs ("run")
    and during the probes ("probes"; paraxis/files/host_steal.py, None where not measured)."""
    from bench.calibration import rates_now
    from paraxis.files.host_steal import StealMeter

    with StealMeter() as probes:
        rates = rates_now(s["quick"])
        before = cores_now(s["quick"])
    with StealMeter() as run:
        seconds, used = measure(cfg, layout, s)
    with StealMeter() as probes_after:
        cores = (before + cores_now(s["quick"])) / 2
        after = rates_now(s["quick"])
    shares = [x for x in (probes.share, probes_after.share) if x is not None]
    return seconds, used, {"available_cores": cores,
                           **{k: (v + after[k]) / 2 for k, v in rates.items()}}, \
        {"run": run.share, "probes": max(shares) if shares else None}


def run(quick: bool, profile: dict, layouts: list[str] | None = None, log=print) -> dict:  # noqa: ANN001
    s = setting(quick)
    cfg = s["model"]
    rows = []
    for text in layouts or (QUICK_LAYOUTS if quick else
                            [t for group in GROUP_LAYOUTS.values() for t in group]):
        layout = Layout.parse(text)
        layout = layout.validate(layout.world_size, cfg, s["global_batch"], s["seq_len"])
        measured, used, now, steal = measure_now(cfg, layout, s)
        available = now["available_cores"]
        estimate = predict(cfg, layout, profile, s["global_batch"], s["seq_len"], now)
        cores = min(available, layout.world_size)  # the cores the model lets this run use
        error = estimate.step_time_s / measured - 1
        log(f"  {layout}: measured {measured:.3f} s, predicted {estimate.step_time_s:.3f} s "
            f"({error:+.0%}) with {cores:.2f} cores; the run used {used:.2f}; steal "
            f"{_share(steal['run'])} (probes {_share(steal['probes'])})")
        rows.append({"layout": str(layout), "ranks": layout.world_size, "cores": cores,
                     **{group: text in members for group, members in GROUP_LAYOUTS.items()
                        if group != "first"},
                     "available_cores": available, "now": now, "steal": steal,
                     "cores_used": used,
                     "measured_step_s": measured, "predicted_step_s": estimate.step_time_s,
                     "error": error,
                     "predicted_parts_s": {k: estimate.time[k] for k in (
                         "compute", "tp", "pp", "dp", "bubble", "optimizer", "step_calls")}})
        rows[-1] = add_befores(rows[-1], layout, cfg, profile, s["global_batch"],
                               s["seq_len"])
    errors = [abs(r["error"]) for r in rows]
    return {"model": cfg.to_dict(), "global_batch": s["global_batch"],
            "seq_len": s["seq_len"], "steps": s["steps"], "warmup": s["warmup"],
            "repeats": s["repeats"], "rows": rows,
            "mean_abs_error": statistics.mean(errors),
            "groups": groups(rows), "quiet": quiet_summary(rows),
            "within_target": sum(e <= PREDICTION_TOLERANCE for e in errors),
            "target": PREDICTION_TOLERANCE}


TAGS = {"": "", "after_fix": " (after)", "after_sync": " (after sync)",
        "after_sizes": " (after sizes)", "after_rates": " (after rates)",
        "after_calls": " (after calls)", "after_steal": " (after steal)",
        "after_mean": " (after mean)", "after_segment": " (after segment)",
        "after_backward": " (after backward)"}
GROUPS = (("the fix was found on", ""), ("first measured after it", "after_fix"),
          ("first measured after the sync wait", "after_sync"),
          ("first measured after the 32 MiB sizes", "after_sizes"),
          ("first measured after the rates measured again", "after_rates"),
          ("first measured after the step's own calls", "after_calls"),
          ("first measured after the host's steal was recorded", "after_steal"),
          ("first measured after collectives were timed at the groups' mean", "after_mean"),
          ("first measured after each call's wait was read at the compute before it",
           "after_segment"),
          ("first measured after the backward's calls were read after the backward",
           "after_backward"))


def _group(row: dict) -> str:
    """The row's group's tag (GROUPS), "" for the first 12."""
    return next((tag for _, tag in reversed(GROUPS) if tag and row.get(tag)), "")


def _share(share: float | None) -> str:
    return "-" if share is None else f"{share:.0%}"


def quiet(row: dict) -> bool | None:
    """Whether the VM's host took at most DISTURBED_STEAL of the CPU time during the row's
    steps and its probes (None: a row measured before steal was recorded)."""
    shares = list(row.get("steal", {}).values())
    if not shares or any(share is None for share in shares):
        return None
    return max(shares) <= DISTURBED_STEAL


def quiet_summary(rows: list[dict]) -> dict:
    """Mean |error| and mean signed error over the rows the host left quiet and over those
    it disturbed (decided by the steal measured, before looking at any error)."""
    out = {}
    for name, want in (("quiet", True), ("disturbed", False)):
        errors = [r["error"] for r in rows if quiet(r) is want]
        if errors:
            out[name] = {"layouts": len(errors),
                         "mean_abs_error": statistics.mean(map(abs, errors)),
                         "mean_signed_error": statistics.mean(errors)}
    return out


def _befores(row: dict) -> dict[str, float]:
    """{BEFORES key: error} of a row (rows of earlier runs kept one, `error_without_sync`)."""
    if "error_without_sync" in row:
        return {"without_sync": row["error_without_sync"]}
    return {key: b["error"] for key, b in row.get("before", {}).items()}


def groups(rows: list[dict]) -> dict[str, dict]:
    """Mean |error| and mean signed error of the layouts the CPU model's fix was found on,
    and of those first measured after each later change (`AFTER_FIX`, `AFTER_SYNC`,
    `AFTER_SIZES`, `AFTER_RATES`, `AFTER_CALLS`), apart; each also priced on each of
    BEFORES."""
    out = {}
    for name, group in GROUPS:
        members = [r for r in rows if _group(r) == group]
        if not members:
            continue
        errors = [r["error"] for r in members]
        out[name] = {"layouts": len(errors),
                     "mean_abs_error": statistics.mean(abs(e) for e in errors),
                     "mean_signed_error": statistics.mean(errors), "before": {}}
        for key in BEFORES:
            before = [found[key] for found in map(_befores, members) if key in found]
            if len(before) == len(errors):
                out[name]["before"][key] = {"mean_abs_error": statistics.mean(map(abs, before)),
                                            "mean_signed_error": statistics.mean(before)}
    return out


def render(data: dict) -> str:
    m = data["model"]
    lines = [
        "## Predicted vs measured step time",
        "",
        f"Model `{m['name']}` ({m['style']}, {m['n_layers']} layers, d_model {m['d_model']}, "
        f"vocab {m['vocab_size']}), global batch {data['global_batch']} x {data['seq_len']} "
        f"tokens, fp32, AdamW, clipping at 1.0. Measured: median of {data['steps']} steps "
        f"after {data['warmup']} warm-up, slowest rank, median of {data['repeats']} runs. "
        "Predicted: `paraxis.plan.cost.evaluate` for the layout on the calibrated profile "
        "above, with no per-layout factor; only what a shared machine changes is probed "
        "again around each layout (mean of a probe before and after): the cores our ranks "
        "get (column cores: what that lets this run use, at most one per rank) and, since "
        "the bench lists `AFTER_RATES`, the compute rates (one rank, as the calibration "
        "times them). "
        "Error = predicted / measured - 1. Predicted parts in seconds. Used: the CPU seconds "
        "all ranks spent per step over the step time, i.e. the cores the run really had "
        "(compute and gloo's threads); where it differs from the probed cores, the machine's "
        "load changed during the run. (after): one of the eight layouts first measured "
        "after the fix to the CPU model (`AFTER_FIX`); (after sync): one of the eight "
        "first measured after the model charged each synchronising call its wait between "
        "compute (`AFTER_SYNC`); (after sizes): one of the eight first measured after the "
        "calibration timed collectives up to 32 MiB (`AFTER_SIZES`); (after rates): one of "
        "the eight first measured after the compute rates were measured again around each "
        "layout (`AFTER_RATES`); (after calls): one of the eight first measured after the "
        "planner priced the step's own small calls (`AFTER_CALLS`, column calls); (after "
        "steal): one of the eight first measured after each row recorded the CPU time a "
        "VM's host took (`AFTER_STEAL`); (after mean): one of the eight first measured "
        "after the calibration timed a collective at the mean of the groups running it at "
        "once (`AFTER_MEAN`); (after segment): one of the eight first measured after each "
        "call's sync wait was read at the compute before it (`AFTER_SEGMENT`); (after "
        "backward): one of the eight first measured after the backward's calls were read "
        "after the backward's compute (`AFTER_BACKWARD`). Steal: that "
        "share during the layout's steps "
        "(paraxis/files/host_steal.py), and during its probes in brackets.",
        "",
        "| layout | ranks | cores | used | steal | measured | predicted | error | compute | "
        "tp | pp | dp | bubble | optimizer | calls |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in data["rows"]:
        parts = r["predicted_parts_s"]
        lines.append(
            f"| `{r['layout']}`{TAGS[_group(r)]} | {r['ranks']} | "
            f"{r['cores']:.2f} | {r['cores_used']:.2f} | {_steal_cell(r)} | "
            f"{r['measured_step_s']:.3f} s | "
            f"{r['predicted_step_s']:.3f} s | {r['error']:+.0%} | "
            + " | ".join(f"{parts.get(k, 0.0):.3f}" for k in (
                "compute", "tp", "pp", "dp", "bubble", "optimizer", "step_calls")) + " |")
    lines += ["", f"Mean absolute error {data['mean_abs_error']:.1%}; "
              f"{data['within_target']} of {len(data['rows'])} layouts within "
              f"{data['target']:.0%} (target: at least "
              f"{math.ceil(PREDICTION_SHARE * len(data['rows']))}).", ""]
    for name, g in data.get("groups", {}).items():
        befores = {**({"without_sync": g["without_sync"]} if "without_sync" in g else {}),
                   **g.get("before", {})}
        before = "".join(f"; priced {BEFORES[key][0]}: {b['mean_abs_error']:.1%} and "
                         f"{b['mean_signed_error']:+.1%}" for key, b in befores.items())
        lines.append(f"- Layouts {name}: {g['layouts']}, mean |error| "
                     f"{g['mean_abs_error']:.1%}, mean signed error "
                     f"{g['mean_signed_error']:+.1%}{before} (the targets: <= 10% and "
                     "within +-5%).")
    if data.get("groups"):
        lines.append("")
    for name, g in data.get("quiet", {}).items():
        lines.append(f"- Layouts the VM's host left {name} (steal during the steps and the "
                     f"probes {'at most' if name == 'quiet' else 'above'} "
                     f"{DISTURBED_STEAL:.0%}): {g['layouts']}, mean |error| "
                     f"{g['mean_abs_error']:.1%}, mean signed error "
                     f"{g['mean_signed_error']:+.1%}.")
    if data.get("quiet"):
        lines.append("")
    misses = [r for r in data["rows"] if abs(r["error"]) > data["target"]]
    if misses:
        lines += ["Misses, with what the run's own CPU accounting shows:", ""]
        lines += [f"- `{r['layout']}`: predicted {r['predicted_step_s']:.3f} s, measured "
                  f"{r['measured_step_s']:.3f} s ({r['error']:+.0%}); {_cause(r)}"
                  for r in misses]
        lines.append("")
    return "\n".join(lines)


def _steal_cell(row: dict) -> str:
    steal = row.get("steal")
    return "" if not steal else f"{_share(steal['run'])} ({_share(steal['probes'])})"


def _cause(row: dict) -> str:
    """What the CPU accounting says about a miss (see the table's `used` column)."""
    if quiet(row) is False:
        return (f"the VM's host took {_steal_cell(row)} of the CPU time during the run (its "
                "probes): the machine was shared")
    wanted, used = row["cores"], row["cores_used"]  # the cores the model let this run use
    if used < 0.8 * wanted:
        return (f"the ranks used {used:.2f} cores while the model gave them {wanted:.2f} "
                "(the cores probed around the run): other processes took cores during the "
                "run, or the ranks waited on each other (a pipeline on a loaded machine waits "
                "at every stage boundary for its peer to be scheduled)")
    if used > 1.2 * wanted:
        return (f"the ranks used {used:.2f} cores, more than the {wanted:.2f} probed around "
                "the run: the machine's load changed between the probes and the run")
    return (f"the ranks used {used:.2f} cores, as probed ({wanted:.2f}): the miss is the cost "
            "model's, not the machine's")
