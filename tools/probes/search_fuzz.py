"""The pruned search against the exhaustive one on random cases (`plan/prune.py`).

    python -m tools.probes.search_fuzz [--seed 0] [--cases 40] [--workers N]

tests/test_plan_prune.py compares the two on a dozen chosen searches; this draws models,
GPU counts (8-128), GPUs, batches, sequences, constraints, runtime switches
(`hardware.CHOICES`) and precisions at random, and on each checks what the answer shows
(the fastest six, the ties of the error band, the fastest shapes' fastest layouts, the
fastest too big), that the pruned search ranks no layout the exhaustive one does not try,
that every layout the exhaustive search priced costs what it costs alone, and that its
floors lie under its price (`--workers 2`: the pruned search split over processes). It
prints one line a case and the failures, and exits 1 where one fails.
"""

from __future__ import annotations

import argparse
import random
import sys

from paraxis.plan.cost import evaluate
from paraxis.plan.experts import DEFAULT_IMBALANCE
from paraxis.plan.floor import Floors, floor_recompute, step_lower_bound
from paraxis.plan.hardware import CHOICES, build_cluster
from paraxis.plan.prune import RIVAL_SHAPES, TOO_BIG_SHOWN, rival_shape
from paraxis.plan.rates import DEFAULT_OVERLAP
from paraxis.plan.search import Constraints, search
from paraxis.plan.settings import every_variant
from paraxis.plan.uncertainty import error_band, ties
from paraxis.spec.errors import ParaxisError
from paraxis.spec.model_config import PRESETS
from paraxis.spec.precision import PRECISIONS

MODELS = ("gpt2-1.5b", "llama2-7b", "llama2-13b", "llama3-8b", "llama3-70b", "llama2-70b",
          "gpt3-175b", "mixtral-8x7b")
GPUS = ("a100-80gb", "a100-40gb", "h100-sxm-80gb", "h200", "l40s")
CONSTRAINTS = ({}, {}, {"zero": 1}, {"zero": 3}, {"micro_batch": 1}, {"cp": 2},
               {"max_pp": 1}, {"tp_within_node": True}, {"recompute": ("full",)},
               {"sequence_parallel": (True, False)},
               {"schedules": ("1f1b", "interleaved", "zb-h1", "zb-v")})


def draw(rng: random.Random) -> tuple:
    gpu = rng.choice(GPUS)
    network = {name: rng.choice(ways) for name, ways in CHOICES.items()
               if name != "attention_kernel" and rng.random() < 0.3}
    fp8 = gpu.startswith(("h100", "h200"))
    precision = rng.choice(("bf16", "bf16", "bf16-fp32grad", "fp16") + (("fp8",) if fp8 else ()))
    return (rng.choice(MODELS), rng.choice((8, 16, 32, 64, 128)), gpu,
            rng.choice((32, 64, 128, 256, 512)), rng.choice((1024, 2048, 4096, 8192, 16384, 32768)),
            rng.choice(CONSTRAINTS), network, precision)


def facts(estimate) -> tuple:  # noqa: ANN001
    """What the answer shows of a layout: its text, step time and memory."""
    return str(estimate.layout), estimate.step_time_s, estimate.memory["total"]


def leading_shapes(result) -> list[tuple]:  # noqa: ANN001
    """The `RIVAL_SHAPES` fastest shapes and their fastest times (the nearest rivals)."""
    fastest: dict = {}
    for e in result.ranked:
        shape = rival_shape(e.layout)
        fastest[shape] = min(fastest.get(shape, float("inf")), e.step_time_s)
    return sorted(fastest.items(), key=lambda item: item[1])[:RIVAL_SHAPES]


def check(case: tuple, workers: int | None = None) -> str | None:
    """What differs between the two searches of `case`, or None (the pruned one over
    `workers` processes: `search.search`)."""
    name, gpus, gpu, batch, seq, constraints, network, precision_name = case
    cfg, cluster = PRESETS[name], build_cluster(gpu, gpus, 8, network)
    precision, c = PRECISIONS[precision_name], Constraints(**constraints)
    whole = search(cfg, cluster, seq, batch, c, precision, exhaustive=True)
    pruned = search(cfg, cluster, seq, batch, c, precision, workers=workers)
    if not whole.ranked:
        return None if not pruned.ranked else "the pruned search fits what the other does not"
    band = error_band(cluster)
    shown = {
        "the fastest six": lambda r: [facts(e) for e in r.ranked[:6]],
        "the ties": lambda r: [facts(e) for e in ties(r.ranked[0], r.ranked, band)],
        "the fastest shapes": leading_shapes,
        "the fastest too big": lambda r: [str(j.layout) for j in r.too_big[:TOO_BIG_SHOWN]],
    }
    for what, read in shown.items():
        if read(pruned) != read(whole):
            return f"{what} differ"
    # every layout it ranks the exhaustive search ranks, but a cp variant re-priced at another
    # shape's fastest ring layout (`cp_variants.py`)
    ranked = {str(e.layout) for e in whole.ranked}
    for e in pruned.ranked:
        if str(e.layout) not in ranked and e.layout.cp_attention == "ring" \
                and e.layout.cp_a2a == 1:
            return f"{e.layout} ranked by the pruned search alone"
    priced = whole.ranked + [r.estimate for r in whole.too_big if r.estimate is not None]
    memo: dict = {}
    floors = Floors(cfg, cluster, seq, batch, precision, DEFAULT_OVERLAP, DEFAULT_IMBALANCE, {})
    for estimate in priced[::max(1, len(priced) // 100)]:
        alone = evaluate(cfg, estimate.layout, cluster, seq, batch, precision)
        if (alone.step_time_s, alone.memory) != (estimate.step_time_s, estimate.memory):
            return f"{estimate.layout} costs otherwise alone"
        floor = step_lower_bound(cfg, estimate.layout, cluster, seq, batch, precision,
                                 memo=memo)
        if not 0 < floor <= estimate.step_time_s * (1 + 1e-12):
            return f"{estimate.layout}: floor {floor} above its price {estimate.step_time_s}"
        layout = estimate.layout  # the floor of its size and every larger one (its own shape)
        tail = floors.tail(layout, layout, layout.microbatches, (layout.sequence_parallel,),
                           every_variant(layout.pp, c, cfg.n_layers), floor_recompute(layout))
        if tail > estimate.step_time_s * (1 + 1e-12):
            return f"{layout}: tail floor {tail} above its price {estimate.step_time_s}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cases", type=int, default=40)
    parser.add_argument("--workers", type=int, default=None,
                        help="processes the pruned search splits over (default: its own "
                             "choice, one for these sizes)")
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    failures = 0
    for _ in range(args.cases):
        case = draw(rng)
        try:
            problem = check(case, args.workers)
        except ParaxisError as error:  # a case no layout can run: the search says why
            print(f"refused  {case}: {str(error)[:80]}")
            continue
        failures += problem is not None
        print(f"{'FAILED' if problem else 'same':8} {case}" + (f": {problem}" if problem else ""),
              flush=True)
    print(f"{failures} of {args.cases} cases differ")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
