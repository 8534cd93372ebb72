"""The planner's one-GPU step by part, beside a measured profile's kernels by class; and what
the held-out published runs say if the GPU's GEMM curve were its GEMMs' measured rates.

    python -m tools.probes.planner_parts --run 1 \
        --profile docs/gpu/h100-2026-11-26/gpu-sides-profile.json
    python -m tools.probes.planner_parts --heldout-gemm docs/gpu/gpu-shapes.json \
        [--hbm-efficiency 0.4]
    python -m tools.probes.planner_parts --gpu h200 --kernel-launch-us 24.8

The first prints, for one run of `bench.gpu` (GPT-2 124M at 8 x 1024: `--run 1`) and one
paraxis side (`--side`: compiled sides' elementwise ops fused; the eager side's priced op by
op, the final norm's and the loss's passes among them), the
milliseconds a step the planner gives its weight GEMMs (the LM head's with
them), the attention core, the elementwise passes and the optimizer, and the host's launch
time, beside the kernel time of the same classes in `tools.probes.gpu_sides_profile`'s
json (its 40 longest kernels a step, by name). The second fits the GEMM curve
(`GPU.matmul_efficiency` x w / (w + `GPU.gemm_half_width`), w the narrower side) to the
GEMMs `tools.probes.gpu_shapes` measured, gives the H100 and H200 presets that curve, and
prices docs/validation.md's held-out bf16 rows with it beside the presets as they are
(`--hbm-efficiency`: those presets' elementwise share of HBM bandwidth too), with
`bench.gpu`'s paraxis sides priced on them. The third prices those sides on `--gpu` with
its host seconds a kernel (`GPU.kernel_launch_s`) set as given. No GPU needed.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import statistics
from collections.abc import Iterator
from pathlib import Path

from bench import gpu
from paraxis.plan.compute import (
    BACKWARD_FLOPS_RATIO,
    head_forward_traffic_per_token_eager,
    layer_forward_flops_per_token,
    layer_forward_traffic_per_token,
    layer_forward_traffic_per_token_eager,
    layer_kernels,
)
from paraxis.plan.cost import evaluate
from paraxis.plan.hardware import build_cluster
from paraxis.plan.head import head_times
from paraxis.plan.layer_cost import _core_times, runtime_dropout
from paraxis.plan.rates import attention_kernel_rate, layer_rates, weight_gemm_seconds
from paraxis.spec.kernels import get_kernel
from paraxis.spec.layout import Layout
from tools.probes.gpu_profile import kernel_class

CLASSES = ("gemm", "attention", "elementwise", "optimizer")


def part_of(name: str) -> str:
    """The planner's part a CUDA kernel belongs to, by `gpu_profile.kernel_class` of its name
    (the loss's, the reductions' and the rest are elementwise passes)."""
    kind = kernel_class(name)
    return kind if kind in CLASSES else "elementwise"


def planned_parts(run: int, side: str, preset: str) -> dict[str, float]:
    """Milliseconds a step of each part, as `plan.cost` prices `side` of `bench.gpu`'s run."""
    name, batch, seq = gpu.FULL["runs"][run]
    cfg = gpu.model(name)
    kernels, precision = gpu.PLANNED[side]
    cluster = build_cluster(preset, 1, 1, {"kernels": kernels, "optimizer_kernel": "paraxis",
                                           "loss_kernel": "chunked"})
    tokens, layers = batch * seq, cfg.n_layers
    rate, attention_rate, hbm = layer_rates(cluster, 1)
    _, scores = layer_forward_flops_per_token(cfg, seq)
    hidden, score_bytes = (b * precision.activation_bytes / 2
                           for b in layer_forward_traffic_per_token(
                               cfg, seq, 1, False, True, runtime_dropout(cfg, cluster.gpu)))
    head_elementwise = 0.0  # the final norm's and the loss's passes, priced with the head
    if kernels == "eager":  # one kernel per op: the layer's count, and the head's
        hidden = precision.activation_bytes * layer_forward_traffic_per_token_eager(cfg)
        score_bytes = 0.0
        head_elementwise = (precision.activation_bytes * head_forward_traffic_per_token_eager(cfg)
                            / hbm * tokens)
    kernel = get_kernel(cluster.gpu.attention_kernel)
    fitted = attention_kernel_rate(cluster, kernel, seq, cfg.head_dim, 1, 1)
    core = sum(_core_times(scores, score_bytes, rate, attention_rate, hbm, False, kernel,
                           cluster.gpu.peak_flops, fitted))
    head = head_times(cfg, Layout(), cluster, batch, seq, precision=precision)
    step = evaluate(cfg, Layout(), cluster, seq, batch, precision)
    passes = 1 + BACKWARD_FLOPS_RATIO
    return {"gemm": 1e3 * (passes * weight_gemm_seconds(cfg, cluster, 1, rate) * tokens * layers
                           + head["forward"] + head["backward"] - passes * head_elementwise),
            "attention": 1e3 * core * tokens * layers,
            "elementwise": 1e3 * passes * (hidden / hbm * tokens * layers + head_elementwise),
            "optimizer": 1e3 * step.time["optimizer"],
            "host": 1e3 * layer_kernels(cfg, kernels) * cluster.gpu.kernel_launch_s * layers,
            "step": 1e3 * step.step_time_s}


def measured_parts(profile: Path, side: str) -> dict[str, float]:
    """Milliseconds a step of each class in a gpu_sides_profile json's side."""
    data = json.loads(profile.read_text())[side]
    parts = dict.fromkeys(CLASSES, 0.0)
    for name, _, ms in data["top"]:
        parts[part_of(name)] += ms
    return {**parts, "kernels": data["kernels"], "busy": data["busy_ms"], "step": data["wall_ms"]}


def fit_gemm_curve(shapes: Path) -> tuple[float, float]:
    """(efficiency, half width) of least squared log error over a gpu_shapes json's GEMMs,
    by a grid search (half widths 0-1000 by 5, the efficiency solved for each)."""
    data = json.loads(shapes.read_text())
    points = [(min(g["k"], g["n"]), g["flops_per_s"] / data["peak_flops"]) for g in data["gemms"]]

    def fitted(half: float) -> tuple[float, float, float]:
        logs = [math.log(e * (w + half) / w) for w, e in points]
        level = statistics.mean(logs)  # log efficiency that best fits this half width
        return sum((x - level) ** 2 for x in logs), math.exp(level), half

    _, efficiency, half = min(fitted(5.0 * i) for i in range(201))
    return efficiency, half


HOPPER = ("h100-sxm-80gb", "h100-pcie-80gb", "h200")


@contextlib.contextmanager
def presets_changed(names: tuple[str, ...], **changes: float) -> Iterator[None]:
    """The GPU presets `names` with `changes` to their fields, for the block's length."""
    import paraxis.plan.hardware as hardware

    presets = dict(hardware.GPUS)
    for name in names:
        hardware.GPUS[name] = dataclasses.replace(presets[name], **changes)
    try:
        yield
    finally:
        hardware.GPUS.update(presets)


def heldout_errors() -> dict[str, list[float]]:
    """The held-out bf16 rows' errors by GPU preset, on the presets as they are now."""
    from validation.heldout_runs import HELD_OUT
    from validation.validate_heldout import is_fp8, price

    errors: dict[str, list[float]] = {}
    for run in HELD_OUT:
        if is_fp8(run):
            continue
        result = price(run)
        if result.error is not None:
            errors.setdefault(run.gpu, []).append(result.error)
    return errors


def print_bench_sides(preset: str) -> None:
    """bench.gpu's paraxis sides (eager and compiled) as the planner prices them on
    `preset`, ms a step, for each of its runs."""
    for model_name, batch, seq in gpu.FULL["runs"]:
        steps = {side: estimate.step_time_s * 1e3 for side, estimate in
                 gpu.planned(gpu.model(model_name), batch, seq, preset).items()
                 if side in ("paraxis", "paraxis --compile")}
        print(f"  {model_name} {batch} x {seq} on {preset}: "
              + ", ".join(f"{side} {ms:.1f} ms" for side, ms in steps.items()))


def print_heldout(label: str, errors: dict[str, list[float]]) -> None:
    every = sorted(abs(e) for es in errors.values() for e in es)
    print(f"{label}: {len(every)} rows, mean |error| {statistics.mean(every):.1%}, 95th "
          f"percentile {every[int(0.95 * len(every)) - 1]:.1%}")
    for name, es in sorted(errors.items()):
        print(f"  {name}: {len(es)} rows, mean {statistics.mean(es):+.1%}, mean |error| "
              f"{statistics.mean(map(abs, es)):.1%}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", type=Path, help="a gpu_sides_profile json")
    parser.add_argument("--run", type=int, default=0, help="bench.gpu's run, from 0")
    parser.add_argument("--side", default="paraxis --compile", choices=list(gpu.PLANNED))
    parser.add_argument("--gpu", default="h100-sxm-80gb", help="the planner's GPU preset")
    parser.add_argument("--heldout-gemm", type=Path, metavar="SHAPES_JSON",
                        help="a gpu_shapes json whose GEMMs set the H100/H200 curve")
    parser.add_argument("--hbm-efficiency", type=float,
                        help="with --heldout-gemm: the H100/H200 elementwise share of HBM")
    parser.add_argument("--kernel-launch-us", type=float,
                        help="price bench.gpu's paraxis sides on --gpu with this host time")
    args = parser.parse_args(argv)
    if args.heldout_gemm:
        curve = fit_gemm_curve(args.heldout_gemm)
        print_heldout("as the presets are", heldout_errors())
        changes = {"matmul_efficiency": curve[0], "gemm_half_width": curve[1]}
        label = (f"with the GEMM curve of {args.heldout_gemm} (efficiency {curve[0]:.3f}, "
                 f"half width {curve[1]:g})")
        if args.hbm_efficiency is not None:
            changes["hbm_efficiency"] = args.hbm_efficiency
            label += f" and hbm_efficiency {args.hbm_efficiency:g}"
        with presets_changed(HOPPER, **changes):
            print_heldout(label, heldout_errors())
            for preset in ("h100-sxm-80gb", "h200"):
                print_bench_sides(preset)
        return
    if args.kernel_launch_us is not None:
        with presets_changed((args.gpu,), kernel_launch_s=args.kernel_launch_us * 1e-6):
            print_bench_sides(args.gpu)
        return
    name, batch, seq = gpu.FULL["runs"][args.run]
    planned = planned_parts(args.run, args.side, args.gpu)
    print(f"{name} {batch} x {seq}, {args.side}, ms a step: planner ({args.gpu})"
          + (f" | measured ({args.profile})" if args.profile else ""))
    measured = measured_parts(args.profile, args.side) if args.profile else {}
    for part in (*CLASSES, "host", "busy", "step"):
        mine = planned.get(part, sum(planned[c] for c in CLASSES) if part == "busy" else None)
        theirs = measured.get(part)
        print(f"  {part:12s} {mine:8.2f}" + (f" | {theirs:8.2f}" if theirs is not None else ""))


if __name__ == "__main__":
    main()
