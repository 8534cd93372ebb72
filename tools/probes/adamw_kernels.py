"""torch's fused AdamW against its foreach one, on this machine's CPU (what
`paraxis.engine.optimizer.adamw` chose): milliseconds per step over 25M fp32 parameters in
six matrices and six vectors, one thread, median of 10 steps after one.

    python -m tools.probes.adamw_kernels
"""

from __future__ import annotations

import statistics
import time

import torch


def step_ms(kind: str) -> float:
    torch.manual_seed(0)
    params = [torch.randn(4096, 1024) for _ in range(6)] + [torch.randn(1024) for _ in range(6)]
    params = [torch.nn.Parameter(p) for p in params]
    for p in params:
        p.grad = torch.randn_like(p)
    optimizer = torch.optim.AdamW([{"params": params[:6], "weight_decay": 0.1},
                                   {"params": params[6:], "weight_decay": 0.0}], lr=1e-3,
                                  betas=(0.9, 0.95), eps=1e-8, **{kind: True})
    optimizer.step()
    times = []
    for _ in range(10):
        started = time.perf_counter()
        optimizer.step()
        times.append(time.perf_counter() - started)
    return 1e3 * statistics.median(times)


if __name__ == "__main__":
    torch.set_num_threads(1)
    fused, foreach = step_ms("fused"), step_ms("foreach")
    print(f"AdamW over 25M fp32 parameters, one thread: fused {fused:.1f} ms, foreach "
          f"{foreach:.1f} ms ({foreach / fused:.1f}x)")
