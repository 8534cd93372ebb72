"""A synchronising call's wait on CPU ranks, read at the compute before it (plan/sync.py)."""

from __future__ import annotations

import pytest

from paraxis.layout import Layout
from paraxis.model_config import PRESETS
from paraxis.plan.comm import axis_link
from paraxis.plan.cost import evaluate
from paraxis.plan.hardware import build_cluster
from paraxis.plan.precision import FP32_ADAM
from paraxis.plan.sync import at_segment, sync_segment_s, sync_wait, wait_at

CURVE = [[1e-3, 1e-3], [4e-3, 2e-3], [16e-3, 5e-3]]  # [segment_s, wait_s]
MODEL = PRESETS["small-llama"].replace(name="small-llama-8", n_layers=8)


def _cpu(curve: list | None = None, ranks: int = 8, group: int = 4):
    overrides = {"name": "cpu-core", "peak_flops": 1e11, "hbm_bandwidth_Bps": 2e10,
                 "kernels": "eager", "cores_per_node": 2,
                 "sync_wait_s": {str(ranks): {str(group): 5e-3}}}
    if curve is not None:
        overrides["sync_wait_curve_s"] = {str(ranks): {str(group): curve}}
    return build_cluster("a100-80gb", ranks, ranks, overrides)


def test_the_wait_is_read_between_measured_points_and_held_beyond_them():
    assert wait_at(CURVE, 4e-3) == pytest.approx(2e-3)
    assert wait_at(CURVE, 10e-3) == pytest.approx(3.5e-3)  # halfway from 4 to 16 ms
    assert wait_at(CURVE, 1e-4) == pytest.approx(1e-3)  # shorter than timed: the first point
    assert wait_at(CURVE, 1.0) == pytest.approx(5e-3)  # longer: the last, no extrapolation
    assert wait_at(list(reversed(CURVE)), 10e-3) == pytest.approx(3.5e-3)


def test_a_call_waits_by_the_compute_before_it_where_a_curve_was_timed():
    cluster = _cpu(CURVE)
    assert sync_wait(cluster, 4) == pytest.approx(5e-3)  # no segment: the flat figure
    assert sync_wait(at_segment(cluster, 2.5e-3), 4) == pytest.approx(1.5e-3)
    link = axis_link(Layout(dp=2, tp=4), "tp", at_segment(cluster, 2.5e-3))
    flat = axis_link(Layout(dp=2, tp=4), "tp", cluster)
    assert flat.call_latency_s - link.call_latency_s == pytest.approx(3.5e-3)
    # a profile without a curve, and GPUs, keep the one figure (GPUs: none at all)
    assert sync_wait(at_segment(_cpu(), 2.5e-3), 4) == pytest.approx(5e-3)
    gpus = build_cluster("a100-80gb", 8, overrides={"sync_wait_curve_s": {"8": {"4": CURVE}}})
    assert at_segment(gpus, 2.5e-3) is gpus and sync_wait(gpus, 4) == 0.0


def test_the_planner_prices_a_tp_call_after_half_a_layer_of_its_own_microbatch():
    """dp=2,tp=4 of 16 x 128 tokens: a TP rank's half layer is the calibration's segment
    definition at 1024 / 4 tokens. Priced with a curve that is flat at the calibration's
    figure, the step is the flat profile's; with the measured-shape curve it is shorter by
    exactly the TP calls' lower waits."""
    layout = Layout.parse("dp=2,tp=4").validate(8, MODEL, 16, 128)
    flat, same, curved = (_cpu(c) for c in (None, [[1e-3, 5e-3], [16e-3, 5e-3]], CURVE))
    priced = {name: evaluate(MODEL, layout, c, 128, 16, FP32_ADAM)
              for name, c in (("flat", flat), ("same", same), ("curved", curved))}
    assert priced["same"].time == pytest.approx(priced["flat"].time)
    segment = sync_segment_s(MODEL, 8 * 128 / 4, 1e11)
    assert 1e-3 < segment < 4e-3  # between the curve's points: read on its line
    saved = 5e-3 - wait_at(CURVE, segment)
    # two a pass, forward and backward, per layer; the head's vocab-parallel loss (its max
    # and its sum) and its input gradient (plan/head.py)
    tp_calls = 4 * MODEL.n_layers + 3
    lower = priced["flat"].time["tp"] - priced["curved"].time["tp"]
    assert lower == pytest.approx(tp_calls * saved)
    assert priced["curved"].time["dp"] == pytest.approx(priced["flat"].time["dp"])


def test_a_pipeline_send_waits_after_a_chunks_forward():
    """pp=2 of 8 microbatches (2 x 128 tokens): a stage's send follows its four layers'
    forward, twice the half layer four times; an activation forward and a gradient back
    per microbatch pay the curve's wait there instead of the flat figure."""
    layout = Layout.parse("pp=2,microbatches=8,schedule=1f1b").validate(2, MODEL, 16, 128)
    flat, curved = _cpu(None, 2, 2), _cpu(CURVE, 2, 2)
    priced = [evaluate(MODEL, layout, c, 128, 16, FP32_ADAM) for c in (flat, curved)]
    chunk = 2 * sync_segment_s(MODEL, 2 * 128, 1e11) * 4
    assert 4e-3 < chunk < 16e-3  # on the curve's second line
    sends = 2 * layout.microbatches
    lower = priced[0].time["pp"] - priced[1].time["pp"]
    assert lower == pytest.approx(sends * (5e-3 - wait_at(CURVE, chunk)))


def test_an_interleaved_send_waits_after_its_chunk_not_its_stage():
    """pp=2 with two chunks a stage: a send follows two layers' forward, half the stage's."""
    layout = Layout.parse("pp=2,microbatches=8,schedule=interleaved,virtual_stages=2"
                          ).validate(2, MODEL, 16, 128)
    flat, curved = _cpu(None, 2, 2), _cpu(CURVE, 2, 2)
    priced = [evaluate(MODEL, layout, c, 128, 16, FP32_ADAM) for c in (flat, curved)]
    chunk = 2 * sync_segment_s(MODEL, 2 * 128, 1e11) * 2
    assert 4e-3 < chunk < 16e-3
    sends = 2 * layout.virtual_stages * layout.microbatches
    lower = priced[0].time["pp"] - priced[1].time["pp"]
    assert lower == pytest.approx(sends * (5e-3 - wait_at(CURVE, chunk)))


def test_a_hardware_file_cannot_set_the_planners_segment(tmp_path):
    from paraxis.errors import ParaxisError
    from paraxis.plan.hardware import load_hardware_file

    path = tmp_path / "hw.json"
    path.write_text('{"gpu": "a100-80gb", "sync_segment_s": 0.1}')
    with pytest.raises(ParaxisError, match="unknown key"):
        load_hardware_file(path)
