"""`paraxis calibrate` as a bench section: the hardware profile every prediction below uses.

The profile is also written next to docs/benchmarks.md (hardware-profile.json), so
`paraxis plan --hardware docs/hardware-profile.json` prices layouts on the machine the
benchmarks ran on.
"""

from __future__ import annotations

from paraxis.train.calibrate.measure import DEFAULT_SIZES_KB, calibrate

PROFILE_NAME = "hardware-profile.json"


# The shapes and repeats the compute rates are timed at: (model, tokens, seq_len, repeats).
COMPUTE = {True: ("tiny-llama", 256, 32, 2), False: ("small-llama", 2048, 128, 5)}


def run(quick: bool, log=print) -> dict:  # noqa: ANN001
    model, tokens, seq_len, repeats = COMPUTE[quick]
    if quick:
        return calibrate([2], [16 * 1024, 256 * 1024], model, tokens=tokens, seq_len=seq_len,
                         repeats=repeats, device="cpu", busy_s=0.5, log=log)
    return calibrate([2, 4, 8], [kb * 1024 for kb in DEFAULT_SIZES_KB], model,
                     tokens=tokens, seq_len=seq_len, repeats=repeats, device="cpu", log=log)


def rates_now(quick: bool) -> dict[str, float]:
    """The compute rates this section's calibration measured, timed again now (the same
    shapes and repeats), as the profile's GPU fields."""
    from paraxis.train.calibrate.measure import compute_rates

    return compute_rates(*COMPUTE[quick])


def render(profile: dict) -> str:
    gpu, cluster, cal = profile["gpu"], profile["cluster"], profile["calibration"]
    compute = cal["compute"]
    load = ", ".join(f"{x:.1f}" for x in cal.get("load_average", []))
    lines = [
        "## Calibration: this machine as the planner sees it",
        "",
        f"`paraxis calibrate` ({cal.get('seconds', 0):.0f} s, {cal.get('date', '?')}, load "
        f"average {load} while it ran) wrote `{PROFILE_NAME}`. One planner \"GPU\" is one "
        f"{cal['device']['type']} rank ({cal['device'].get('model', gpu['name'])}, "
        f"{compute['dtype']}, one thread). The ranks of the node share its "
        f"{cluster['cores_per_node']} cores and got {cluster['available_cores']:.2f} of them "
        "while calibrating (one busy rank per core for 2 s; other sessions on a shared "
        "machine take the rest). Rates are achieved ones at the model's shapes "
        f"({compute['shapes_from']['model']}, {compute['shapes_from']['tokens']} tokens), "
        "used at efficiency 1.0.",
        "",
        "| kernel class | achieved rate | planner field |",
        "|---|---|---|",
        f"| GEMM (fwd and both bwd products, {len(compute['matmul']['shapes'])} shapes) | "
        f"{gpu['peak_flops'] / 1e9:,.1f} GFLOP/s | `peak_flops` |",
        f"| attention core (causal SDPA, fwd + bwd, planner's FLOP count) | "
        f"{gpu['attention_flops'] / 1e9:,.1f} GFLOP/s | `attention_flops` |",
        f"| eager elementwise ops of a layer (fwd + bwd, planner's byte count) | "
        f"{gpu['hbm_bandwidth_Bps'] / 1e9:,.2f} GB/s | `hbm_bandwidth_Bps` |",
        "",
        "Collectives: time = steps x alpha + factor x bytes / bandwidth, fitted by weighted "
        "least squares with the planner's ring factor and step count (all-reduce 2(n-1)/n "
        "and 2(n-1) steps, all-gather and reduce-scatter (n-1)/n and n-1, send/recv 1 and 1); "
        "all groups of a size run at once, as a layout's groups do.",
        "",
        "| collective | ranks on node | group | alpha (us/step) | bandwidth (GB/s) | "
        "worst fit error |",
        "|---|---|---|---|---|---|",
    ]
    for op, by_world in cluster["collectives"].items():
        for world, by_group in by_world.items():
            for n, fit in by_group.items():
                lines.append(f"| {op} | {world} | {n} | {fit['alpha_s'] * 1e6:,.0f} | "
                             f"{fit['bandwidth_Bps'] / 1e9:.2f} | {fit['max_rel_error']:.0%} |")
    waits, curves = cluster.get("sync_wait_s"), cluster.get("sync_wait_curve_s", {})
    if curves:
        lines += ["", "What a synchronising call costs in a step beyond those fits "
                  "(`sync_wait_curve_s`, train/calibrate/collectives.sync_wait_curve): the median "
                  "wait of a one-element all-reduce after GEMM segments of 1/16, 1/4 and all "
                  "of half a layer's forward, every group at once, less the same call on idle "
                  "ranks; the planner reads a call's wait at the compute before it "
                  "(plan/sync_wait.py), the last point (`sync_wait_s`) after a backward.", "",
                  "| ranks on node | group | segment (ms) | wait per call (ms) |",
                  "|---|---|---|---|"]
        lines += [f"| {world} | {n} | "
                  + ", ".join(f"{c * 1e3:.1f}" for c, _ in curve) + " | "
                  + ", ".join(f"{w * 1e3:.2f}" for _, w in curve) + " |"
                  for world, by_group in curves.items() for n, curve in by_group.items()]
    elif waits:
        lines += ["", "What a synchronising call costs in a step beyond those fits "
                  "(`sync_wait_s`, train/calibrate/collectives.sync_wait): the median wait of a "
                  "one-element all-reduce after half a layer's forward GEMMs, every group at "
                  "once, less the same call on idle ranks.", "",
                  "| ranks on node | group | wait per call (ms) |", "|---|---|---|"]
        lines += [f"| {world} | {n} | {wait * 1e3:.2f} |"
                  for world, by_group in waits.items() for n, wait in by_group.items()]
    return "\n".join(lines) + "\n"
