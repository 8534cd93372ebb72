"""Data parallelism against its PyTorch peers, same model, batch and ranks (gloo, 2 ranks,
one thread each):

- paraxis DP (zero=0, bucketed overlapped all-reduce) vs torch DistributedDataParallel,
- paraxis ZeRO-3 vs FSDP2 `fully_shard` (per block, then the root),
- paraxis hybrid sharding (dp=4, dp_shard=2, ZeRO-3) vs FSDP2's HSDP: `fully_shard` on a
  2-D device mesh (2 replicas x 2 shards), 4 ranks: the shard groups are ranks (0, 1) and
  (2, 3) on both sides.

    python -m bench.bench_dp            # full size (the lead runs this on a quiet machine)
    python -m bench.bench_dp --quick    # smoke run
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

import torch
import torch.distributed as dist

from bench.common import Row, compare, engine_step, rank_device
from paraxis.dist.groups import build_groups
from paraxis.engine.data_parallel import DataParallelEngine
from paraxis.engine.optimizer import make_adamw
from paraxis.model.transformer import build_model
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import PRESETS
from paraxis.spec.optimizer import AdamW

RANKS = 2
HYBRID = Layout(dp=4, dp_shard=2, zero=3)  # 2 copies of shard groups of 2
LR, CLIP = 1e-3, 1.0


def _setting(quick: bool) -> dict:
    if quick:
        return {"model": "tiny", "batch_per_rank": 2, "seq": 64, "steps": 2, "warmup": 1,
                "repeats": 1}
    return {"model": "small", "batch_per_rank": 8, "seq": 256, "steps": 8, "warmup": 3,
            "repeats": 5}


def _data(s: dict) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(dist.get_rank())
    shape = (s["batch_per_rank"], s["seq"])
    x, y = torch.randint(0, 256, shape, generator=g), torch.randint(0, 256, shape, generator=g)
    return x.to(rank_device()), y.to(rank_device())


def _paraxis_body(s: dict, zero: int, layout: Layout | None = None
                  ) -> Callable[[], Callable[[], None]]:
    wanted = layout or Layout(dp=RANKS, zero=zero)

    def body() -> Callable[[], None]:
        engine = DataParallelEngine(build_model(PRESETS[s["model"]], seed=0,
                                                device=rank_device()), wanted,
                                    build_groups(wanted))
        x, y = _data(s)
        return engine_step(engine, x, y, LR, CLIP)
    return body


def _torch_body(s: dict, wrap: str) -> Callable[[], Callable[[], None]]:
    def body() -> Callable[[], None]:
        model = build_model(PRESETS[s["model"]], seed=0, device=rank_device())
        if wrap == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            device = rank_device()
            model = DistributedDataParallel(
                model, device_ids=[device.index] if device.type == "cuda" else None)
        else:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            mesh = None
            if wrap == "hsdp":  # (replicate, shard): FSDP2's hybrid sharding
                copies = HYBRID.replicas
                mesh = init_device_mesh(rank_device().type, (copies, HYBRID.shard_size),
                                        mesh_dim_names=("replicate", "shard"))
            for block in model.blocks:
                fully_shard(block, mesh=mesh)
            fully_shard(model, mesh=mesh)
        optimizer = make_adamw(model.parameters(), AdamW())
        x, y = _data(s)

        def step() -> None:
            for group in optimizer.param_groups:
                group["lr"] = LR
            model(x, y).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

        return step
    return body


def rows(quick: bool) -> list[Row]:
    s = _setting(quick)
    tokens = RANKS * s["batch_per_rank"] * s["seq"]
    return [
        compare(f"DP {s['model']}", RANKS, tokens, ("paraxis dp (zero=0)", _paraxis_body(s, 0)),
                ("torch DDP", _torch_body(s, "ddp")), steps=s["steps"], warmup=s["warmup"],
                repeats=s["repeats"]),
        compare(f"ZeRO-3 {s['model']}", RANKS, tokens, ("paraxis zero=3", _paraxis_body(s, 3)),
                ("torch FSDP2 fully_shard", _torch_body(s, "fsdp2")), steps=s["steps"],
                warmup=s["warmup"], repeats=s["repeats"]),
        compare(f"HSDP {s['model']}", HYBRID.dp, HYBRID.dp * s["batch_per_rank"] * s["seq"],
                (f"paraxis {HYBRID}", _paraxis_body(s, 3, HYBRID)),
                ("torch FSDP2 HSDP (2-D mesh)", _torch_body(s, "hsdp")), steps=s["steps"],
                warmup=s["warmup"], repeats=s["repeats"]),
    ]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    for row in rows(parser.parse_args().quick):
        print(json.dumps(row.to_dict()))
