"""Pictures and traces: the facts they draw come from the layout, planner and schedules."""

import json

import pytest
from matplotlib.figure import Figure

from paraxis.files.trace import check_events, from_chrome_trace, load_trace, to_chrome_trace
from paraxis.plan.memory import model_state_bytes
from paraxis.show.viz.grid import plot_rank_grid, rank_roles
from paraxis.show.viz.memory import plot_stage_memory, plot_zero_memory, unit_for, zero_rows
from paraxis.show.viz.pipeline import (
    compare_schedules,
    measured_bubble,
    predicted_vs_measured,
    timeline_events,
)
from paraxis.show.viz.ring import plot_ring
from paraxis.show.viz.tp_split import COLUMN, ROW, VOCAB, WHOLE, plot_tp_split, split_weights
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import PRESETS
from paraxis.spec.schedules import build_schedule


def assert_readable(fig: Figure) -> None:
    """What a new reader needs: a title, and every visible axes labelled on both sides."""
    assert fig._suptitle is not None and fig._suptitle.get_text()
    for ax in fig.axes:
        if not ax.get_visible() or ax.get_label() == "<colorbar>":
            continue
        assert ax.get_xlabel() or ax.get_xticklabels(), "x axis without a label"
        assert ax.get_ylabel(), f"axes {ax.get_title()!r} has no y label"


def _simulated(kind="1f1b", stages=4, microbatches=8, virtual=1):
    schedule = build_schedule(kind, stages, microbatches, virtual)
    return schedule, schedule.simulate(1e-3, 2e-3, 0.0)


def test_simulated_timeline_becomes_one_event_per_compute_action():
    schedule, timeline = _simulated("interleaved", 4, 8, 2)
    events = check_events(timeline_events(timeline))
    compute = [e for e in events if e["kind"] in ("F", "B")]
    assert len(compute) == 2 * 4 * 8 * 2
    for stage in range(4):  # per stage, in the schedule's order
        order = [(e["kind"], e["microbatch"], e["chunk"]) for e in compute
                 if e["stage"] == stage]
        assert order == [(a.kind, a.microbatch, a.chunk)
                         for a in schedule.compute_order(stage)]
    # The measured-bubble code agrees with the simulator's own figure on simulated events.
    assert measured_bubble(events) == pytest.approx(timeline.bubble_fraction)


def test_chrome_trace_is_valid_and_round_trips():
    _, timeline = _simulated()
    events = timeline_events(timeline)
    trace = json.loads(json.dumps(to_chrome_trace(events)))
    assert isinstance(trace["traceEvents"], list)
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(complete) == len(events)
    for e in complete:
        assert {"name", "ph", "ts", "dur", "pid", "tid"} <= set(e)
        assert e["ts"] >= 0 and e["dur"] >= 0
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert names == {f"rank {s} (stage {s})" for s in range(4)}
    back = from_chrome_trace(trace)
    assert [(e["rank"], e["kind"], e["microbatch"]) for e in back] == \
        [(e["rank"], e["kind"], e["microbatch"]) for e in events]
    for a, b in zip(back, events, strict=True):
        assert a["end_s"] - a["start_s"] == pytest.approx(b["end_s"] - b["start_s"], abs=1e-9)


def test_trace_reader_names_what_is_wrong(tmp_path):
    with pytest.raises(ParaxisError, match="lacks"):
        check_events([{"rank": 0, "kind": "F"}])
    with pytest.raises(ParaxisError, match="kind"):
        check_events([{"rank": 0, "stage": 0, "kind": "X", "microbatch": 0, "chunk": 0,
                       "start_s": 0, "end_s": 1}])
    bad = tmp_path / "trace.json"
    bad.write_text("{not json")
    with pytest.raises(ParaxisError, match="cannot read trace"):
        load_trace(bad)


def test_rank_grid_roles_are_the_layouts_coordinates():
    layout = Layout(dp=2, tp=4, pp=2)
    roles = rank_roles(layout, gpus_per_node=8)
    assert [(r["dp"], r["tp"], r["pp"]) for r in roles] == \
        [(c.dp_rank, c.tp_rank, c.pp_rank) for c in map(layout.coords, range(16))]
    assert [r["node"] for r in roles] == [r // 8 for r in range(16)]
    assert_readable(plot_rank_grid(layout, 8))
    assert_readable(plot_rank_grid(Layout(dp=64, tp=8, pp=1), 8))  # unlabelled, large


def test_rank_grid_draws_hybrid_shard_groups():
    """Each shard group is bracketed and named; every cell names its group (dp3/g1), which
    is `Layout.groups("dp_shard")`'s; the copy of each rank is its index in its replicate
    group."""
    from paraxis.show.viz.grid import cell_label

    layout = Layout(dp=4, dp_shard=2, zero=3, tp=2)
    roles = rank_roles(layout, gpus_per_node=4)
    groups = layout.groups("dp_shard")
    for role in roles:
        group = next(i for i, g in enumerate(sorted(groups)) if role["rank"] in g)
        assert f"dp{role['dp']}/g{role['copy']} " in cell_label(layout, role["rank"], 4)
        assert role["copy"] == group // layout.tp  # groups sorted: g0's tp groups first
    figure = plot_rank_grid(layout, 4)
    texts = [t.get_text() for ax in figure.axes for t in ax.texts]
    assert "shard group 0" in texts and "shard group 1" in texts
    assert "hybrid sharding: dp 4 = 2 shard groups × 2 dp ranks" in figure._suptitle.get_text()
    assert_readable(figure)
    assert_readable(plot_rank_grid(Layout(dp=4, dp_shard=2, zero=1, cp=2), 8))


def test_tp_split_agrees_with_the_tensor_parallel_plan():
    from paraxis.model.transformer import parameter_shapes
    from paraxis.parallel.tensor.apply import tp_plan, tp_split_dim

    dims = {COLUMN: 0, VOCAB: 0, ROW: 1, WHOLE: None}
    moe = PRESETS["tiny-moe-shared"].replace(first_dense_layers=1)
    for cfg in (PRESETS["tiny"], PRESETS["tiny-llama"], PRESETS["tiny-moe"], moe):
        for split in (False, True) if cfg.is_moe else (False,):
            weights, shapes = split_weights(cfg, split), parameter_shapes(cfg)
            names = {w.name for w in weights}
            assert "blocks.0.attn.o.weight" in names
            # the dense MLP where block 0 has one; one expert of the first MoE block
            assert ("blocks.0.mlp.up.weight" in names) == (not cfg.is_moe_layer(0))
            assert any(".moe.experts.0.down" in n for n in names) == cfg.is_moe
            for w in weights:  # a real parameter, split along the dim the runtime splits
                assert shapes[w.name] == (w.out_features, w.in_features), w.name
                assert tp_split_dim(w.name, tp_plan(split)) == dims[w.style], w.name
            fig = plot_tp_split(cfg, 2, etp=2 if split else 1)
            assert_readable(fig)
            assert ("etp=" in fig._suptitle.get_text()) == cfg.is_moe
    w = next(w for w in split_weights(PRESETS["tiny"]) if w.name.endswith("down.weight"))
    assert (w.split_dim, w.slice_of(1, 2)) == (1, (128, 256))


def test_zero_chart_draws_the_planners_numbers():
    rows = zero_rows(7_000_000_000, 8)
    assert rows == [model_state_bytes(7_000_000_000, 8, z) for z in range(4)]
    # seeds' table: 112, 38.5, 26.25, 14 GB
    assert [round(sum(r.values()) / 1e9, 2) for r in rows] == [112.0, 38.5, 26.25, 14.0]
    fig = plot_zero_memory(7_000_000_000, 8, 80e9, "a100-80gb", model_name="7B")
    assert_readable(fig)
    assert any(line.get_label() == "a100-80gb capacity" for line in fig.axes[0].lines)
    assert unit_for(5e6) == ("MB", 1e6)
    assert_readable(plot_stage_memory([{"params": 1e9, "activations": 2e9}] * 2, 80e9, "gpu",
                                      "pp=2"))


def test_schedule_comparison_and_predicted_vs_measured_are_readable():
    fig, shown = compare_schedules(4, 8, 1e-3, 2e-3)
    assert_readable(fig)
    bubbles = {kind: s.bubble_fraction for kind, s in shown.items()}
    assert set(bubbles) == {"gpipe", "1f1b", "interleaved"}
    assert bubbles["interleaved"] < bubbles["1f1b"]  # the reason interleaving exists
    assert bubbles["1f1b"] == pytest.approx(build_schedule("1f1b", 4, 8).bubble_fraction(
        1e-3, 2e-3))
    assert shown["1f1b"].peak_in_flight == 4 < shown["gpipe"].peak_in_flight == 8
    _, timeline = _simulated()
    fig, predicted, measured = predicted_vs_measured(timeline_events(timeline), "1f1b", 8)
    assert_readable(fig)
    assert predicted == pytest.approx(measured)  # the same schedule and the same costs
    assert_readable(plot_ring(4))


def test_the_report_draws_a_ring_of_three_as_three():
    """Only a ring of 2 is a plain swap: dp=3 was drawn as 4 ranks, 'a plain exchange'."""
    from paraxis.show.report.pictures import ring_ranks

    assert [ring_ranks(dp) for dp in (1, 2, 3, 5, 64)] == [4, 4, 3, 5, 8]
    assert_readable(plot_ring(3))


def test_run_picture_puts_its_legend_under_the_panels():
    from paraxis.show.viz.run import plot_run

    records = [{"step": s, "loss": 5 - s / 10, "tokens_per_s": 9000 + 100 * s,
                "peak_mem_bytes": 4.2e8} for s in range(12)]
    fig = plot_run(records, 8000.0, "8 CPU ranks", 5.6e7, device="rank")
    assert_readable(fig)
    assert all(ax.get_legend() is None for ax in fig.axes)  # nothing drawn over the lines
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [
        "measured throughput", "predicted (8 CPU ranks)", "measured peak (rank 0)"]
    assert fig.axes[1].get_yscale() == "linear"  # like-for-like: no log scale needed
    assert unit_for(2.5e5) == ("MB", 1e6)  # a small model's states: 0.25 MB, not kB


def test_measured_timeline_draws_one_rank_per_stage():
    # Two ranks per stage (a dp=2 pipeline): their identical bars would pile up in one lane.
    _, timeline = _simulated("1f1b", 2, 4)
    events = timeline_events(timeline)
    twins = events + [{**e, "rank": e["rank"] + 2} for e in events]
    fig, predicted, measured = predicted_vs_measured(twins, "1f1b", 4)
    assert predicted == pytest.approx(measured)
    title = fig.axes[1].get_title(loc="left")
    assert "ranks 0, 1: one per stage" in title
    bars = [c for c in fig.axes[1].collections if len(c.get_paths())]
    assert len(bars) == len(events)


def _figure_texts(fig: Figure) -> str:
    """Every string drawn on `fig`: titles, axis labels, legends and their titles."""
    return " ".join(t.get_text() for t in fig.findobj(lambda a: hasattr(a, "get_text")))


def test_pictures_of_cpu_ranks_use_no_gpu_terms():
    # A CPU rank reserves its process baseline, not a CUDA context, and a node holds ranks
    row = {"params": 1e6, "activations": 2e6, "reserved": 2.4e8}
    cpu = _figure_texts(plot_stage_memory([row] * 2, 3e9, "RAM share", "dp=2", device="rank"))
    assert "CUDA" not in cpu and "process baseline" in cpu
    assert "CUDA context" in _figure_texts(plot_stage_memory([row] * 2, 80e9, "a100", "dp=2"))
    grid = _figure_texts(plot_rank_grid(Layout(dp=2, tp=2, pp=2), 8, "rank"))
    assert "8 ranks per node" in grid and "GPU" not in grid
    assert "8 GPUs per node" in _figure_texts(plot_rank_grid(Layout(dp=2, tp=2, pp=2), 8))
