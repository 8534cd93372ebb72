"""Turn calibration measurements into the hardware profile `paraxis plan --hardware` reads.

Pure Python. The profile describes this machine as one planner "GPU" type (the device one
rank computes on: a GPU, or one CPU core when ranks run one thread each) at its measured
rates with efficiencies of 1.0, and a one-node "cluster" whose intra-node link is the
measured one, with a fitted (alpha, bandwidth) per collective, ranks on the node and group
size: `collectives[op][ranks on node][group size]`. Schema: paraxis/plan/hardware.py; the
raw measurements ride along under "calibration".
"""

from __future__ import annotations

from paraxis.plan.hardware_values import PROFILE_SCHEMA
from paraxis.train.calibrate.fit import Fit, fit_alpha_beta

SCHEMA = PROFILE_SCHEMA  # what plan.hardware_values checks a profile against


Timings = dict[int, dict[str, dict[str, list[list[float]]]]]


def fit_collectives(timings: Timings) -> dict[str, dict[str, dict[str, Fit]]]:
    """{op: {ranks on node: {group size: Fit}}} from the measured
    {ranks on node: {op: {group size: [[bytes, seconds], ...]}}}."""
    fits: dict[str, dict[str, dict[str, Fit]]] = {}
    for world in sorted(timings):
        for op, by_group in timings[world].items():
            for n, points in by_group.items():
                fit = fit_alpha_beta(op, int(n), [p[0] for p in points],
                                     [p[1] for p in points])
                fits.setdefault(op, {}).setdefault(str(world), {})[n] = fit
    return fits


def link_fields(timings: Timings, sync_waits: dict[int, dict[str, float]] | None = None,
                scalar_calls: dict[int, dict[str, float]] | None = None,
                sync_curves: dict[int, dict[str, list]] | None = None) -> tuple[dict, dict]:
    """(GPU fields, cluster fields) of a profile that the timed collectives set: the fits,
    the generic intra-node link (where no fit applies: the all-reduce ring over the most
    ranks measured, the closest to a whole node) and, on CPU ranks, the sync waits and the
    one-element calls."""
    fits = fit_collectives(timings)
    table = {op: {world: {n: fit.to_dict() for n, fit in by_group.items()}
                  for world, by_group in by_world.items()} for op, by_world in fits.items()}
    ring = [by_group[world] for world, by_group in fits.get("all_reduce", {}).items()
            if world in by_group]
    link = max(ring, key=lambda f: f.ranks) if ring else None
    gpu = {"nvlink_bandwidth_Bps": link.bandwidth_Bps} if link is not None else {}
    cluster: dict[str, object] = {"collectives": table}
    if sync_waits:
        cluster["sync_wait_s"] = {str(n): waits for n, waits in sorted(sync_waits.items())}
    if sync_curves:
        cluster["sync_wait_curve_s"] = {str(n): c for n, c in sorted(sync_curves.items())}
    if scalar_calls:
        cluster["scalar_call_s"] = {str(n): calls for n, calls in sorted(scalar_calls.items())}
    if link is not None:
        cluster["intra_node_latency_s"] = link.alpha_s
    return gpu, cluster


def compute_fields(compute: dict) -> dict[str, float]:
    """The profile's GPU fields that the measured compute rates set (peak_flops is the
    achieved GEMM rate, at efficiency 1.0)."""
    return {"peak_flops": compute["matmul"]["flops_per_s"],
            "attention_flops": compute["attention_flops_per_s"],
            "hbm_bandwidth_Bps": compute["elementwise_Bps"],
            "layer_overhead_s": compute.get("layer_overhead_s", 0.0),
            "kernel_launch_s": compute.get("kernel_launch_s", 0.0)}


def build_profile(device: dict, compute: dict, timings: Timings,
                  sync_waits: dict[int, dict[str, float]] | None = None,
                  scalar_calls: dict[int, dict[str, float]] | None = None,
                  sync_curves: dict[int, dict[str, list]] | None = None) -> dict:
    """The profile document.

    device: {"name", "type" ("cpu"/"cuda"), "memory_bytes", "cores" (CPU cores the ranks of
    this node share; 0 on GPUs), optionally "available_cores" (the cores our ranks got
    together when measured)}; compute: {"matmul": {"flops_per_s", ...},
    "attention_flops_per_s", "elementwise_Bps", ...} from paraxis.train.calibrate.kernels;
    sync_waits: {ranks on node: {group size: seconds}}, the wait after the longest segment;
    scalar_calls: the same shape, calibrate.collectives.scalar_calls; sync_curves:
    {ranks on node: {group size: [[segment_s, wait_s], ...]}}, collectives.sync_wait_curve.
    """
    link_gpu, link_cluster = link_fields(timings, sync_waits, scalar_calls, sync_curves)
    gpu = {
        "name": device["name"],
        **compute_fields(compute),
        "matmul_efficiency": 1.0,  # peak_flops is the achieved rate already
        "gemm_half_width": 0.0,  # ... at the model's own GEMM shapes
        "hbm_efficiency": 1.0,
        # a CPU rank holds back its process baseline (0 where it was not measured); a GPU
        # keeps the planner's CUDA-context reserve
        **({"reserved_bytes": device.get("baseline_bytes", 0.0)}
           if device.get("type") == "cpu" else {}),
        "memory_bytes": device["memory_bytes"],
        # paraxis runs one PyTorch kernel per elementwise op (no fused kernels)
        "kernels": "eager",
        "link_efficiency": 1.0,
    }
    gpu.update(link_gpu)
    ranks = max(timings) if timings else 1
    cluster: dict[str, object] = {"nodes": 1, "gpus_per_node": ranks,
                                  "cores_per_node": device.get("cores", 0),
                                  "available_cores": device.get("available_cores", 0.0),
                                  **link_cluster}
    return {"schema": SCHEMA, "gpu": gpu, "cluster": cluster,
            "calibration": {"device": device, "compute": compute,
                            "collectives": {str(n): t for n, t in sorted(timings.items())}}}
