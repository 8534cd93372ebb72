"""ZeRO-3 with pipeline parallelism against the planner: `python -m tools.probes.zero3_pipeline`.

Measured on a model of at least 50M parameters (a Llama-style 69M model, untied,
fp32): on 4 gloo ranks, dp=2 x pp=2 under 1F1B with 4 microbatches, ZeRO-1 next to ZeRO-3
with each reshard choice. For each rank it reports

- the model-state bytes it holds after a step (`memory_report`: parameters, gradients and
  AdamW states, counted from tensor storages) and how far they are below ZeRO-1's, next to
  the planner's `model_state_bytes` for the stage;
- the bytes its ZeRO collectives assembled in that step (`data_parallel.flat.VOLUME`),
  next to the planner's `zero3_pipeline_volume` (the runtime's flat units are padded to a
  multiple of dp, at most dp-1 elements each);
- the peak of tensor bytes alive during the step (`dist.tensor_memory.TensorBytes`),
  where the reshard choice shows: "step" holds the stage's weights whole;
- the step's wall time (shared CPU cores: a rough figure).

`--layers`, `--microbatches` and `--schedule` change the run; the defaults are the ones
docs/pipelines.md quotes.
"""

from __future__ import annotations

import argparse
import time

from paraxis.dist.testing import RankContext, run_on_ranks
from paraxis.plan.memory import model_state_bytes, stage_params
from paraxis.plan.zero3 import zero3_pipeline_volume
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import ModelConfig
from paraxis.spec.precision import FP32_ADAM

SEQ, SEED = 64, 0


def model(layers: int) -> ModelConfig:
    """Llama-style: 8 layers of d=768 and a 8192-token vocabulary make 69M parameters."""
    return ModelConfig("bench-69m", "llama", 8192, layers, 768, 12, 12, 2048, SEQ)


def _rank(ctx: RankContext, cfg: ModelConfig) -> dict[str, float]:
    import torch

    from paraxis.dist.tensor_memory import TensorBytes
    from paraxis.engine.data_parallel.flat import VOLUME
    from paraxis.parallelize import build_engine

    layout, groups = ctx.layout, ctx.groups
    generator = torch.Generator().manual_seed(groups.dp_rank)
    batch = layout.microbatches
    x = torch.randint(0, cfg.vocab_size, (batch, SEQ), generator=generator)
    y = torch.randint(0, cfg.vocab_size, (batch, SEQ), generator=generator)
    with TensorBytes() as meter:
        engine = build_engine(cfg, layout, groups, "cpu", seed=SEED, seq_len=SEQ)
        for step in range(2):  # the second step is measured
            before = dict(VOLUME)
            started = time.perf_counter()
            with meter.phase(f"step{step}"):
                engine.forward_backward(x, y)
                engine.clip_grad_norm(1.0)
                engine.optimizer_step(1e-4)
                engine.zero_grad()
            seconds = time.perf_counter() - started
    states = engine.memory_report()
    return {"stage": groups.pp_rank, "states": sum(states.values()), "seconds": seconds,
            "peak": meter.peaks["step1"],
            **{kind: VOLUME[kind] - before[kind] for kind in VOLUME}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--schedule", default="1f1b")
    args = parser.parse_args()
    cfg = model(args.layers)
    base = Layout(dp=2, pp=2, microbatches=args.microbatches, schedule=args.schedule)
    layouts = [base.replace(zero=1), base.replace(zero=3),
               base.replace(zero=3, zero3_reshard="step")]
    results = run_on_ranks(layouts, _rank, cfg, timeout_s=600)
    counts = stage_params(cfg, base.pp, base.virtual_stages, SEQ, base.placement)
    print(f"{cfg.name}: {sum(counts) / 1e6:.1f}M parameters "
          f"(stages {', '.join(f'{c / 1e6:.1f}M' for c in counts)}), fp32, "
          f"{base}, seq {SEQ}")
    zero1 = {r["stage"]: r["states"] for r in results[0]}
    worst = {"states": 0.0, "all_gather": 0.0, "reduce_scatter": 0.0}  # runtime - planner
    print("| layout | stage | states MB | below ZeRO-1 MB (planner) | all-gather MB (planner) "
          "| reduce-scatter MB (planner) | step peak MB | step s |")
    print("|---|---|---|---|---|---|---|---|")
    for layout, by_rank in zip(layouts, results, strict=True):
        for r in by_rank[::2]:  # one rank per stage (dp rank 0)
            stage = r["stage"]
            plan = {zero: sum(model_state_bytes(counts[stage], 2, zero, FP32_ADAM).values())
                    for zero in (1, layout.zero)}
            planned = {kind: "" for kind in ("all_gather", "reduce_scatter")}
            if layout.zero == 3:
                volume = zero3_pipeline_volume(counts[stage], layout.microbatches,
                                               layout.zero3_reshard, 4, 4,
                                               _embedding(cfg, stage))
                planned = {kind: f" ({value / 1e6:.3f})" for kind, value in volume.items()}
                for kind, value in volume.items():
                    worst[kind] = max(worst[kind], abs(r[kind] - value))
            name = f"ZeRO-{layout.zero}" + (f" {layout.zero3_reshard}" if layout.zero == 3
                                              else "")
            below = (zero1[stage] - r["states"]) / 1e6
            worst["states"] = max(worst["states"], abs(below * 1e6 - (plan[1] - plan[layout.zero])))
            print(f"| {name} | {stage} | {r['states'] / 1e6:.2f} | {below:.3f} "
                  f"({(plan[1] - plan[layout.zero]) / 1e6:.3f}) | "
                  f"{r['all_gather'] / 1e6:.3f}{planned['all_gather']} | "
                  f"{r['reduce_scatter'] / 1e6:.3f}{planned['reduce_scatter']} | "
                  f"{r['peak'] / 1e6:.1f} | {r['seconds']:.2f} |")
    print("largest |runtime - planner| in bytes: " + ", ".join(
        f"{kind} {value:.0f}" for kind, value in worst.items())
        + " (the runtime pads each flat unit to a multiple of dp; AdamW keeps a step count "
          "per tensor)")


def _embedding(cfg: ModelConfig, stage: int) -> float:
    """The embedding's parameters on `stage` (gathered for its forward only)."""
    return cfg.vocab_size * cfg.d_model if stage == 0 else 0.0


if __name__ == "__main__":
    main()
