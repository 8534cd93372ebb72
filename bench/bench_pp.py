"""paraxis pipeline schedules next to `torch.distributed.pipelining` (Schedule1F1B and
ScheduleGPipe): same model, same stage split, same stages and microbatches, gloo.

Both sides run the same stage parts (`Transformer` parts of `partition_layers`' split, with
the same weights), forward + backward over the microbatches, then AdamW(foreach=False). The
peer wraps each stage in `PipelineStage`; paraxis runs its own validated action lists.
Same compute, same order of forwards and backwards; the one difference is when receives are
posted: on gloo paraxis posts each irecv one communication point early (before the sends
there), so the message lands while the stage computes (`PipelineExecutor.recv_ahead`);
torch posts it when the stage is about to wait for it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from bench.common import Row, compare, engine_step, rank_device, token_batch
from paraxis.layout import Layout
from paraxis.model import build_model
from paraxis.model_config import PRESETS
from paraxis.pipeline_parallel.partition import partition_layers
from paraxis.runtime.distributed import build_groups
from paraxis.runtime.engine import make_adamw
from paraxis.runtime.parallelize import build_engine

MODEL = PRESETS["small-llama"].replace(n_layers=4)  # hidden 256, untied head
PP = 2
PEERS = {"1f1b": "Schedule1F1B", "gpipe": "ScheduleGPipe"}


def _paraxis(schedule: str, batch: int, seq: int, microbatches: int) -> Callable[[], None]:
    layout = Layout(pp=PP, microbatches=microbatches, schedule=schedule)
    engine = build_engine(MODEL, layout, build_groups(layout), rank_device(), seed=0)
    x, y = token_batch(MODEL.vocab_size, batch, seq)
    return engine_step(engine, x, y)


def _torch_pipelining(schedule: str, batch: int, seq: int, microbatches: int
                      ) -> Callable[[], None]:
    import torch.distributed as dist
    from torch.distributed import pipelining

    stage_index = dist.get_rank()
    split = partition_layers(MODEL, PP)
    module = build_model(MODEL, seed=0, device=rank_device(), blocks=split.blocks_of(stage_index),
                         embed=split.has_embedding(stage_index), head=split.has_head(stage_index))
    stage = pipelining.PipelineStage(module, stage_index, PP, rank_device())

    def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return module.loss_fn(logits, targets) if module.has_head else logits.sum()

    runner = getattr(pipelining, PEERS[schedule])(stage, microbatches, loss_fn=loss_fn)
    optimizer = make_adamw(module.parameters(), 0.1, (0.9, 0.95), 1e-8)
    for group in optimizer.param_groups:
        group["lr"] = 1e-3
    x, y = token_batch(MODEL.vocab_size, batch, seq)

    def step() -> None:
        if stage_index == 0:
            runner.step(x)
        else:
            runner.step(target=y, losses=[])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def rows(quick: bool = False) -> list[Row]:
    batch, seq, microbatches, steps = (4, 32, 4, 2) if quick else (16, 128, 8, 10)
    out = []
    for schedule in ("1f1b", "gpipe"):
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
