"""paraxis pipeline schedules next to `torch.distributed.pipelining`: same model, same stage
split, same stages and microbatches, gloo.

Pairs: 1f1b and gpipe with Schedule1F1B and ScheduleGPipe (one `PipelineStage` per rank);
zb-h1 with ScheduleInterleavedZeroBubble given one local stage (the ZB-H1 schedule of Qi et
al. 2023); zb-v with ScheduleZBVZeroBubble (two stages per rank in a V: rank s holds virtual
stages s and 2P-1-s, so rank 0 holds the embedding and the head/loss).

Both sides run the same stage parts (`Transformer` parts of `partition_layers`' split, with
the same weights; zb-v splits into 2P parts placed in a V), forward + backward over the
microbatches, then AdamW(foreach=False), and compute in the same order: paraxis's zb-h1 and
zb-v orders are PyTorch's action for action, its I (input gradient) being paraxis's B
(`_check_same_order` checks it on every run); on the chunk holding the embedding both leave
B empty and run the whole backward in W (token ids need no gradient). The one difference is
when receives are posted: on gloo paraxis posts each irecv one communication point early
(before the sends there), so the message lands while the stage computes
(`PipelineExecutor.recv_ahead`); torch posts it when the stage is about to wait for it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

# Imported here, once: the ranks are forked from this process, and the import (which brings
# torch's compiler stack) costs each rank seconds on this machine, per launch.
from torch.distributed import pipelining

from bench.common import Row, bench_device, compare, engine_step, rank_device, token_batch
from paraxis.dist.groups import build_groups
from paraxis.engine.optimizer import make_adamw
from paraxis.model.transformer import build_model
from paraxis.parallelize import build_engine
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import PRESETS
from paraxis.spec.optimizer import AdamW
from paraxis.spec.partition import partition_layers
from paraxis.spec.schedules import build_schedule

MODEL = PRESETS["small-llama"].replace(n_layers=4)  # hidden 256, untied head
PP = 2
PEERS = {"1f1b": "Schedule1F1B", "gpipe": "ScheduleGPipe",
         "zb-h1": "ScheduleInterleavedZeroBubble", "zb-v": "ScheduleZBVZeroBubble"}
CHUNKS = {"zb-v": 2}  # model chunks per stage (the others: one)
MULTI = ("zb-h1", "zb-v")  # peers built on a list of this rank's stages (PipelineScheduleMulti)


def peer_refused(schedule: str, device: str = "cpu") -> str | None:
    """Why the installed torch cannot run `schedule`'s peer on `device`'s backend (cpu:
    gloo), or None if it can."""
    if schedule == "zb-v" and device == "cpu" and torch.__version__ < "2.12":
        # Its start-up handshake sends each stage's neighbours a message, including the
        # neighbour on its own rank (the V puts virtual stages P-1 and P on rank P-1); gloo
        # has no pair from a rank to itself. torch 2.12 skips neighbours on the same rank.
        return (f"torch {torch.__version__}'s ScheduleZBVZeroBubble sends a start-up message "
                "from a rank to itself, which gloo refuses ('Pair is not connected'); "
                "torch 2.12 and later run it")
    return None


def _paraxis(schedule: str, batch: int, seq: int, microbatches: int) -> Callable[[], None]:
    layout = Layout(pp=PP, microbatches=microbatches, schedule=schedule)
    engine = build_engine(MODEL, layout, build_groups(layout), rank_device(), seed=0)
    x, y = token_batch(MODEL.vocab_size, batch, seq)
    return engine_step(engine, x, y)


def _torch_pipelining(schedule: str, batch: int, seq: int, microbatches: int
                      ) -> Callable[[], None]:
    rank, chunks = dist.get_rank(), CHUNKS.get(schedule, 1)
    split = partition_layers(MODEL, PP, chunks, placement="v" if schedule == "zb-v" else "loop")
    modules = [build_model(MODEL, seed=0, device=rank_device(), blocks=split.blocks_of(rank, c),
                           embed=split.has_embedding(rank, c), head=split.has_head(rank, c))
               for c in range(chunks)]
    stages = [pipelining.PipelineStage(module, split.index(rank, c), PP * chunks, rank_device())
              for c, module in enumerate(modules)]
    heads = [module for module in modules if module.has_head]

    def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # torch calls it only on the rank holding the last virtual stage (the head)
        return heads[0].loss_fn(logits, targets)

    peer = getattr(pipelining, PEERS[schedule])
    runner = peer(stages if schedule in MULTI else stages[0], microbatches, loss_fn=loss_fn)
    if schedule in MULTI:
        _check_same_order(runner.pipeline_order[rank], schedule, microbatches, rank)
    optimizer = make_adamw([p for module in modules for p in module.parameters()], AdamW())
    for group in optimizer.param_groups:
        group["lr"] = 1e-3
    x, y = token_batch(MODEL.vocab_size, batch, seq)
    # The rank with the embedding feeds the tokens, the one with the head the targets (in
    # zb-v's V, rank 0 does both).
    inputs = (x,) if any(module.has_embedding for module in modules) else ()

    def step() -> None:
        if heads:
            runner.step(*inputs, target=y, losses=[])
        else:
            runner.step(*inputs)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def _check_same_order(theirs: list, schedule: str, microbatches: int, rank: int) -> None:
    """A zero-bubble row compares two runtimes only if both run the same computes in the same
    order: PyTorch's compute actions on this rank against paraxis's (its I is our B)."""
    ours = build_schedule(schedule, PP, microbatches)
    mine = [(a.kind, a.microbatch, ours.virtual_stage(rank, a.chunk))
            for a in ours.compute_order(rank)]
    peer = [({"I": "B"}.get(a.computation_type.value, a.computation_type.value),
             a.microbatch_index, a.stage_index) for a in theirs if a is not None]
    if mine != peer:
        raise RuntimeError(f"{schedule} on stage {rank}: paraxis computes {mine}, "
                           f"{PEERS[schedule]} computes {peer}: the row would compare orders")


def rows(quick: bool = False) -> list[Row]:
    batch, seq, microbatches, steps = (4, 32, 4, 2) if quick else (16, 128, 8, 10)
    out = []
    for schedule in PEERS:
        if (why := peer_refused(schedule, bench_device(PP))) is not None:
            print(f"  pipeline {schedule}: not compared: {why}", flush=True)
            continue
        out.append(compare(
            f"pipeline pp={PP} {schedule} M={microbatches} ({MODEL.name}, 4 layers)", PP,
            batch * seq,
            (f"paraxis {schedule}",
             lambda s=schedule: _paraxis(s, batch, seq, microbatches)),
            (f"torch pipelining {PEERS[schedule]}",
             lambda s=schedule: _torch_pipelining(s, batch, seq, microbatches)),
            steps=steps, repeats=1 if quick else 6))
    return out


if __name__ == "__main__":
    for row in rows(quick=True):
        print(row.to_dict())
