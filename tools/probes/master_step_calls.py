"""The host's time for the fp32 masters' compiled AdamW step (`kernels/master_adamw.py`), by
how many units a call steps.

    python -m tools.probes.master_step_calls [--units N] [--steps S]

On a GPU every unit's update is one generated kernel, and what the host spends on a step is
the compiled calls' own cost (dynamo's guards, AOT's and inductor's wrappers) before their
kernels: tiny units on a CPU show it, their kernels' work a few microseconds. Prints the
microseconds a step of `--units` units takes as the engine steps them (`MASTER_UNITS_A_CALL` to a
call), and a call's share, after the compiles, one thread.
"""

from __future__ import annotations

import argparse
import time

import torch

from paraxis.kernels.master_adamw import master_adamw_
from paraxis.spec.precision import MASTER_UNITS_A_CALL


def _units(count: int) -> list[list]:
    """`count` units of a few hundred elements, masters, moments, bf16 weights and
    gradients, half of each decayed."""
    units = []
    for index in range(count):
        n = 64 + 32 * index
        units.append([torch.zeros(n), torch.zeros(n), torch.zeros(n),
                      torch.zeros(n, dtype=torch.bfloat16), torch.ones(n, dtype=torch.bfloat16),
                      n // 2])
    return [list(each) for each in zip(*units, strict=True)]


def microseconds(units: list[list], steps: int) -> float:
    lr, step, grad_scale, found_inf = (torch.full((), value) for value in (1e-3, 1.0, 1.0, 0.0))

    def run() -> None:
        master_adamw_(*units, lr, 0.9, 0.95, 1e-8, 0.1, step, grad_scale, found_inf,
                      compiled=True)

    for _ in range(10):  # the compiles, then warm
        run()
    started = time.perf_counter()
    for _ in range(steps):
        run()
    return (time.perf_counter() - started) / steps * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=8, help="8: GPT-2 124M's units")
    parser.add_argument("--steps", type=int, default=500)
    args = parser.parse_args()
    if args.units < 1 or args.steps < 1:
        parser.error("--units and --steps: give at least 1")
    torch.set_num_threads(1)
    step = microseconds(_units(args.units), args.steps)
    calls = -(-args.units // MASTER_UNITS_A_CALL)
    print(f"{args.units} units, {calls} calls: {step:.1f} us a step, {step / calls:.1f} a call")


if __name__ == "__main__":
    main()
