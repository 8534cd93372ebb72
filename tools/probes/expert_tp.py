"""Experts split over tp (etp = tp) against experts whole on every tp rank (etp = 1), which
under SP with dropless routing run each rank's own sequence shard (`WholeExperts`).

    PYTHONPATH=. python -m tools.probes.expert_tp          # the table in docs/experts.md
    PYTHONPATH=. python -m tools.probes.expert_tp --quick  # smoke (tests/test_bench_smoke.py)

Same work in both columns: one training step (forward, backward, AdamW) of a mixture of
experts whose feed-forward work is mostly its experts', at tp=2 with sequence parallelism
(fp32, gloo, one thread a rank), the steps of the two layouts alternating in the same
processes (`bench.common.compare`); "speed" is etp=1's time over etp=2's, with its 95%
bootstrap interval. Beside it, the planner's figure for the same ratio on this machine's
calibrated profile (docs/hardware-profile.json; `paraxis calibrate` writes one): its
predicted step times, etp=1's over etp=2's. Before either, one step of each is checked
against the other: the same loss within 1e-5 (tests/test_expert_tp.py checks 6 steps
against one device).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from bench.common import Row, compare, engine_step, quick_flag, token_batch
from paraxis.dist.groups import build_groups
from paraxis.dist.testing import run_distributed
from paraxis.parallelize import build_engine
from paraxis.plan.cost import evaluate
from paraxis.plan.hardware import build_cluster, load_hardware_file
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import PRESETS, ModelConfig
from paraxis.spec.precision import FP32_ADAM

PROFILE = Path(__file__).resolve().parents[2] / "docs" / "hardware-profile.json"
# 8 experts of width 1024 (4x d_model), top 2: the experts are most of each block's FLOPs
MODEL = PRESETS["tiny-moe"].replace(name="bench-moe", d_model=256, n_heads=8, n_kv_heads=4,
                                    d_ff=1024, d_ff_expert=1024, max_seq_len=512)
QUICK = PRESETS["tiny-moe"]
BATCH = 4


def _setup(cfg: ModelConfig, layout: Layout, seq: int) -> Callable[[], None]:
    """One training step of `layout` (tp only: every rank takes the whole batch)."""
    engine = build_engine(cfg, layout, build_groups(layout), "cpu", seed=0)
    return engine_step(engine, *token_batch(cfg.vocab_size, BATCH, seq, torch.device("cpu")))


def _losses_on_a_rank(cfg: ModelConfig, layouts: tuple[Layout, ...], seq: int) -> list[float]:
    losses = []
    for layout in layouts:
        engine = build_engine(cfg, layout, build_groups(layout), "cpu", seed=0)
        losses.append(engine.forward_backward(
            *token_batch(cfg.vocab_size, BATCH, seq, torch.device("cpu"))))
    return losses


def _first_losses(cfg: ModelConfig, layouts: tuple[Layout, ...], seq: int) -> list[float]:
    return run_distributed(_losses_on_a_rank, layouts[0].world_size, (cfg, layouts, seq),
                           timeout_s=900)[0]


def rows(quick: bool = False) -> tuple[Row, float]:
    """The measured row and the planner's predicted etp=1 / etp=2 time ratio."""
    cfg, seq = (QUICK, 64) if quick else (MODEL, 512)
    steps, repeats = (2, 1) if quick else (6, 3)
    whole, split = (Layout(tp=2, sequence_parallel=True, etp=etp) for etp in (1, 2))
    losses = _first_losses(cfg, (whole, split), seq)
    if abs(losses[0] - losses[1]) > 1e-5:
        raise AssertionError(f"etp=1 and etp=2 losses differ: {losses}")
    work = (f"{cfg.name} ({cfg.n_experts} experts of width {cfg.d_ff_expert}, top "
            f"{cfg.top_k}), fwd+bwd+AdamW, tp=2 with SP, {BATCH} x {seq} tokens")
    row = compare(work, 2, BATCH * seq, ("etp=2", lambda: _setup(cfg, split, seq)),
                  ("etp=1", lambda: _setup(cfg, whole, seq)), steps=steps, repeats=repeats,
                  device="cpu")
    cluster = build_cluster(gpus=2, overrides=load_hardware_file(PROFILE))
    times = [evaluate(cfg, layout, cluster, seq, BATCH, FP32_ADAM).step_time_s
             for layout in (whole, split)]
    return row, times[0] / times[1]


def main() -> None:
    quick = quick_flag(__doc__, "the tiny model (a smoke run)")
    print("| work | etp=2 ms | etp=1 ms | speed of etp=2 (95% interval) | planner's |")
    print("|---|---|---|---|---|")
    row, ratio = rows(quick)
    low, high = row.ratio_interval
    print(f"| {row.name} | {1e3 * row.paraxis_step_time_s:.1f} | "
          f"{1e3 * row.peer_step_time_s:.1f} | {row.ratio:.2f} ({low:.2f}-{high:.2f}) | "
          f"{ratio:.2f} |")


if __name__ == "__main__":
    main()
