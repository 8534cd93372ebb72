"""`paraxis diagnose`: why a run ended, or why throughput fell after a move, in a few
sentences that each say where their number comes from (measured, or the planner's forecast).

    paraxis diagnose --run RUN_DIR                     # how a run ended: steps, memory, loss
    paraxis diagnose --run AFTER --before BEFORE       # two runs: what changed, and why
    paraxis diagnose --model llama2-13b --layout dp=8,tp=8,pp=2 --gpus 128 \
        --cluster dgx-a100 --move-to ethernet-1nic     # a what-if, no run

A run is the folder `paraxis train --metrics-file DIR/FILE.jsonl` wrote (the metrics file,
config.toml beside it, and the checkpoints config.toml names), or its metrics file. The model,
layout, batch, sequence length and precision come from the run's config.toml unless the
flags give them; the hardware comes from `paraxis plan`'s flags (--cluster, --gpu,
--hardware, --memory-gb, ...), else the a100-80gb preset. --move-to and
--move-to-gpus-per-node give the hardware after the move (the rest as before).
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from pathlib import Path

from paraxis.files.run_records import found_beside
from paraxis.plan import inputs
from paraxis.plan.cost import Estimate, evaluate
from paraxis.plan.hardware import CLUSTERS, Cluster
from paraxis.plan.search_flags import layout_fields
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import Layout

WHAT_IF_BATCH = 1024  # sequences per step for a what-if without a run, as `paraxis plan`'s
# the search's flags left free: a partial --layout is completed by the planner alone
NO_LIMITS = {"max_tp": None, "max_pp": None, "no_pp": False, "tp": None, "pp": None,
             "dp": None, "cp": None, "ep": None, "zero": None, "recompute": None,
             "schedule": None, "no_sp": False, "tp_within_node": False}
USAGE = ("give --run RUN_DIR (how a run ended), --run AFTER --before BEFORE (why it got "
         "slower), or --layout LAYOUT --move-to CLUSTER (a what-if)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    inputs.add_arguments(parser, gpus_text="the layout's ranks", global_batch=None,
                         precision=None, layout_help="the layout to price (a what-if), or "
                         "in place of a run's own; a partial one (dp=8,tp=8,pp=2) is "
                         "completed by the planner on the hardware before the move")
    # dest is not "run": the CLI keeps each subcommand's entry point in args.run
    parser.add_argument("--run", dest="run_dir", help="a run folder (its metrics file and "
                        "config.toml) or its metrics file; with --before, the run after the "
                        "change")
    parser.add_argument("--before", dest="before_dir",
                        help="the run before the change, to compare --run with")
    parser.add_argument("--move-to", choices=tuple(CLUSTERS),
                        help="the cluster after the move: price the layout on both")
    parser.add_argument("--move-to-gpus-per-node", type=int,
                        help="GPUs per node after the move (default: --move-to's, else as "
                             "before)")


@dataclass(frozen=True)
class RunFolder:
    folder: Path
    metrics: Path
    config: Path | None  # config.toml beside the metrics file


def find_run(text: str, flag: str) -> RunFolder:
    """The metrics file and config.toml of the run `text` names (a folder or the file)."""
    from paraxis.train.run_file import read_run_file

    path = Path(text)
    written = "`paraxis train --metrics-file DIR/metrics.jsonl` wrote"
    if not path.exists():
        raise ParaxisError(f"{flag} {path} does not exist; give the folder {written}, or that "
                           "metrics file")
    if path.is_file():
        return RunFolder(path.parent, path, found_beside(path, "config.toml"))
    folder, config = path, path / "config.toml"
    named = [folder / Path(read_run_file(config).logging.metrics_file or "").name] \
        if config.is_file() else []
    found = [p for p in (*named, folder / "metrics.jsonl") if p.is_file()]
    found = found or sorted(folder.glob("*.jsonl"))
    if len(found) > 1 and not named:
        raise ParaxisError(f"{flag} {path} holds {len(found)} metrics files "
                           f"({', '.join(p.name for p in found)}); give the one to read")
    if not found:
        raise ParaxisError(f"{flag} {path} holds no metrics file (*.jsonl); give the folder "
                           f"{written}, or train with --metrics-file")
    return RunFolder(folder, found[0], found_beside(found[0], "config.toml"))


def hardware_text(cluster: Cluster, preset: str | None) -> str:
    from paraxis.train.run_hardware import is_cpu

    if is_cpu(cluster):
        return f"{cluster.world_size} CPU rank(s) on {cluster.gpu.name}"
    named = f"{preset}: " if preset else ""
    nodes = f"{cluster.nodes} node{'s' if cluster.nodes > 1 else ''}"
    return f"{cluster.world_size} x {cluster.gpu.name} ({named}{nodes} of {cluster.gpus_per_node})"


def capacity_source(args: argparse.Namespace, cluster: Cluster) -> str:
    """Where the device memory a run is held against comes from, in words."""
    if args.memory_gb:
        return f"--memory-gb {args.memory_gb:g}"
    if args.hardware:
        return f"the hardware file {args.hardware}"
    if args.cluster_preset or args.gpu:
        return f"the {cluster.gpu.name} preset"
    return (f"the {inputs.DEFAULT_GPU} preset, the default: give --gpu, --cluster or "
            "--hardware for the device the run had")


def plan_inputs(args: argparse.Namespace, run: RunFolder | None) -> inputs.PlanInputs:
    """The flags, with what they leave out from the run's config.toml (`paraxis report`'s
    rule), and the defaults of a run (fp32) or of a what-if (mixed, 1024 sequences)."""
    from paraxis.commands.report import GLOBAL_BATCH, from_run_config

    given = inputs.from_args(args)
    if run is not None and run.config is not None:
        given = from_run_config(given, args, run.config, run.metrics)
    return dataclasses.replace(
        given, precision=given.precision or ("fp32" if run else "mixed"),
        global_batch=given.global_batch or (GLOBAL_BATCH if run else WHAT_IF_BATCH))


def with_ranks(given: inputs.PlanInputs) -> inputs.PlanInputs:
    """`given` with --gpus, else as many GPUs as its layout has ranks."""
    if given.gpus is not None or given.layout is None:
        return given
    return dataclasses.replace(given, gpus=layout_fields(given.layout)[1].world_size)


def whole_layout(given: inputs.PlanInputs, cluster: Cluster, flag: str | None
                 ) -> tuple[Layout, str]:
    """The layout `given` states, and a clause on where it came from: a run's config.toml
    states it whole (its defaults included: `flag` None); a --layout `flag` that leaves
    fields open is completed by the planner on `cluster`."""
    from paraxis.plan.search import search
    from paraxis.plan.search_flags import complete_layout, search_constraints

    cfg = given.model_config()
    seq_len = given.sequence_length(cfg)
    if flag is None:
        layout = Layout.parse(given.layout or "")
        return layout.validate(cluster.world_size, cfg, given.global_batch, seq_len), ""
    fixed, stated, micro_batch = layout_fields(flag)
    layout = complete_layout(fixed, stated, micro_batch, given.global_batch)
    if layout is not None:
        return layout.validate(cluster.world_size, cfg, given.global_batch, seq_len), ""
    constraints = search_constraints(argparse.Namespace(**NO_LIMITS), fixed, stated,
                                     micro_batch, cfg)
    result = search(cfg, cluster, seq_len, given.global_batch, constraints,
                    given.precision_rule())
    if not result.ranked:
        raise ParaxisError(f"no layout with {given.layout} fits {cfg.name} on "
                           f"{cluster.world_size} x {cluster.gpu.name}; give another --layout "
                           "or more GPUs")
    return result.ranked[0].layout, (f" (--layout {flag} completed by the planner: its "
                                     f"fastest on {hardware_text(cluster, given.cluster_preset)})")


def run(args: argparse.Namespace) -> int:
    inputs.check_numbers(args)
    if args.move_to_gpus_per_node is not None and args.move_to_gpus_per_node < 1:
        raise ParaxisError(f"--move-to-gpus-per-node {args.move_to_gpus_per_node} must be at "
                           "least 1; leave it out to keep the nodes as before")
    moving = args.move_to is not None or args.move_to_gpus_per_node is not None
    if args.move_to is not None:
        # they would lie over the cluster moved to (a preset beneath a file and flags), so the
        # move would price the same hardware on both sides
        fixed = [flag for flag, value in (
            ("--hardware", args.hardware), ("--gpu", args.gpu), ("--nvlink-gbps",
                                                                  args.nvlink_gbps),
            ("--network-gbps", args.network_gbps), ("--nics-per-node", args.nics_per_node),
            ("--collective-algorithm", args.collective_algorithm)) if value is not None]
        if fixed:
            raise ParaxisError(f"--move-to {args.move_to} with {', '.join(fixed)}: those "
                               "describe the hardware on both sides of the move, so nothing "
                               "would move; give the hardware before as --cluster, or leave "
                               "them out")
    if args.before_dir is not None and args.run_dir is None:
        raise ParaxisError(f"--before needs --run, the run after the change; {USAGE}")
    if args.before_dir is not None or moving:
        lines = diagnose_move(args)
    elif args.run_dir is not None:
        lines = diagnose_end(args)
    else:
        raise ParaxisError(f"nothing to diagnose; {USAGE}")
    for label, sentence in lines:
        print(f"{label}: {sentence}")
    return 0


def diagnose_end(args: argparse.Namespace) -> list[tuple[str, str]]:
    """How the run in --run ended (paraxis/show/report/run_health.py)."""
    from paraxis.files.checkpoint_manifest import complete_checkpoints
    from paraxis.files.run_records import load_metrics
    from paraxis.show.report.run_health import (
        Device,
        MemoryForecast,
        RunEnd,
        diagnose_run,
        lighter_layouts,
    )
    from paraxis.train.run_file import read_run_file
    from paraxis.train.run_hardware import is_cpu

    run = find_run(args.run_dir, "--run")
    records = load_metrics(run.metrics)
    given = plan_inputs(args, run)
    config = read_run_file(run.config) if run.config else None
    end = RunEnd(None, None, None)
    if config is not None:
        checkpoints = complete_checkpoints(Path(config.checkpoint.dir)) \
            if config.checkpoint.dir else []
        end = RunEnd(config.train.steps, checkpoints[-1][0] if checkpoints else None,
                     config.train.on_nan, config.checkpoint.exit_after,
                     bool(config.checkpoint.dir))
    given = with_ranks(given)
    cluster = given.cluster()
    forecast = None
    if given.layout is not None:
        layout, completed = whole_layout(given, cluster, args.layout)
        cfg, precision = given.model_config(), given.precision_rule()
        seq_len = given.sequence_length(cfg)

        def price(option: Layout) -> Estimate:
            return evaluate(cfg, option, cluster, seq_len, given.global_batch, precision)

        lighter = lighter_layouts(layout, cfg, given.global_batch, seq_len)
        forecast = MemoryForecast(layout, hardware_text(cluster, given.cluster_preset)
                                  + completed, price(layout),
                                  [(name, price(option)) for name, option in lighter])
    # what the run measured: a CPU run's peaks are resident sets, whatever it is priced on
    on_cpu = is_cpu(cluster) or any(r.get("device") == "cpu" for r in records)
    device = Device(cluster.gpu.memory_bytes, capacity_source(args, cluster), on_cpu,
                    is_cpu(cluster))
    lines = [("Run", f"{run.metrics}" + (f" and {run.config.name}" if run.config else
                                         " (no config.toml beside it)"))]
    return lines + diagnose_run(records, end, device, forecast)


def diagnose_move(args: argparse.Namespace) -> list[tuple[str, str]]:
    """Why the after side is slower (paraxis/show/report/slowdown.py): two runs, each its
    own layout, or one layout (--layout, or the run's) moved to the hardware after."""
    from paraxis.files.run_records import load_metrics, steady
    from paraxis.plan.search import search
    from paraxis.show.report.slowdown import Side, diagnose_slowdown

    two_runs = args.before_dir is not None
    if two_runs and args.layout:  # one layout for both would divide a run by GPUs it lacked
        raise ParaxisError("--layout prices one layout on both sides; with --before each "
                           "run's config.toml gives its own: leave --layout out (or give one "
                           "run and --move-to for a what-if)")
    after_run = find_run(args.run_dir, "--run") if args.run_dir else None
    before_run = find_run(args.before_dir, "--before") if two_runs else after_run
    before_given = with_ranks(plan_inputs(args, before_run))
    after_given = with_ranks(dataclasses.replace(
        plan_inputs(args, after_run), cluster_preset=args.move_to or before_given.cluster_preset,
        gpus_per_node=args.move_to_gpus_per_node or before_given.gpus_per_node))
    if before_given.layout is None or after_given.layout is None:
        raise ParaxisError("no layout to price: give --layout (e.g. dp=8,tp=8,pp=2), or "
                           "--run and --before folders with their config.toml")
    before_cluster, after_cluster = before_given.cluster(), after_given.cluster()
    layout, completed = whole_layout(before_given, before_cluster, args.layout)
    after_layout = (whole_layout(after_given, after_cluster, args.layout)[0] if two_runs
                    else layout.validate(after_cluster.world_size))

    def side(given: inputs.PlanInputs, cluster: Cluster, layout: Layout,
             run: RunFolder | None) -> Side:
        cfg = given.model_config()
        estimate = evaluate(cfg, layout, cluster, given.sequence_length(cfg),
                            given.global_batch, given.precision_rule())
        measured = steady(load_metrics(run.metrics), "tokens_per_s") if run else None
        return Side(hardware_text(cluster, given.cluster_preset), cluster, estimate, measured,
                    str(run.metrics) if run else "")

    before = side(before_given, before_cluster, layout, before_run if two_runs else None)
    after = side(after_given, after_cluster, after_layout, after_run if two_runs else None)
    cfg = after_given.model_config()
    try:
        result = search(cfg, after_cluster, after_given.sequence_length(cfg),
                        after_given.global_batch, precision=after_given.precision_rule())
        best = result.ranked[0] if result.ranked else None
    except ParaxisError:
        best = None  # no layout satisfies the rules there: none to offer
    return ([("Move", f"{before.hardware} -> {after.hardware}{completed}")]
            + diagnose_slowdown(before, after, best))
