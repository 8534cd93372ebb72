"""The compiled GPT-2 124M step timed two ways, in one process whose compiler cache is warm.

    python -m tools.probes.compile_warm   # on a CUDA machine, after bench.gpu ran there

For "paraxis --compile" and "reference" at 16 x 1024 (bench.gpu's first run): each of the
first eight steps alone (the first compiles, or loads from the cache), then twice the median
of 20 steps each synchronised (bench.common.measure_steps, as bench.gpu times) beside 20
steps queued back to back, then the host's time to queue one step. On the H200 the compiled
paraxis step took 47.0 ms in bench.gpu's own run, its compiler cache cold, and 36.8 ms here;
the reference 34.1 and 33.8 (docs/gpu/README.md).
"""

from __future__ import annotations

import statistics
import time

import torch

from bench import gpu
from bench.common import measure_steps, token_batch


def main() -> None:
    torch.backends.cuda.matmul.allow_tf32 = True
    device = torch.device("cuda", 0)
    cfg = gpu.model("gpt2-124m")
    x, y = token_batch(cfg.vocab_size, 16, 1024, device)
    for side in ("paraxis --compile", "reference"):
        step = gpu.build_side(side, cfg, x, y, True, device)
        for i in range(8):
            started = time.perf_counter()
            step()
            torch.cuda.synchronize()
            print(side, "step", i, f"{(time.perf_counter() - started) * 1e3:.1f} ms")
        for _ in range(2):
            synced = measure_steps(step, 20, 0, device)["step_time_s"]
            started = time.perf_counter()
            for _ in range(20):
                step()
            torch.cuda.synchronize()
            queued = (time.perf_counter() - started) / 20
            print(f"{side}: synchronised median {synced * 1e3:.1f} ms, back to back "
                  f"{queued * 1e3:.1f} ms")
        host = []
        for _ in range(20):
            started = time.perf_counter()
            step()
            host.append(time.perf_counter() - started)
        torch.cuda.synchronize()
        print(f"{side}: host time to queue a step, median {statistics.median(host) * 1e3:.1f} "
              "ms")
        torch._dynamo.reset()


if __name__ == "__main__":
    main()
