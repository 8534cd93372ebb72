"""`paraxis report`: one self-contained HTML file with the plan, its defence, the pictures,
and, given a run directory, what was measured next to what was predicted.

    paraxis report --model gpt2-1.5b --gpus 16 --out report.html
    paraxis report --model tiny --gpus 1 --layout dp=1 --run runs/demo --out runs/demo/report.html
    paraxis report --model tiny --gpus 2 --layout dp=2 --run runs/m --hardware profile.json \
                   --precision fp32        # predicted on this machine (`paraxis calibrate`)

The file needs no network to view: CSS is inline, pictures are data: URIs, there are no
scripts or web fonts. Every number comes from the planner, the schedules or the simulators;
this module only arranges them.
"""

from __future__ import annotations

import argparse
import base64
import json
from dataclasses import dataclass
from pathlib import Path

from paraxis.errors import ParaxisError
from paraxis.layout import Layout
from paraxis.model_config import ModelConfig, load_model_config
from paraxis.plan.comm import axis_link
from paraxis.plan.compute import mfu
from paraxis.plan.cost import PREDICTION_TOLERANCE, Estimate, evaluate
from paraxis.plan.hardware import Cluster, build_cluster, load_hardware_file
from paraxis.plan.memory import layout_memory, model_state_bytes, stage_params
from paraxis.plan.precision import PRECISIONS
from paraxis.plan.search import SearchResult, search


@dataclass(frozen=True)
class PlanInputs:
    """What the plan is for: the same inputs `paraxis plan` takes."""

    model: str = "tiny"
    gpus: int = 1
    gpu: str = "a100-80gb"
    gpus_per_node: int = 8
    seq_len: int | None = None  # None: the model's context length
    global_batch: int = 16
    layout: Layout | str | None = None  # None: the planner's choice
    hardware: str | None = None  # a --hardware file, e.g. the profile `paraxis calibrate` wrote
    precision: str = "mixed"  # "fp32" for a run trained in fp32 (paraxis train's default)


@dataclass
class Plan:
    inputs: PlanInputs
    cfg: ModelConfig
    cluster: Cluster
    seq_len: int
    layout: Layout
    estimate: Estimate
    search: SearchResult | None  # None when the search found nothing that fits
    chosen_by: str  # "planner" or "user"


def make_plan(inputs: PlanInputs) -> Plan:
    cfg = load_model_config(inputs.model)
    overrides = load_hardware_file(inputs.hardware) if inputs.hardware else None
    cluster = build_cluster(inputs.gpu, inputs.gpus, inputs.gpus_per_node, overrides)
    if inputs.precision not in PRECISIONS:
        raise ParaxisError(f"--precision {inputs.precision!r} is unknown; use mixed or fp32")
    precision = PRECISIONS[inputs.precision]
    seq_len = inputs.seq_len or cfg.max_seq_len
    if seq_len > cfg.max_seq_len:
        raise ParaxisError(f"--seq-len {seq_len} is over {cfg.name}'s context of "
                           f"{cfg.max_seq_len}; use --seq-len {cfg.max_seq_len} or less")
    try:
        result: SearchResult | None = search(cfg, cluster, seq_len, inputs.global_batch,
                                             precision=precision)
    except ParaxisError:
        result = None  # no layout satisfies the rules; a user layout may still be given
    if inputs.layout is not None:
        layout = inputs.layout if isinstance(inputs.layout, Layout) \
            else Layout.parse(inputs.layout)
        chosen_by = "user"
    elif result and result.ranked:
        layout, chosen_by = result.ranked[0].layout, "planner"
    else:
        reason = "" if result is None else \
            f" ({len(result.too_big)} layouts priced, none fits in memory)"
        raise ParaxisError(f"the planner found no layout for {cfg.name} on {cluster.world_size}"
                           f" x {cluster.gpu.name}{reason}; add GPUs or give --layout")
    layout.validate(cluster.world_size, cfg, inputs.global_batch, seq_len)
    estimate = evaluate(cfg, layout, cluster, seq_len, inputs.global_batch, precision)
    return Plan(inputs, cfg, cluster, seq_len, layout, estimate, result, chosen_by)


# ------------------------------------------------------------------------------ text


def _gb(value: float) -> str:
    return f"{value / 1e9:.3g} GB" if value >= 1e8 else f"{value / 1e6:.3g} MB"


def _layout(layout: Layout) -> str:
    """Layout text that a table cell can wrap after each comma."""
    return str(layout).replace(",", ", ")


def _ms(value: float) -> str:
    """Seconds in the unit that keeps 1-4 digits before the point."""
    if value >= 1:
        return f"{value:.4g} s"
    if value >= 1e-3 or value == 0:
        return f"{value * 1e3:.4g} ms"
    return f"{value * 1e6:.4g} µs"


def _plan_section(plan: Plan) -> str:
    from paraxis.viz.html import esc, table

    e, cfg, cluster = plan.estimate, plan.cfg, plan.cluster
    inputs = table(["input", "value"], [
        ("model", f"{cfg.name} ({cfg.style}, {cfg.num_params() / 1e6:,.1f} M parameters, "
                  f"{cfg.n_layers} layers, d_model {cfg.d_model})"),
        ("hardware", f"{cluster.world_size} x {cluster.gpu.name} ({cluster.nodes} node(s) of "
                     f"{cluster.gpus_per_node}), {_gb(cluster.gpu.memory_bytes)} each"),
        ("batch", f"{plan.inputs.global_batch} sequences of {plan.seq_len} tokens per step"),
    ])
    memory = table(["component", "per GPU (busiest stage)"],
                   [(k, _gb(v)) for k, v in e.memory.items() if k not in ("stage", "total")]
                   + [("total", f"{_gb(e.memory['total'])} of {_gb(e.memory_limit_bytes)}")])
    time = table(["part of the step", "seconds", "share"],
                 [(k, _ms(v), f"{v / e.step_time_s:.0%}") for k, v in e.time.items()
                  if k in ("compute", "tp", "pp", "dp", "bubble", "optimizer") and v > 0]
                 + [("step", _ms(e.step_time_s), "100%")])
    who = "chosen by the planner (fastest layout that fits)" if plan.chosen_by == "planner" \
        else "given by the user"
    fits = '<span class="good">fits</span>' if e.fits else '<span class="bad">does not fit</span>'
    return (f"{inputs}<p class=\"callout\">Layout <code>{esc(plan.layout)}</code>, {esc(who)}"
            f": {fits} in memory; predicted {e.tokens_per_s:,.0f} tokens/s, step "
            f"{_ms(e.step_time_s)}, MFU {e.mfu:.1%} (micro-batch {e.micro_batch} sequences)."
            f"</p><h3>Memory per GPU</h3>{memory}<h3>Step time</h3>{time}")


def _defence_section(plan: Plan) -> str:
    from paraxis.viz.html import esc, table

    result, e = plan.search, plan.estimate
    parts = []
    if result is None:
        return "<p>The planner's search found no layout that satisfies the rules.</p>"
    parts.append(f"<p>The planner priced {result.considered} layouts for "
                 f"{plan.cluster.world_size} GPUs: {len(result.ranked)} fit, "
                 f"{len(result.too_big)} do not fit in memory, "
                 f"{len(result.rule_breakers)} break a rule.</p>")
    rows = [(i + 1, _layout(c.layout), _ms(c.step_time_s), f"{c.tokens_per_s:,.0f}",
             f"{c.mfu:.1%}", _gb(c.memory["total"]))
            for i, c in enumerate(result.top(6))]
    parts.append("<h3>Fastest layouts that fit</h3>" + table(
        ["rank", "layout", "step", "tokens/s", "MFU", "memory/GPU"], rows))
    if plan.chosen_by == "user" and result.ranked:
        best = result.ranked[0]
        gap = e.step_time_s / best.step_time_s - 1
        parts.append(f"<p>The layout shown was given by hand; the planner's best, "
                     f"<code>{esc(best.layout)}</code>, is predicted {gap:+.0%} faster "
                     "than it.</p>" if gap > 0.005 else
                     "<p>The layout given by hand is as fast as the planner's best.</p>")
    if result.too_big:
        parts.append("<h3>Faster, but too big</h3>" + table(
            ["layout", "would take", "why not"],
            [(_layout(r.layout), _ms(r.estimate.step_time_s) if r.estimate else "-", r.reason)
             for r in result.too_big[:4]]))
    reasons: dict[str, str] = {}
    for r in result.rule_breakers:
        reasons.setdefault(r.reason, str(r.layout))
    if reasons:
        parts.append("<h3>Ruled out</h3>" + table(
            ["example layout", "rule"],
            [(lay.replace(",", ", "), why) for why, lay in list(reasons.items())[:5]]))
    links = []
    for axis in ("tp", "pp", "dp"):
        if getattr(plan.layout, axis) > 1:
            link = axis_link(plan.layout, axis, plan.cluster)
            where = "crosses nodes (network)" if link.crosses_nodes else "stays in a node"
            links.append(f"{axis} group of {getattr(plan.layout, axis)} {where}, "
                         f"{link.bandwidth_Bps / 1e9:.0f} GB/s")
    if links or e.notes:
        parts.append("<h3>Why this shape</h3><ul>" + "".join(
            f"<li>{esc(x)}</li>" for x in links + e.notes) + "</ul>")
    return "".join(parts)


# -------------------------------------------------------------------------- pictures


def _pictures(plan: Plan) -> list[tuple[str, str, str]]:
    from paraxis.viz.grid import plot_rank_grid
    from paraxis.viz.html import figure
    from paraxis.viz.memory import plot_stage_memory, plot_zero_memory
    from paraxis.viz.pipeline import compare_schedules
    from paraxis.viz.ring import plot_ring
    from paraxis.viz.style import figure_data_uri
    from paraxis.viz.tp_split import plot_tp_split

    layout, cfg, e, gpu = plan.layout, plan.cfg, plan.estimate, plan.cluster.gpu
    sections = []
    grid = figure(figure_data_uri(plot_rank_grid(layout, plan.cluster.gpus_per_node)),
                  "3D rank grid", "Every rank's (dp, tp, pp) coordinates from Layout.coords, "
                  "the function the runtime builds its process groups from.")
    sections.append(("grid", "3D rank grid", grid))

    tp = layout.tp if layout.tp > 1 else 2
    note = "" if layout.tp > 1 else (" This plan uses tp=1 (every rank holds whole weights); "
                                     "the picture shows tp=2 to illustrate.")
    sections.append(("tp", "Tensor-parallel split", figure(
        figure_data_uri(plot_tp_split(cfg, tp)), "tensor-parallel split",
        "Column-parallel layers split output features, row-parallel ones input features; "
        "one all-reduce joins them (Megatron-LM)." + note)))

    if layout.pp > 1:
        m = layout.microbatches
        slot = e.time["compute"] / m
        # The planner prices a backward at twice its forward (Narayanan et al. 2021, App.).
        forward, backward = slot / 3, 2 * slot / 3
        comm = e.time["pp_total"] / m / (2 * layout.virtual_stages)
        fig, _ = compare_schedules(layout.pp, m, forward, backward, comm,
                                   virtual=max(layout.virtual_stages, 2),
                                   cost_note="F, B and sends priced by the planner")
        caption = (f"This plan runs {layout.schedule}; the three schedules for the same "
                   f"{layout.pp} stages and {m} microbatches, priced by the planner: forward "
                   f"{_ms(forward)}, backward {_ms(backward)}, one send {_ms(comm)} per "
                   "microbatch.")
        if comm > forward:
            caption += (" Sends take longer than forwards here: the stages wait on messages "
                        "(grey), so the model is too small for this pipeline.")
    else:
        fig, _ = compare_schedules(4, 8, 1.0, 2.0, 0.0, virtual=2,
                                   cost_note="illustration: F = 1, B = 2 units",
                                   time_unit="forward units")
        caption = ("This plan has no pipeline (pp=1); the schedules are shown for 4 stages "
                   "and 8 microbatches with a backward twice as long as a forward.")
    sections.append(("pipeline", "Pipeline schedules", figure(
        figure_data_uri(fig), "pipeline schedules", caption)))

    per_gpu = max(stage_params(cfg, layout.pp)) / layout.tp
    zero = figure(figure_data_uri(plot_zero_memory(
        round(per_gpu), layout.dp, gpu.memory_bytes, gpu.name,
        model_name=f"{cfg.name}, one GPU's tp/pp shard")), "ZeRO memory",
        "Parameters, gradients and optimizer states per GPU under each ZeRO stage (planner: "
        "plan.memory), against the GPU's capacity. Activations come on top (next picture).")
    rows, labels = [], []
    for stage, params in enumerate(stage_params(cfg, layout.pp)):
        # TP splits every matrix over tp (Shoeybi et al. 2019), as plan.memory counts it.
        rows.append(model_state_bytes(round(params / layout.tp), layout.dp, layout.zero))
        labels.append(f"stage {stage}\nmodel states")
    worst = layout_memory(cfg, layout, plan.seq_len, e.micro_batch)
    rows.append({k: v for k, v in worst.items() if k not in ("stage", "total")})
    labels.append(f"stage {int(worst['stage'])}\neverything")
    stages = figure(figure_data_uri(plot_stage_memory(
        rows, gpu.memory_bytes, gpu.name, _layout(layout), labels)), "memory per stage",
        "Model states on every pipeline stage, and the planner's full count (activations, "
        "buffers, reserved) for the stage that needs the most: the one that must fit.")
    sections.append(("memory", "Memory", zero + stages))

    ranks = min(layout.dp, 8) if layout.dp > 1 else 4
    sync = (f"The planner prices this plan's gradient sync over dp={layout.dp} at "
            f"{_ms(e.time.get('dp_total', 0.0))} per step." if layout.dp > 1 else
            "This plan has dp=1, so no gradient all-reduce; the picture shows 4 ranks.")
    sections.append(("ring", "Ring all-reduce", figure(
        figure_data_uri(plot_ring(ranks)), "ring all-reduce",
        f"The gradient all-reduce of a {ranks}-rank data-parallel group, step by step "
        f"(`paraxis ring --ranks {ranks}` prints the values). {sync}")))
    return sections


# ------------------------------------------------------------------------------- run


def _find_trace(run_dir: Path) -> Path | None:
    candidates = sorted(run_dir.glob("*trace*.json"))
    return candidates[0] if candidates else None


def _run_section(plan: Plan, run_dir: Path) -> str:
    from paraxis.viz.html import esc, figure, table
    from paraxis.viz.pipeline import predicted_vs_measured
    from paraxis.viz.run import load_metrics, plot_run, steady
    from paraxis.viz.style import figure_data_uri
    from paraxis.viz.trace import load_trace, to_chrome_trace

    e, gpu = plan.estimate, plan.cluster.gpu
    records = load_metrics(run_dir / "metrics.jsonl")
    measured_tps = steady(records, "tokens_per_s")
    measured_mem = max(r.get("peak_mem_bytes", 0) for r in records)
    measured_mfu = mfu(plan.cfg, plan.seq_len, measured_tps, plan.cluster.world_size,
                       gpu.peak_flops)
    label = f"{plan.cluster.world_size} x {gpu.name}"
    measured_step = steady(records, "step_time_s")
    error = e.step_time_s / measured_step - 1
    if plan.inputs.hardware:
        whose = (f"Predictions are for {esc(label)} as calibrated in "
                 f"<code>{esc(plan.inputs.hardware)}</code>: a forecast for the machine the "
                 "run ran on, when that is where the profile was measured.")
    else:
        whose = (f"Predictions are for {esc(label)}; a run on other hardware (a CPU, say) is "
                 "compared against them as a reference, not a forecast (give --hardware "
                 "with a `paraxis calibrate` profile of the run's machine for a forecast).")
    parts = [
        f"<p>From <code>{esc(run_dir / 'metrics.jsonl')}</code>: {len(records)} steps "
        f"(medians skip the first steps' warm-up). {whose}</p>",
        f"<p class=\"callout\">Step time: predicted {_ms(e.step_time_s)}, measured "
        f"{_ms(measured_step)}: the prediction is {error:+.0%} off "
        f"({'within' if abs(error) <= PREDICTION_TOLERANCE else 'outside'} "
        f"{PREDICTION_TOLERANCE:.0%}).</p>",
        table(["", "predicted", "measured", "measured / predicted"], [
            ("throughput (tokens/s)", f"{e.tokens_per_s:,.0f}", f"{measured_tps:,.0f}",
             f"{measured_tps / e.tokens_per_s:.3g}"),
            ("step time", _ms(e.step_time_s), _ms(measured_step),
             f"{measured_step / e.step_time_s:.3g}"),
            (f"MFU (of {gpu.name} peak)", f"{e.mfu:.1%}", f"{measured_mfu:.3%}", "-"),
            ("peak memory per GPU", _gb(e.memory["total"]), _gb(measured_mem),
             f"{measured_mem / e.memory['total']:.3g}"),
            ("loss, first -> last step", "-",
             f"{records[0]['loss']:.3f} -> {records[-1]['loss']:.3f}", "-")]),
        figure(figure_data_uri(plot_run(records, e.tokens_per_s, label, e.memory["total"])),
               "run metrics", "Measured on every step (peak memory: rank 0; on a CPU the "
               "process's resident set) against the planner's prediction."),
    ]
    trace_path = _find_trace(run_dir)
    if trace_path is None:
        parts.append("<p class=\"muted\">No trace in the run folder (a file named "
                     "*trace*.json): no measured timeline.</p>")
        return "".join(parts)
    events = load_trace(trace_path)
    virtual = max(ev["chunk"] for ev in events) + 1
    microbatches = max(ev["microbatch"] for ev in events) + 1
    kind = plan.layout.schedule if virtual == 1 or plan.layout.schedule == "interleaved" \
        else "interleaved"
    fig, predicted, measured = predicted_vs_measured(events, kind, microbatches, virtual)
    chrome = base64.b64encode(json.dumps(to_chrome_trace(events)).encode()).decode("ascii")
    parts.append(figure(figure_data_uri(fig), "predicted vs measured timeline",
                        f"{trace_path.name}: bubble predicted {predicted:.0%}, measured "
                        f"{measured:.0%}."))
    parts.append(f'<p><a download="{esc(trace_path.stem)}.chrome.json" '
                 f'href="data:application/json;base64,{chrome}">Save this trace as Chrome '
                 "trace JSON</a> (open it in chrome://tracing or the Perfetto UI).</p>")
    return "".join(parts)


# ---------------------------------------------------------------------------- report


def write_report(out_path: str | Path = "report.html", model: str = "tiny", gpus: int = 1,
                 gpu: str = "a100-80gb", gpus_per_node: int = 8, seq_len: int | None = None,
                 global_batch: int = 16, layout: Layout | str | None = None,
                 run_dir: str | Path | None = None, hardware: str | None = None,
                 precision: str = "mixed") -> Path:
    """Plan (or price the given `layout`), draw everything, add the run in `run_dir` (its
    metrics.jsonl and optional *trace*.json) when given; write one HTML file; return its
    path."""
    from paraxis.viz.html import page

    plan = make_plan(PlanInputs(model, gpus, gpu, gpus_per_node, seq_len, global_batch,
                                layout, hardware, precision))
    sections = [("plan", "Plan", _plan_section(plan)),
                ("defence", "Defence", _defence_section(plan))]
    sections += _pictures(plan)
    if run_dir is not None:
        run_dir = Path(run_dir)
        if not (run_dir / "metrics.jsonl").is_file():
            raise ParaxisError(f"{run_dir} has no metrics.jsonl; give the folder a run wrote "
                               "with `paraxis train --metrics-file DIR/metrics.jsonl`")
        sections.append(("run", "Measured vs predicted", _run_section(plan, run_dir)))
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page(f"paraxis report: {plan.cfg.name} on {plan.cluster.world_size} x "
                        f"{plan.cluster.gpu.name}",
                        f"layout {plan.layout}; written by `paraxis report`", sections))
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = PlanInputs()
    add = parser.add_argument
    add("--model", default=d.model, help="preset name or .json/.toml model file")
    add("--gpus", type=int, default=d.gpus, help="GPUs in all")
    add("--gpu", default=d.gpu, help="GPU preset (see paraxis/plan/hardware.py)")
    add("--gpus-per-node", type=int, default=d.gpus_per_node)
    add("--seq-len", type=int, default=None, help="tokens per sequence (default: the model's "
                                                  "context)")
    add("--global-batch", type=int, default=d.global_batch, help="sequences per step")
    add("--layout", default=None, help="price this layout (e.g. dp=2,tp=2,pp=2) instead of "
                                       "the planner's choice")
    # dest is not "run": the CLI keeps each subcommand's entry point in args.run
    add("--run", dest="run_dir", default=None,
        help="a run folder: metrics.jsonl (+ optional *trace*.json)")
    add("--hardware", default=None,
        help="TOML/JSON hardware file, e.g. the profile `paraxis calibrate` wrote")
    add("--precision", choices=tuple(PRECISIONS), default=d.precision,
        help="bytes per parameter/activation: mixed (bf16 + fp32 Adam) or fp32 (a run "
             "trained with --dtype fp32, paraxis train's default)")
    add("--out", default="report.html", help="the HTML file to write")


def run(args: argparse.Namespace) -> int:
    out = write_report(args.out, args.model, args.gpus, args.gpu, args.gpus_per_node,
                       args.seq_len, args.global_batch, args.layout, args.run_dir,
                       args.hardware, args.precision)
    print(f"report written to {out.resolve()}")
    return 0
