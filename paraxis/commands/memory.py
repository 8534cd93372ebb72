"""`paraxis memory`: the course's ZeRO calculator, model-state bytes per GPU by stage."""

from __future__ import annotations

import argparse
import json

from paraxis.plan.explain import states_fit
from paraxis.plan.hardware import GPUS, unknown_gpu
from paraxis.plan.inputs import MAX_GPUS
from paraxis.plan.memory import zero_table
from paraxis.spec.errors import ParaxisError
from paraxis.spec.precision import PRECISIONS, Precision


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--params", type=float, required=True, help="parameter count, e.g. 7e9")
    parser.add_argument("--gpus", type=int, default=8, help="data-parallel GPUs (N)")
    parser.add_argument("--gpu", default="a100-80gb", help=f"one of {', '.join(GPUS)}")
    parser.add_argument("--precision", choices=PRECISIONS, default="mixed")
    parser.add_argument("--json", action="store_true")


def formulas(precision: Precision) -> list[str]:
    """The course's formulas (its Ch. 5) for this precision, P = parameters, N = GPUs."""
    p, g, o = (f"{x:g}" for x in (precision.param_bytes, precision.grad_bytes,
                                  precision.optimizer_bytes))
    total = f"{precision.total_bytes:g}"
    pg = f"{precision.param_bytes + precision.grad_bytes:g}"
    go = f"{precision.grad_bytes + precision.optimizer_bytes:g}"
    return [f"{total}P", f"{pg}P + {o}P/N", f"{p}P + {go}P/N", f"{total}P/N"]


def run(args: argparse.Namespace) -> int:
    if not args.params < 1e18:  # inf and nan too: 1e18 parameters is 1000x today's largest
        raise ParaxisError(f"--params {args.params:g} must be a number below 1e18")
    if args.params < 1:
        raise ParaxisError(f"--params {args.params:g} must be at least 1")
    if not 1 <= args.gpus <= MAX_GPUS:
        raise ParaxisError(f"--gpus {args.gpus:,}: give 1 to {MAX_GPUS:,} GPUs")
    precision = PRECISIONS[args.precision]
    if args.gpu not in GPUS:  # hardware.get_gpu's advice names plan's --hardware
        raise ParaxisError(unknown_gpu(args.gpu))
    gpu = GPUS[args.gpu]
    params = round(args.params)  # a count: 1.9 is 2 parameters, in the title and the rows
    rows = zero_table(params, args.gpus, precision)
    if args.json:
        print(json.dumps({"schema": "paraxis.memory/1", "params": params,
                          "gpus": args.gpus, "gpu": gpu.name,
                          "memory_bytes": gpu.memory_bytes,
                          "reserved_bytes": gpu.reserved_bytes,
                          "precision": {"param_bytes": precision.param_bytes,
                                        "grad_bytes": precision.grad_bytes,
                                        "optimizer_bytes": precision.optimizer_bytes},
                          "stages": [{**row, "formula": f,
                                      "fits": states_fit(row["total"], gpu)}
                                     for row, f in zip(rows, formulas(precision),
                                                       strict=True)]}, indent=2))
        return 0
    from paraxis.plan.tables import print_zero_table
    print_zero_table(params, args.gpus, rows, gpu, formulas(precision))
    return 0
