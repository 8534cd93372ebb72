"""`paraxis plan`: search (or evaluate) layouts for a model on a cluster and defend the pick.

The model, hardware and batch flags are `paraxis.plan.inputs`, shared with `paraxis report`.
"""

from __future__ import annotations

import argparse
import json

from paraxis.errors import ParaxisError
from paraxis.layout import RECOMPUTE, SCHEDULES, Layout
from paraxis.plan import inputs
from paraxis.plan.cost import Overlap, evaluate
from paraxis.plan.document import plan_document
from paraxis.plan.explain import explain
from paraxis.plan.search import Constraints, search


def add_arguments(parser: argparse.ArgumentParser) -> None:
    inputs.add_arguments(parser, layout_help="evaluate this layout instead of searching, e.g. "
                         "dp=2,tp=8,pp=4,zero=1,microbatches=64; without microbatches the "
                         "fields given are fixed and the rest searched")
    parser.add_argument("--top", type=int, default=5, help="layouts to show")
    parser.add_argument("--json", action="store_true", help="print the JSON document")
    limits = parser.add_argument_group("search constraints")
    for axis in ("tp", "pp", "dp"):
        limits.add_argument(f"--{axis}", type=int, help=f"fix the {axis} degree")
    limits.add_argument("--max-tp", type=int, help="largest tensor-parallel degree")
    limits.add_argument("--max-pp", type=int, help="largest pipeline degree")
    limits.add_argument("--no-pp", action="store_true", help="no pipeline parallelism")
    limits.add_argument("--zero", type=int, choices=(0, 1, 2, 3), help="fix the ZeRO stage")
    limits.add_argument("--recompute", choices=RECOMPUTE, action="append",
                        help="allowed recomputation (repeatable; default all)")
    limits.add_argument("--schedule", choices=SCHEDULES, action="append",
                        help="allowed pipeline schedules (repeatable; default 1f1b, "
                        "interleaved)")
    limits.add_argument("--no-sp", action="store_true", help="no sequence parallelism")
    limits.add_argument("--tp-within-node", action="store_true",
                        help="forbid TP groups that cross nodes")
    limits.add_argument("--no-overlap", action="store_true",
                        help="assume no communication hides behind compute")


def run(args: argparse.Namespace) -> int:
    given = inputs.from_args(args)
    cfg = given.model_config()
    cluster = given.cluster()
    precision = given.precision_rule()
    seq_len = args.seq_len or cfg.max_seq_len
    overlap = Overlap(dp=False, tp=False) if args.no_overlap else Overlap()
    if args.top < 1:
        raise ParaxisError(f"--top {args.top} must be at least 1")
    if args.global_batch < 1:
        raise ParaxisError(f"--global-batch {args.global_batch} must be at least 1")
    fixed = _layout_fields(args.layout) if args.layout else {}
    if args.layout and "microbatches" in fixed:
        # a complete layout: evaluate exactly this one
        layout = Layout.parse(args.layout)
        layout.validate(cluster.world_size, cfg, args.global_batch, seq_len)
        best = evaluate(cfg, layout, cluster, seq_len, args.global_batch, precision, overlap)
        layouts, result = [best], None
    else:
        # a partial layout (e.g. dp=2,tp=8,pp=4,zero=1) fixes those fields; search the rest
        partial = Layout.parse(args.layout) if args.layout else None
        constraints = Constraints(
            max_tp=args.max_tp, max_pp=1 if args.no_pp else args.max_pp,
            tp=partial.tp if partial and "tp" in fixed else args.tp,
            pp=partial.pp if partial and "pp" in fixed else args.pp,
            dp=partial.dp if partial and "dp" in fixed else args.dp,
            zero=partial.zero if partial and "zero" in fixed else args.zero,
            recompute=((partial.recompute,) if partial and "recompute" in fixed
                       else tuple(args.recompute or RECOMPUTE)),
            schedules=((partial.schedule,) if partial and "schedule" in fixed
                       else tuple(args.schedule or ("1f1b", "interleaved"))),
            sequence_parallel=((partial.sequence_parallel,) if partial and
                               "sequence_parallel" in fixed else
                               (False,) if args.no_sp else (True,)),
            tp_within_node=args.tp_within_node)
        result = search(cfg, cluster, seq_len, args.global_batch, constraints, precision,
                        overlap)
        if not result.ranked:
            closest = result.too_big[0].reason if result.too_big else "no layout was priced"
            raise ParaxisError(f"no layout of {cfg.name} fits {cluster.world_size} x "
                               f"{cluster.gpu.name} (closest: {closest}); add GPUs, allow "
                               "ZeRO/recompute, or shorten --seq-len")
        layouts = result.top(args.top)
        best = layouts[0]
    lines = explain(cfg, cluster, best, result, precision)
    if args.json:
        print(json.dumps(plan_document(cfg, cluster, seq_len, args.global_batch, precision,
                                       overlap, layouts, lines, result), indent=2))
        return 0
    from paraxis.plan.tables import print_plan  # rich only for humans
    print_plan(cfg, cluster, seq_len, args.global_batch, layouts, lines, result)
    if not best.fits:
        return 1
    return 0


def _layout_fields(text: str) -> set[str]:
    """The fields a --layout text sets (Layout.parse checks their values)."""
    keys = {part.partition("=")[0].strip().replace("-", "_") for part in text.split(",")
            if part.strip()}
    return {"sequence_parallel" if key == "sp" else key for key in keys}
