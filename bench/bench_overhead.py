"""paraxis at dp=tp=pp=1 next to a plain PyTorch training loop: the cost of the framework.

paraxis's side is the engine `paraxis train` builds for one device (`build_engine`): the
data-parallel engine over a group of one, so this row also shows that dp = 1 costs nothing
measurable."""

from __future__ import annotations

from collections.abc import Callable

import torch

from bench.common import Row, compare, engine_step, rank_device, token_batch
from paraxis.dist.groups import build_groups
from paraxis.model.transformer import build_model
from paraxis.parallelize import build_engine
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import PRESETS

MODEL = PRESETS["small"].replace(n_layers=4)  # the 4-block, hidden-256 GPT


def _paraxis(batch: int, seq: int) -> Callable[[], None]:
    layout = Layout()
    engine = build_engine(MODEL, layout, build_groups(layout), rank_device(), seed=0)
    x, y = token_batch(MODEL.vocab_size, batch, seq)
    return engine_step(engine, x, y, clip=1.0)


def _plain(batch: int, seq: int) -> Callable[[], None]:
    model = build_model(MODEL, device=rank_device())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1, fused=True)
    x, y = token_batch(MODEL.vocab_size, batch, seq)

    def step() -> None:
        loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def rows(quick: bool = False) -> list[Row]:
    batch, seq, steps = (2, 32, 2) if quick else (8, 256, 10)
    return [compare("overhead: paraxis dp=tp=pp=1 vs plain loop", 1, batch * seq,
                    ("paraxis engine (dp=1)", lambda: _paraxis(batch, seq)),
                    ("plain PyTorch loop", lambda: _plain(batch, seq)),
                    steps=steps, repeats=1 if quick else 6)]
