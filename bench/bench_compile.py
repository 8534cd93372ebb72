"""`--compile` next to eager paraxis: the same engine, each block's forward compiled.

Four layouts: dp=2 ZeRO-3 (parameters gathered in hooks around the compiled forward), tp=2
with sequence parallelism (collectives eager between compiled pieces), pp=2 1F1B, and cp=2
(context-parallel attention's exchanges inside the compiled block). Before timing, each
layout checks that compiled losses equal eager ones to fp32 rounding (relative 1e-5 over
three steps and a held-out batch); the suite tests two of them (tests/test_precision.py),
this the others and the speed. Compiling costs tens of seconds per rank the first time here
(torch inductor's cache shortens later runs); that cost is outside the timed steps.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from bench.common import Row, compare, engine_step, rank_device, token_batch
from paraxis.dist.groups import build_groups
from paraxis.dist.testing import run_distributed
from paraxis.engine.contract import Engine
from paraxis.parallel.context.chunks import local_part
from paraxis.parallelize import build_engine
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import PRESETS
from paraxis.spec.runtime_options import RuntimeOptions

MODEL = PRESETS["small"].replace(n_layers=4)  # the 4-block, hidden-256 GPT
LAYOUTS = ("dp=2,zero=3", "tp=2,sp=true", "pp=2,microbatches=4,schedule=1f1b", "cp=2")


def _engine_and_batch(layout: Layout, compile: bool, batch: int, seq: int
                      ) -> tuple[Engine, torch.Tensor, torch.Tensor]:
    """The engine and this rank's batch: its dp share, and under cp its two chunks of every
    sequence (the engine takes each rank's local sequence, as the data loader gives it)."""
    groups = build_groups(layout)
    engine = build_engine(MODEL, layout, groups, rank_device(), seed=0,
                          options=RuntimeOptions(compile=compile))
    x, y = token_batch(MODEL.vocab_size, batch // layout.dp, seq)
    if layout.cp > 1:
        x, y = (local_part(t, groups.cp_rank, layout.cp, dim=1) for t in (x, y))
    return engine, x, y


def _setup(layout: Layout, compile: bool, batch: int, seq: int) -> Callable[[], None]:
    engine, x, y = _engine_and_batch(layout, compile, batch, seq)
    return engine_step(engine, x, y, clip=1.0)


def _losses(layout: Layout, compile: bool, batch: int, seq: int) -> list[float]:
    engine, x, y = _engine_and_batch(layout, compile, batch, seq)
    out = []
    for _ in range(3):
        out.append(engine.forward_backward(x, y))
        out.append(engine.clip_grad_norm(1.0))
        engine.optimizer_step(1e-3)
        engine.zero_grad()
    out.append(engine.evaluate(x, y))
    return out


def largest_difference(layout: Layout, batch: int, seq: int) -> float:
    """Largest relative difference, compiled against eager, of the losses and norms."""
    def body() -> float:
        eager, compiled = (_losses(layout, c, batch, seq) for c in (False, True))
        return max(abs(a - b) / abs(a) for a, b in zip(eager, compiled, strict=True))

    return max(run_distributed(body, layout.world_size, timeout_s=900))


def rows(quick: bool = False) -> list[Row]:
    batch, seq, steps = (4, 32, 2) if quick else (8, 256, 10)
    out = []
    for text in LAYOUTS:
        layout = Layout.parse(text)
        diff = largest_difference(layout, batch, seq)
        if not math.isfinite(diff) or diff > 1e-5:
            raise AssertionError(f"--compile at {text} differs from eager by {diff:.2e}")
        out.append(compare(f"--compile vs eager, {text} (losses within {diff:.0e})",
                           layout.world_size, batch * seq,
                           ("paraxis --compile", lambda lay=layout: _setup(lay, True, batch,
                                                                             seq)),
                           ("paraxis eager", lambda lay=layout: _setup(lay, False, batch, seq)),
                           steps=steps, repeats=1 if quick else 3))
    return out
