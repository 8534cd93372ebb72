"""`paraxis plan`: search (or evaluate) layouts for a model on a cluster and defend the pick."""

from __future__ import annotations

import argparse
import json

from paraxis.errors import ParaxisError
from paraxis.layout import RECOMPUTE, SCHEDULES, Layout
from paraxis.model_config import ModelConfig, load_model_config, model_from_params
from paraxis.plan.cost import Overlap, evaluate
from paraxis.plan.explain import explain
from paraxis.plan.hardware import GPUS, Cluster, build_cluster, load_hardware_file
from paraxis.plan.precision import PRECISIONS, Precision
from paraxis.plan.report import plan_document
from paraxis.plan.search import Constraints, search

GB = 1e9


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_and_hardware(parser)
    parser.add_argument("--global-batch", type=int, default=1024, help="sequences per step")
    parser.add_argument("--seq-len", type=int, help="tokens per sequence (default: the "
                        "model's max_seq_len)")
    parser.add_argument("--layout", help="evaluate this layout instead of searching, e.g. "
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


def add_model_and_hardware(parser: argparse.ArgumentParser) -> None:
    model = parser.add_mutually_exclusive_group()
    model.add_argument("--model", help="preset name or .json/.toml model file")
    model.add_argument("--params", type=float, help="generic GPT shape of N parameters")
    parser.add_argument("--gpus", type=int, help="GPUs in the cluster (default: one node)")
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--gpu", default="a100-80gb", help=f"one of {', '.join(GPUS)}")
    parser.add_argument("--hardware", help="TOML/JSON hardware file (schema in docs/planner.md)")
    parser.add_argument("--memory-gb", type=float, help="override GPU memory")
    parser.add_argument("--nvlink-gbps", type=float, help="override NVLink GB/s per GPU per way")
    parser.add_argument("--network-gbps", type=float,
                        help="override inter-node GB/s per GPU per way")
    parser.add_argument("--precision", choices=PRECISIONS, default="mixed",
                        help="mixed: 2+2+12 bytes/param (default); fp32: 4+4+8")


def resolve_model(args: argparse.Namespace) -> ModelConfig:
    if args.params is not None:
        return model_from_params(args.params, seq_len=getattr(args, "seq_len", None) or 2048)
    return load_model_config(args.model or "llama2-7b")


def resolve_cluster(args: argparse.Namespace) -> Cluster:
    overrides: dict[str, object] = load_hardware_file(args.hardware) if args.hardware else {}
    flags = {"memory_bytes": args.memory_gb and args.memory_gb * GB,
             "nvlink_bandwidth_Bps": args.nvlink_gbps and args.nvlink_gbps * GB,
             "inter_node_bandwidth_Bps": args.network_gbps and args.network_gbps * GB}
    overrides.update({k: v for k, v in flags.items() if v})
    gpu = args.gpu if args.gpu != "a100-80gb" or "gpu" not in overrides else overrides["gpu"]
    overrides["gpu"] = gpu
    return build_cluster(str(gpu), args.gpus, args.gpus_per_node, overrides)


def run(args: argparse.Namespace) -> int:
    cfg = resolve_model(args)
    cluster = resolve_cluster(args)
    precision: Precision = PRECISIONS[args.precision]
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
