"""The two measurements behind paraxis's CPU memory choices: `python -m tools.probes.memory_probes`.

1. gloo's collectives (`engine/data_parallel/flat.py`, `parallel/context/all_gather.py`): on 4
   ranks and a 16 MB buffer, the tensor bytes each allocates beyond its buffers
   (`TensorBytes`) and its time: reduce_scatter, all_gather and all_to_all against an
   in-place all_reduce, and paraxis's own reduce-scatter on gloo (`reduce_scatter_into`:
   the all-to-all and its owner's sum); `--only collectives`: this part alone.
2. glibc's mmap threshold (`dist/host_memory.py`): one step of dp=8 ZeRO-3 on 6 of the 24
   layers of the 0.8B model of bench/scale.py, a rank's resident peak with the threshold left
   to move and pinned at 1 MiB, next to the rank's peak of counted tensor bytes.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist

from bench.scale import MODEL
from paraxis.dist.collectives import (
    all_gather_single,
    reduce_scatter_into,
    reduce_scatter_single,
)
from paraxis.dist.host_memory import return_freed_memory
from paraxis.dist.tensor_memory import TensorBytes
from paraxis.dist.testing import RankContext, run_on_ranks
from paraxis.parallelize import build_engine

NUMEL = 4_000_000  # 16 MB of fp32


def _collectives(ctx: RankContext) -> dict[str, tuple[float, float]]:
    world = dist.get_world_size()
    full, shard, flat = torch.zeros(NUMEL), torch.zeros(NUMEL // world), torch.ones(NUMEL)
    calls = {"reduce_scatter_single": lambda: reduce_scatter_single(shard, flat),
             "all_gather_single": lambda: all_gather_single(full, shard),
             "all_to_all_single": lambda: dist.all_to_all_single(full, flat),
             "reduce_scatter_into": lambda: reduce_scatter_into(shard, flat),
             "all_reduce (in place)": lambda: dist.all_reduce(flat)}
    out = {}
    for name, call in calls.items():
        with TensorBytes() as meter:
            call()
        started = time.perf_counter()
        for _ in range(5):
            call()
        out[name] = (meter.peak / (4 * NUMEL), (time.perf_counter() - started) / 5)
    return out


def _one_step(ctx: RankContext, pin: bool) -> tuple[int, int]:
    torch.set_num_threads(1)
    if pin:
        return_freed_memory()
    cfg = MODEL.replace(n_layers=6)
    idx = torch.randint(0, 256, (1, 129), generator=torch.Generator().manual_seed(0))
    with TensorBytes() as meter:
        engine = build_engine(cfg, ctx.layout, ctx.groups, "cpu", seed=0)
        engine.forward_backward(idx[:, :-1], idx[:, 1:])
        engine.optimizer_step(1e-4)
    with open("/proc/self/status") as status:
        peak = next(int(line.split()[1]) for line in status if line.startswith("VmHWM"))
    return peak * 1024, meter.peak


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["collectives"], help="the first measurement alone")
    args = parser.parse_args(argv)
    print("gloo, 4 ranks, 16 MB: temporary (x the buffer), time")
    for name, (temporary, seconds) in run_on_ranks(4, _collectives)[0].items():
        print(f"  {name:>22}: {temporary:.2f}x, {seconds * 1e3:.0f} ms")
    if args.only:
        return
    print("dp=8 ZeRO-3, 6 layers of the 0.8B model, one step: largest rank's resident peak "
          "(and counted tensors)")
    for pin in (False, True):
        peaks = run_on_ranks("dp=8,zero=3", _one_step, pin, timeout_s=900)
        resident, tensors = max(peaks)
        print(f"  mmap threshold {'pinned at 1 MiB' if pin else 'left to move'}: "
              f"{resident / 2**20:,.0f} MiB ({tensors / 2**20:,.0f} MiB of tensors)")


if __name__ == "__main__":
    main()
