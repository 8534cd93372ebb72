"""How long `paraxis plan` takes to search 1024 GPUs (target: under 2 s).

    python -m tools.probes.bench_plan

Times the whole command (parse, search, explanation, JSON) in-process, cold (first call, empty
schedule cache) and warm, for three dense model sizes and two mixtures of experts, whose
expert-parallel degrees and expert splits multiply the layouts a search prices.
"""

from __future__ import annotations

import contextlib
import io
import time

from paraxis.cli import main
from paraxis.plan.bubble import pipeline_figures

CASES = [
    ("llama2-70b", "1024", "2048", "4096"),
    ("llama3-405b", "1024", "2048", "8192"),
    ("gpt3-175b", "1024", "1536", "2048"),
    ("mixtral-8x7b", "1024", "1024", "4096"),
    ("mixtral-8x7b", "1024", "1024", "32768"),  # its own context, `paraxis plan`'s default
]
TARGET_S = 2.0


def time_plan(model: str, gpus: str, batch: str, seq: str) -> float:
    argv = ["plan", "--model", model, "--gpus", gpus, "--global-batch", batch,
            "--seq-len", seq, "--json"]
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    elapsed = time.perf_counter() - start
    if code != 0:
        raise SystemExit(f"paraxis {' '.join(argv)} exited {code}")
    return elapsed


def main_bench() -> int:
    worst = 0.0
    print(f"{'model':<14}{'GPUs':>6}{'seq':>7}{'cold s':>9}{'warm s':>9}")
    for case in CASES:
        pipeline_figures.cache_clear()
        cold = time_plan(*case)
        warm = time_plan(*case)
        worst = max(worst, cold)
        print(f"{case[0]:<14}{case[1]:>6}{case[3]:>7}{cold:>9.2f}{warm:>9.2f}")
    verdict = "OK" if worst < TARGET_S else "TOO SLOW"
    print(f"slowest cold plan: {worst:.2f} s (target < {TARGET_S:.0f} s): {verdict}")
    return 0 if worst < TARGET_S else 1


if __name__ == "__main__":
    raise SystemExit(main_bench())
