"""How long `paraxis plan` takes to search 1024 GPUs (target: under 2 s).

    python -m tools.probes.bench_plan [--runs N]

Times the whole command (parse, search, explanation, JSON) as a user runs it, in a fresh
interpreter (its start and imports included: "command s", the least and the most of N runs,
3 by default: a shared VM's neighbours slow single runs by a third), and again in-process
once the imports and caches are warm ("warm s", the least of N), for three dense model sizes
and two mixtures of
experts, whose expert-parallel degrees and expert splits multiply the layouts a search
prices: Mixtral 8x7B at 4K tokens and at its own 32K context, Mixtral 8x22B at its own 64K
(`paraxis plan`'s default sequence length) and at 128K.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import subprocess
import sys
import time

from paraxis.cli import main

CASES = [  # (model, GPUs, global batch, sequence length[, GPU preset])
    ("llama2-70b", "1024", "2048", "4096"),
    ("llama3-405b", "1024", "2048", "8192"),
    ("gpt3-175b", "1024", "1536", "2048"),
    ("mixtral-8x7b", "1024", "1024", "4096"),
    ("mixtral-8x7b", "1024", "1024", "32768"),  # its own context, `paraxis plan`'s default
    ("mixtral-8x22b", "1024", "1024", "65536"),  # the largest preset, at its own context
    # ...and past it, as a long-context extension trains a rotary model (Llama 3.1: 8K ->
    # 128K): every CP degree up to 32 splits its sequences
    ("mixtral-8x22b", "1024", "2048", "131072"),
    ("mixtral-8x22b", "1024", "2048", "131072", "h100-sxm-80gb"),  # more of its layouts fit
]
TARGET_S = 2.0
GPU = "a100-80gb"  # a case's GPU preset unless it names one


def _argv(model: str, gpus: str, batch: str, seq: str, gpu: str = GPU) -> list[str]:
    return ["plan", "--model", model, "--gpus", gpus, "--global-batch", batch,
            "--seq-len", seq, "--gpu", gpu, "--json"]


def time_command(*case: str) -> float:
    """Seconds of `python -m paraxis plan ...` in a new interpreter."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "paraxis", *_argv(*case)], check=True,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def time_in_process(*case: str) -> float:
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        code = main(_argv(*case))
    if code != 0:
        raise SystemExit(f"paraxis {' '.join(_argv(*case))} exited {code}")
    return time.perf_counter() - start


def machine_speed() -> float:
    """Seconds this interpreter takes for a loop of 10**7 squares: how fast the machine runs
    Python, to compare figures from different machines by."""
    start = time.perf_counter()
    total = 0
    for i in range(10**7):
        total += i * i
    return time.perf_counter() - start


def main_bench(runs: int = 3) -> int:
    worst = 0.0
    print(f"a Python loop of 10**7 squares: {machine_speed():.2f} s")
    print(f"{'model':<14}{'GPU':>15}{'GPUs':>6}{'seq':>7}{'command s':>14}{'warm s':>9}")
    for case in CASES:
        commands = [time_command(*case) for _ in range(runs)]
        time_in_process(*case)  # imports and caches
        warm = min(time_in_process(*case) for _ in range(runs))
        worst = max(worst, min(commands))
        gpu = case[4] if len(case) > 4 else GPU
        command = f"{min(commands):.2f}-{max(commands):.2f}"
        print(f"{case[0]:<14}{gpu:>15}{case[1]:>6}{case[3]:>7}{command:>14}{warm:>9.2f}")
    verdict = "OK" if worst < TARGET_S else "TOO SLOW"
    print(f"slowest command (least of {runs}): {worst:.2f} s (target < {TARGET_S:.0f} s): "
          f"{verdict}")
    return 0 if worst < TARGET_S else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs of each case (least shown)")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error(f"--runs {args.runs} must be at least 1")
    raise SystemExit(main_bench(args.runs))
