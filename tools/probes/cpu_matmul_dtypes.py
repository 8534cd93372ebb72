"""Why a CPU run defaults to fp32: this machine's matmul rate in fp32, bf16 and fp16, one
thread, at two shapes of the tiny models' and a small transformer's GEMMs (GFLOP/s, the
median of 5 calls after one).

    python -m tools.probes.cpu_matmul_dtypes
"""

from __future__ import annotations

import statistics
import time

import torch

from paraxis.train.calibrate.measure import cpu_model_name

SHAPES = ((256, 256, 1024), (512, 1024, 1024))  # (m, k, n)


def gflops(m: int, k: int, n: int, dtype: torch.dtype) -> float:
    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    a @ b
    times = []
    for _ in range(5):
        started = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - started)
    return 2 * m * k * n / statistics.median(times) / 1e9


def main() -> None:
    torch.set_num_threads(1)
    print(f"{cpu_model_name()}, torch {torch.__version__}, one thread")
    for m, k, n in SHAPES:
        rates = {name: gflops(m, k, n, dtype) for name, dtype in
                 (("fp32", torch.float32), ("bf16", torch.bfloat16), ("fp16", torch.float16))}
        print(f"{m}x{k} @ {k}x{n}: " + ", ".join(f"{name} {rate:.3g} GFLOP/s" for name, rate
                                                   in rates.items())
              + f"; bf16 runs at {rates['bf16'] / rates['fp32']:.2g}x fp32's rate")


if __name__ == "__main__":
    main()
