"""What sequence parallelism's replicated-parameter gradients cost the runtime, per step.

    python -m tools.probes.sp_grad_sums [--steps N] [LAYOUT ...]
                        (default: tiny at tp=4, pp=2, 4 microbatches, with and without SP)

With SP each rank normalises only its tokens, so the gradients of the parameters every TP
rank holds whole (norm weights and biases, row-parallel biases, learned positions) must be
summed over the TP group. Summing each one in its own backward, one all-reduce per
parameter per microbatch, made 52 calls a step on the first rank of the default layout,
whose step took 1687 ms against 412 ms without SP here (8 ranks on 2 cores). So, like
Megatron-LM's `finalize_model_grads`, the engine sums them once a step in one call
(`tensor_parallel.partial.sum_partial_grads`), which the planner prices (`plan.step_calls`):
1 call, and 544 ms a step against 509 ms without SP. This prints, per layout, the TP
collectives one step issues on the first rank (counted by `tensor_parallel.counter`), those
summing parameter gradients among them, and the median step time after a warm-up step.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import time

DEFAULT = ["tp=4,pp=2,microbatches=4,schedule=1f1b,sequence_parallel=true",
           "tp=4,pp=2,microbatches=4,schedule=1f1b"]
BATCH, SEQ = 8, 16


def _rank(ctx, steps: int) -> tuple[dict[str, int], float]:
    """On every rank: ({kind: calls per step}, median step seconds)."""
    import torch

    from paraxis.parallel.tensor.counter import CommCounter
    from paraxis.parallelize import materialize, parallelize
    from paraxis.spec.model_config import PRESETS

    cfg = PRESETS["tiny"]
    engine = parallelize(cfg, ctx.layout, ctx.groups, "cpu")
    materialize(engine, cfg, 0)
    generator = torch.Generator().manual_seed(0)
    x = torch.randint(0, cfg.vocab_size, (BATCH // ctx.layout.dp, SEQ), generator=generator)
    times = []
    with CommCounter() as counter:
        for _ in range(steps + 1):  # the first step warms up
            started = time.perf_counter()
            engine.forward_backward(x, x.roll(1, 1))
            engine.optimizer_step(1e-3)
            engine.zero_grad()
            times.append(time.perf_counter() - started)
    counts = collections.Counter(event.kind for event in counter.events)
    counts["of them, parameter gradients"] = sum(
        event.purpose == "param_grad" for event in counter.events)
    return {kind: n // (steps + 1) for kind, n in counts.items()}, statistics.median(times[1:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.probes.sp_grad_sums")
    parser.add_argument("layouts", nargs="*", default=DEFAULT)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    from paraxis.dist.testing import run_on_ranks
    from paraxis.spec.layout import Layout

    for text in args.layouts:
        layout = Layout.parse(text)
        counts, seconds = run_on_ranks(layout, _rank, args.steps, timeout_s=600)[0]
        calls = ", ".join(f"{kind} {n}" for kind, n in sorted(counts.items()))
        print(f"{layout}: {seconds * 1e3:.0f} ms a step; rank 0's TP calls a step: {calls}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
