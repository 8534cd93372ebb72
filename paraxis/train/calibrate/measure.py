"""What `paraxis calibrate` measures and how: compute on one rank, every collective at every
message size on real ranks (gloo on CPU, NCCL on GPUs), the cores our ranks get, then the
fitted profile (`profile.build_profile`)."""

from __future__ import annotations

import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paraxis.files.host import host_ram_bytes, terminate_raises
from paraxis.files.model_file import load_model_config, model_directory
from paraxis.plan.comm import COLLECTIVES
from paraxis.plan.compute import layer_kernels
from paraxis.plan.sync_wait import sync_segment_s as planned_segment_s
from paraxis.spec.errors import ParaxisError, RunFailed
from paraxis.train.calibrate.baseline import process_baseline_bytes
from paraxis.train.calibrate.profile import build_profile, compute_fields

# Message sizes the collectives are timed at, latency- to bandwidth-bound, up to above the
# 25 MB gradient bucket (GPU.gradient_bucket_bytes), the largest message a ZeRO-0/1/2 run
# sends: a fit is only as good as the sizes it saw (fitted on sizes up to 4 MiB, gloo's
# all-reduce of a 26 MB bucket over 8 ranks on 2 cores came out at 22 ms, where
# docs/hardware-profile.json times 32 MiB at 134 ms).
DEFAULT_SIZES_KB = (16, 128, 1024, 4096, 32768)

if TYPE_CHECKING:
    import torch


def _device_type(requested: str) -> str:
    import torch  # lazy: torch; CLI start-up imports this

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested not in ("cpu", "cuda"):
        raise ParaxisError(f"--device {requested!r} is unknown; use auto, cpu or cuda")
    if requested == "cuda" and not torch.cuda.is_available():
        raise ParaxisError("--device cuda was asked for but no CUDA GPU is visible; use cpu")
    return requested


def _rank_device(device_type: str) -> torch.device:
    import torch  # lazy: torch; CLI start-up imports this

    if device_type == "cuda":  # device from the local rank
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def _dtype(device: torch.device) -> torch.dtype:
    import torch  # lazy: torch; CLI start-up imports this

    # What the runtime computes in: fp32 on CPU, bf16 autocast on GPUs.
    return torch.bfloat16 if device.type == "cuda" else torch.float32


# Times the compute probe runs; each figure is the median over them. One probe takes about
# 2 s on a CPU, and a shared machine has slow spells that long (four runs of `python -m
# bench --only predicted` within an hour on one 2-core VM calibrated GEMMs at 80 and 67
# GFLOP/s from one probe, then 95 and 84 from three, docs/planner.md); the median of three
# is what the machine does most of the time, what a training step meets.
COMPUTE_PROBES = 3
PROBE_FIGURES = ("attention_flops_per_s", "elementwise_Bps", "layer_overhead_s",
                 "kernel_launch_s")


def compute_body(model: str, tokens: int, seq_len: int, repeats: int, device_type: str,
                 probes: int = COMPUTE_PROBES) -> dict:
    """Runs on one rank: the achieved GEMM, attention and elementwise rates, each the
    median over `probes` back-to-back probes (`median_probe`)."""
    return median_probe([_compute_probe(model, tokens, seq_len, repeats, device_type)
                         for _ in range(probes)])


def median_probe(results: list[dict]) -> dict:
    """One probe's document with each rate the median over `results`: the GEMMs as the
    probe whose total GEMM rate is the median (its per-shape rates with it), the attention,
    elementwise and dispatch figures each their own median; every probe's rates kept
    under "probes" for the record."""
    def rate(result: dict) -> float:
        return result["matmul"]["flops_per_s"]

    middle = sorted(results, key=rate)[len(results) // 2]
    figures = PROBE_FIGURES
    merged = {**middle, **{key: statistics.median(r[key] for r in results) for key in figures}}
    merged["probes"] = [{"matmul_flops_per_s": rate(r), **{key: r[key] for key in figures}}
                        for r in results]
    return merged


def _compute_probe(model: str, tokens: int, seq_len: int, repeats: int, device_type: str
                   ) -> dict:
    """The achieved GEMM, attention and elementwise rates, measured once."""
    from paraxis.train.calibrate.kernels import (  # lazy: torch; CLI start-up imports this
        attention_rate,
        elementwise_bandwidth,
        gemm_shapes,
        layer_overhead,
        matmul_rate,
    )

    cfg = load_model_config(model)
    device = _rank_device(device_type)
    dtype = _dtype(device)
    # Whole-batch GEMMs and the small ones of a pipeline microbatch.
    shapes = gemm_shapes(cfg, tokens) + gemm_shapes(cfg, max(1, tokens // 8))
    matmul = matmul_rate(shapes, device, dtype, repeats)
    attention = attention_rate(max(1, tokens // seq_len), cfg.n_heads, seq_len, cfg.head_dim,
                               device, dtype, max(2, repeats // 2))
    elementwise = elementwise_bandwidth(cfg, max(1, tokens // seq_len), seq_len, device,
                                        dtype, repeats)
    # Per-op dispatch, timed on one token, where the kernels are nothing. On a CPU rank it is
    # the rank's own time, paid per layer (GPU.layer_overhead_s). On a GPU the host issues the
    # kernels ahead of the device: a layer takes the longer of its kernels' time and its
    # launches, priced as its kernels (compute.layer_kernels) x the host's seconds a kernel
    # (GPU.kernel_launch_s); this host's figure is the block's time over its eager count, so
    # the planner's eager layer costs the host what the block took here. Lent GPU hosts
    # differ by half in it (docs/gpu/README.md, "The fifth H200 run").
    overhead = layer_overhead(cfg, device, dtype, repeats)
    launch = 0.0
    if device.type == "cuda":
        launch, overhead = overhead / layer_kernels(cfg, "eager"), 0.0
    return {"matmul": matmul, "attention_flops_per_s": attention,
            "elementwise_Bps": elementwise, "layer_overhead_s": overhead,
            "kernel_launch_s": launch,
            "dtype": str(dtype).removeprefix("torch."),
            # the --model text (a path where it is one) and what it holds, for a re-timing and
            # for knowing the model again (`quick.matches`)
            "shapes_from": {"model": _model_text(model), "shape": cfg.shape_key(),
                            "tokens": tokens, "seq_len": seq_len}}


def _model_text(model: str) -> str:
    """--model as a later process reads it again: a preset's name, a path made absolute."""
    held = Path(model).is_file() or model_directory(model) is not None
    return str(Path(model).resolve()) if held else model


def on_ranks(what: str, fn: Callable[..., Any], ranks: int, args: tuple,
             timeout_s: float = 300.0, device: str = "cpu") -> list[Any]:
    """`fn(*args)` on `ranks` ranks of this machine (dist.testing.run_distributed), for one
    part of a calibration named `what`. A rank that fails (the network, memory, the time
    limit) is one line naming the part and the rank's last words, not a traceback; SIGTERM
    stops the ranks with the command instead of leaving them running."""
    from paraxis.dist.testing import (  # lazy: torch; CLI start-up imports this
        RankFailed,
        run_distributed,
    )

    try:
        with terminate_raises():
            return run_distributed(fn, ranks, args, timeout_s=timeout_s, device=device)
    except RankFailed as failure:
        said = [line.strip() for line in str(failure).splitlines() if line.strip()]
        raise RunFailed(f"the calibration's {what} on {ranks} rank(s) failed: "
                        f"{said[-1][:200] if said else 'no message'}; free memory or fix the "
                        "network (GLOO_SOCKET_IFNAME), then run it again") from None


def compute_rates(model: str, tokens: int, seq_len: int, repeats: int) -> dict[str, float]:
    """The compute rates a CPU calibration measures (`compute_body`, one rank), timed again
    now, as the profile's GPU fields (profile.compute_fields): a shared VM's cores change
    speed between a calibration and a run, which is priced at the speed it ran at."""
    args = (model, tokens, seq_len, repeats, "cpu")
    return compute_fields(on_ranks("compute probe", compute_body, 1, args)[0])


def collectives_again(profile: dict, ranks: int, repeats: int) -> dict:
    """The collectives (and sync waits) a CPU calibration timed on `ranks` ranks, timed again
    now at the same message sizes and compute segment: `collective_body`'s {"times",
    "sync_wait_s", "sync_wait_curve_s", "scalar_call_s"}. Gloo between ranks that outnumber
    the cores times a pair's call differently from one minute to the next, and a tiny
    model's step pays it on every TP call."""
    calibration = profile["calibration"]
    timed = calibration["collectives"][str(ranks)]["all_reduce"]
    # the largest group's message sizes are whole shards for every group
    sizes = [int(size) for size, _ in timed[str(max(map(int, timed)))]]
    shapes = calibration["compute"]["shapes_from"]
    rate = calibration["compute"]["matmul"]["flops_per_s"]
    segment = sync_segment_s(shapes["model"], shapes["tokens"], rate)
    return on_ranks("collectives", collective_body, ranks,
                    (sizes, repeats, "cpu", segment, rate))[0]


def collective_body(sizes_bytes: list[int], repeats: int, device_type: str,
                    segment_s: float = 0.0, flops_per_s: float = 0.0) -> dict:
    """Runs on every rank: every collective at every size, over groups of every size that
    divides the world (all groups at once); on CPU ranks (`segment_s` > 0) also what a
    synchronising call costs after compute segments up to `segment_s` (`sync_wait_curve`;
    "sync_wait_s": the wait after `segment_s`) and a one-element all-reduce back to back
    (`scalar_calls`)."""
    import torch.distributed as dist  # lazy: torch; CLI start-up imports this

    from paraxis.train.calibrate.collectives import (  # lazy: torch; CLI start-up imports this
        collective_times,
        scalar_calls,
        sync_wait_curve,
    )

    device = _rank_device(device_type)
    world = dist.get_world_size()
    groups = [n for n in range(2, world + 1) if world % n == 0]
    slowest: dict = {}
    times = collective_times(COLLECTIVES, sizes_bytes, groups, device, _dtype(device), repeats,
                             slowest=slowest)
    curves = sync_wait_curve(segment_s, flops_per_s, groups, device) if segment_s > 0 else {}
    calls = scalar_calls(groups, device, repeats) if segment_s > 0 else {}
    return {"times": times, "times_slowest": slowest, "scalar_call_s": calls,
            "sync_wait_s": {n: curve[-1][1] for n, curve in curves.items()},
            "sync_wait_curve_s": curves}


def sync_segment_s(model: str, tokens: int, flops_per_s: float) -> float:
    """The longest compute between two synchronising calls that `sync_wait_curve` times:
    half a layer's forward GEMMs at `tokens`, at the measured rate (plan/sync_wait.py)."""
    return planned_segment_s(load_model_config(model), tokens, flops_per_s)


def busy_body(seconds: float) -> float:
    """Runs on every rank, one per core: the share of a core this rank got."""
    from paraxis.train.calibrate.kernels import busy_share  # lazy: torch; CLI start-up imports this

    return busy_share(seconds)


def cpu_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        (os.cpu_count() or 1)


def cpu_model_name() -> str:
    """This machine's CPU model, e.g. "AMD EPYC" (from /proc/cpuinfo where there is one)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def available_cores(cores: int | None = None, busy_s: float = 2.0,
                    ranks: int | None = None) -> float:
    """How many cores our ranks get now: `ranks` busy ranks (default one per core) for
    `busy_s`, the CPU time they got over the wall time, summed, at most `cores`. Fewer than
    the machine has where other sessions use it (Cluster.available_cores). Where the other
    load shares our session's scheduling group, more ranks get more of the machine: a run
    of N ranks is best probed with N."""
    cores = cores or cpu_cores()
    shares = on_ranks("core probe", busy_body, ranks or cores, (busy_s,),
                      timeout_s=60 + 2 * busy_s)
    return min(float(cores), sum(shares))


def _device_description(device_type: str, max_ranks: int) -> dict:
    if device_type == "cuda":
        import torch  # lazy: torch; CLI start-up imports this

        props = torch.cuda.get_device_properties(0)
        return {"type": "cuda", "name": props.name, "model": props.name,
                "memory_bytes": float(props.total_memory), "cores": 0}
    model = cpu_model_name()
    cores = cpu_cores()
    ram = host_ram_bytes()
    # A "device" is one core running one rank; the ranks share the RAM, so each may count
    # on its share of it at the largest rank count calibrated.
    return {"type": "cpu", "name": "cpu-core", "model": model, "cores": cores or 1,
            "memory_bytes": float(ram) / max(1, max_ranks)}


def calibrate(nproc: list[int], sizes_bytes: list[int], model: str = "small-llama",
              tokens: int = 2048, seq_len: int = 128, repeats: int = 5,
              device: str = "auto", busy_s: float = 2.0,
              log: Callable[[str], object] = print,
              busy_ranks: int | None = None) -> dict:
    """Measure and return the profile document (paraxis.train.calibrate.profile). `busy_ranks`:
    how many ranks probe the cores our ranks get (default one per core)."""

    device_type = _device_type(device)
    if device_type == "cuda":
        import torch  # lazy: torch; CLI start-up imports this

        gpus = torch.cuda.device_count()
        if max(nproc) > gpus:
            raise ParaxisError(f"--nproc {max(nproc)} is more than the {gpus} GPU(s) here; "
                               f"give rank counts up to {gpus}")
    started = time.perf_counter()
    compute = on_ranks("compute probe", compute_body, 1,
                       (model, tokens, seq_len, repeats, device_type), device=device_type)[0]
    log(f"compute: matmul {compute['matmul']['flops_per_s'] / 1e9:,.1f} GFLOP/s, attention "
        f"{compute['attention_flops_per_s'] / 1e9:,.1f} GFLOP/s, elementwise "
        f"{compute['elementwise_Bps'] / 1e9:,.1f} GB/s, dispatch "
        + (f"{compute['kernel_launch_s'] * 1e6:,.1f} us per kernel on the host"
           if device_type == "cuda" else f"{compute['layer_overhead_s'] * 1e6:,.0f} us per layer")
        + f" ({compute['dtype']}, one rank)")
    timings, slowest, waits, calls, curves = {}, {}, {}, {}, {}
    rate = compute["matmul"]["flops_per_s"]
    segment = sync_segment_s(model, tokens, rate) if device_type == "cpu" else 0.0
    for n in sorted(set(nproc)):
        if n < 2:
            continue
        measured = on_ranks("collectives", collective_body, n,
                            (sizes_bytes, repeats, device_type, segment, rate),
                            device=device_type)[0]
        timings[n], slowest[n] = measured["times"], measured["times_slowest"]
        if segment:
            waits[n], calls[n] = measured["sync_wait_s"], measured["scalar_call_s"]
            curves[n] = measured["sync_wait_curve_s"]
            for size, curve in curves[n].items():
                log(f"sync: groups of {size} in {n} ranks, a call after " + ", ".join(
                    f"{c * 1e3:.1f}" for c, _ in curve) + " ms of compute waits " + ", ".join(
                    f"{w * 1e3:.2f}" for _, w in curve) + " ms beyond its idle time")
    device_info = _device_description(device_type, max(nproc))
    if device_type == "cpu":
        device_info["available_cores"] = available_cores(device_info["cores"], busy_s,
                                                         busy_ranks)
        log(f"cores: {device_info['cores']}, {device_info['available_cores']:.2f} available "
            f"to our ranks (one busy rank per core for {busy_s:g} s)")
        device_info["baseline_bytes"] = float(process_baseline_bytes())
        log(f"a rank's baseline memory (interpreter, torch, gloo): "
            f"{device_info['baseline_bytes'] / 2**20:,.0f} MiB")
    profile = build_profile(device_info, compute, timings, waits, calls, curves)
    # the world's slowest rank's times beside the mean's (`_seconds_per_call`; the bench
    # prices both)
    profile["calibration"]["collectives_slowest"] = {str(n): t for n, t in slowest.items()}
    for op, by_world in profile["cluster"]["collectives"].items():
        for world, by_group in by_world.items():
            for n, fit in by_group.items():
                log(f"{op:>15} groups of {n} in {world} ranks: alpha "
                    f"{fit['alpha_s'] * 1e6:8.1f} us/step, bandwidth "
                    f"{fit['bandwidth_Bps'] / 1e9:6.2f} GB/s (fit within "
                    f"{fit['max_rel_error']:.0%})")
    profile["calibration"]["seconds"] = time.perf_counter() - started
    profile["calibration"]["date"] = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    profile["calibration"]["load_average"] = list(os.getloadavg())
    return profile
