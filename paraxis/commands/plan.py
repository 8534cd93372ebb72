"""`paraxis plan`: search (or evaluate) layouts for a model on a cluster and defend the pick.

The model, hardware and batch flags are `paraxis.plan.inputs`, shared with `paraxis report`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math

from paraxis.plan import inputs
from paraxis.plan.cost import devices_to_hold, evaluate, too_big_reason
from paraxis.plan.document import plan_document
from paraxis.plan.experts import DEFAULT_IMBALANCE
from paraxis.plan.explain import explain
from paraxis.plan.hardware import Cluster
from paraxis.plan.memory import check_interleaving, model_state_bytes
from paraxis.plan.rates import check_precision, for_precision
from paraxis.plan.search import (
    SearchResult,
    closest_to_fitting,
    search,
)
from paraxis.plan.search_flags import (
    check_complete_layout_flags,
    complete_layout,
    overlap_rules,
    search_constraints,
    stated_fields,
)
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import RECOMPUTE, SCHEDULES, ZERO_STAGES
from paraxis.spec.model_config import ModelConfig
from paraxis.spec.precision import Precision, fp8_gather_problem
from paraxis.spec.units import gigabytes
from paraxis.train import verify


def add_arguments(parser: argparse.ArgumentParser) -> None:
    inputs.add_arguments(parser, layout_help="evaluate this layout instead of searching, e.g. "
                         "dp=2,tp=8,pp=4,zero=1,microbatches=64 (or micro_batch=2, sequences "
                         "per microbatch, as papers state it); without either the fields "
                         "given are fixed and the rest searched")
    parser.add_argument("--top", type=int, default=5, help="layouts to show")
    parser.add_argument("--json", action="store_true", help="print the JSON document")
    parser.add_argument("--workers", type=int, default=None,
                        help="processes a large search splits over (default: the CPUs this "
                             "process may use, up to 4, on Linux; 1: this process alone)")
    check = parser.add_argument_group("verify the ranking on this machine")
    check.add_argument("--verify", type=int, metavar="K",
                       help="train the top K layouts on --gpus ranks of this machine (paraxis "
                       "train, a short burst each, priced on this machine's profile) and "
                       "print the measured ranking next to the predicted one")
    check.add_argument("--verify-rounds", type=int, default=None,
                       help=f"runs of each layout, interleaved (default {verify.ROUNDS})")
    check.add_argument("--verify-steps", type=int, default=None,
                       help=f"steps per run (default {verify.STEPS})")
    limits = parser.add_argument_group("search constraints")
    for axis in ("tp", "pp", "dp", "cp", "ep"):
        limits.add_argument(f"--{axis}", type=int, help=f"fix the {axis} degree")
    limits.add_argument("--expert-imbalance", type=float, default=DEFAULT_IMBALANCE,
                        help="busiest EP rank's routed tokens over the mean (mixtures of "
                        f"experts; default {DEFAULT_IMBALANCE:g}, plan/experts.py)")
    limits.add_argument("--max-tp", type=int, help="largest tensor-parallel degree")
    limits.add_argument("--max-pp", type=int, help="largest pipeline degree")
    limits.add_argument("--no-pp", action="store_true", help="no pipeline parallelism")
    limits.add_argument("--zero", type=int, choices=ZERO_STAGES, help="fix the ZeRO stage")
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
    limits.add_argument("--exposed", choices=("dp", "zero3", "tp", "cp", "pp"),
                        action="append",
                        help="this communication does not hide behind compute (repeatable): "
                        "dp the gradient buckets of ZeRO 0-2, zero3 ZeRO-3's prefetched "
                        "gathers and reduce-scatters, tp backward, cp ring hops; pp: let "
                        "sends hide")


def check_verify(args: argparse.Namespace) -> None:
    """The --verify flags, in every mode: a count below its least, or a --verify-rounds or
    --verify-steps without the --verify they shape (nothing would read them)."""
    for flag, value, least in (("--verify", args.verify, 1),
                               ("--verify-rounds", args.verify_rounds, 1),
                               ("--verify-steps", args.verify_steps, 2)):
        if value is not None and value < least:
            raise ParaxisError(f"{flag} {value} must be at least {least}")
    for flag, value in (("--verify-rounds", args.verify_rounds),
                        ("--verify-steps", args.verify_steps)):
        if value is not None and args.verify is None:
            raise ParaxisError(f"{flag} needs --verify K (it shapes the training of the top K "
                               f"layouts); add --verify K or leave {flag} out")


def check_search_flags(args: argparse.Namespace) -> None:
    """The search's numbers, before anything is priced or trained (--verify included)."""
    if args.top < 1:
        raise ParaxisError(f"--top {args.top} must be at least 1")
    if args.workers is not None and args.workers < 1:
        raise ParaxisError(f"--workers {args.workers} must be at least 1 (1: search in this "
                           "process alone)")
    for flag in ("tp", "pp", "dp", "cp", "ep", "max_tp", "max_pp"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise ParaxisError(f"--{flag.replace('_', '-')} {value} must be at least 1; leave "
                               "it out to search that degree")
    if args.global_batch < 1:
        raise ParaxisError(f"--global-batch {args.global_batch} must be at least 1")
    if not args.expert_imbalance >= 1:
        raise ParaxisError(f"--expert-imbalance {args.expert_imbalance:g} must be at least 1 "
                           "(the busiest EP rank's tokens over the mean)")


def run(args: argparse.Namespace) -> int:
    inputs.check_numbers(args)
    check_verify(args)
    check_search_flags(args)
    if args.verify is not None:  # trains: it needs torch, the plan alone does not
        from paraxis.train.auto_layout import verify_plan

        return verify_plan(args)
    given = inputs.from_args(args)
    cfg = given.model_config()
    cluster = given.cluster()
    precision = given.precision_rule()
    check_precision(cluster.gpu, precision)  # before anything is searched or evaluated
    cluster = for_precision(cluster, precision)  # the explanation's peaks, as priced
    seq_len = given.sequence_length(cfg)  # the model's context unless given; never beyond it
    overlap = overlap_rules(args.no_overlap, args.exposed or ())
    imbalance = args.expert_imbalance
    fixed, stated, micro_batch = stated_fields(args, cfg)
    layout = complete_layout(fixed, stated, micro_batch, args.global_batch)
    if layout is not None:
        check_complete_layout_flags(args, fixed)
    if precision.fp8_weight_gather and (problem := fp8_gather_problem(
            args.precision, layout.zero if layout is not None else
            fixed.get("zero", getattr(args, "zero", None)), precision.fp8_recipe)):
        raise ParaxisError(problem)
    if layout is not None:
        # a complete layout (microbatches given, or a micro-batch size with dp): evaluate it
        layout.validate(cluster.world_size, cfg, args.global_batch, seq_len)
        check_interleaving(layout, cfg)
        best = evaluate(cfg, layout, cluster, seq_len, args.global_batch, precision, overlap,
                        imbalance)
        layouts, result = [best], None
    else:
        # a partial layout (e.g. dp=2,tp=8,pp=4,zero=1) fixes those fields; search the rest
        constraints = search_constraints(args, fixed, stated, micro_batch, cfg)
        result = search(cfg, cluster, seq_len, args.global_batch, constraints, precision,
                        overlap, imbalance, keep=max(6, args.top), workers=args.workers)
        if not result.ranked:
            per_node = dataclasses.replace(given, gpus=None).cluster().gpus_per_node
            raise ParaxisError(_no_fit(cfg, cluster, result, precision, args, per_node))
        layouts = result.top(args.top)
        best = layouts[0]
    lines = explain(cfg, cluster, best, result, precision, overlap=overlap,
                    expert_imbalance=imbalance)
    if args.json:
        print(json.dumps(plan_document(cfg, cluster, seq_len, args.global_batch, precision,
                                       overlap, layouts, lines, result), indent=2))
        return 0 if best.fits else 1  # as the table's: an evaluated layout that does not fit
    from paraxis.plan.tables import print_plan  # rich only for humans
    print_plan(cfg, cluster, seq_len, args.global_batch, layouts, lines, result)
    if not best.fits:
        return 1
    return 0


def _no_fit(cfg: ModelConfig, cluster: Cluster, result: SearchResult, precision: Precision,
            args: argparse.Namespace, per_node: int) -> str:
    """One line: no layout fits; the one closest in memory, what it needs, what would do
    (in nodes of `per_node` GPUs)."""
    gpus, what = cluster.world_size, f"{cfg.name} fits {cluster.world_size} x {cluster.gpu.name}"
    limit = cluster.gpu.memory_bytes / 1e9
    closest = closest_to_fitting(result)
    if closest is None and result.rule_breakers:
        return f"no layout of {what}: {result.rule_breakers[0].reason}"
    if closest is None:  # every shape skipped unpriced: its model states alone overflow
        states = sum(model_state_bytes(cfg.num_params(), gpus, 3, precision).values()) / 1e9
        room = limit - cluster.gpu.reserved_bytes / 1e9
        if states <= room:
            return f"no layout of {what}: the constraints leave none to price; loosen them"
        enough = math.ceil(gpus * states / room)
        return (f"no layout of {what}: even sharded over all {gpus} GPUs (ZeRO-3) its model "
                f"states take {states:.1f} GB per GPU, more than "
                f"{gigabytes(cluster.gpu.memory_bytes)} GB; use at least "
                f"{_whole_nodes(enough, cluster, per_node)}")
    fixes = []
    if enough := devices_to_hold(closest, gpus):
        fixes.append(f"about {_whole_nodes(enough, cluster, per_node)} would hold it")
    if args.zero is not None and args.zero < 3:
        fixes.append(f"drop --zero {args.zero}, which rules out deeper ZeRO sharding")
    if args.recompute and "full" not in args.recompute:
        fixes.append("drop --recompute, which rules out full recomputation")
    memory = closest.memory
    if memory["activations"] >= memory["params"] + memory["grads"] + memory["optimizer"]:
        fixes.append("shorten --seq-len")  # activations take most of it
    fixes.append("give more memory (--memory-gb)" if args.memory_gb
                 else "give a larger GPU (--gpu)")
    return (f"no layout of {what}; closest: {closest.layout} {too_big_reason(closest)}; "
            f"{', or '.join(fixes)}")


def _whole_nodes(gpus: int, cluster: Cluster, per_node: int) -> str:
    """`gpus` as a count the cluster takes: up to one node of `per_node` (the cluster's own
    may be fewer, the GPUs given), or whole nodes (a CPU profile's ranks share one
    machine)."""
    if cluster.cores_per_node:
        return f"{gpus} ranks"
    if gpus <= per_node:
        return f"{gpus} GPUs"
    nodes = math.ceil(gpus / per_node)
    return f"{nodes * per_node} GPUs ({nodes} nodes of {per_node})"
