"""A synchronising call's wait on CPU ranks, read at the compute before it (plan/sync_wait.py)."""

from __future__ import annotations

import pytest

from paraxis.plan.comm import axis_link
from paraxis.plan.cost import evaluate
from paraxis.plan.hardware import build_cluster
from paraxis.plan.sync_wait import at_segment, sync_segment_s, sync_wait, wait_at
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import PRESETS
from paraxis.spec.precision import FP32_ADAM

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
    definition at 1024 / 4 tokens, and the backward's calls follow twice that. Priced with a
    curve that is flat at the calibration's figure, the step is the flat profile's; with the
    measured-shape curve it is shorter by exactly the TP calls' lower waits."""
    layout = Layout.parse("dp=2,tp=4").validate(8, MODEL, 16, 128)
    flat, same, curved = (_cpu(c) for c in (None, [[1e-3, 5e-3], [16e-3, 5e-3]], CURVE))
    priced = {name: evaluate(MODEL, layout, c, 128, 16, FP32_ADAM)
              for name, c in (("flat", flat), ("same", same), ("curved", curved))}
    assert priced["same"].time == pytest.approx(priced["flat"].time)
    segment = sync_segment_s(MODEL, 8 * 128 / 4, 1e11)
    assert 1e-3 < segment < 4e-3  # between the curve's points: read on its line
    assert 2e-3 < 2 * segment < 16e-3 and wait_at(CURVE, 2 * segment) > wait_at(CURVE, segment)
    forward, backward = (5e-3 - wait_at(CURVE, s) for s in (segment, 2 * segment))
    # two a pass per layer, forward and backward; the head's vocab-parallel loss (its max
    # and its sum) and its input gradient, and the embedding's sum (plan/head.py), all four
    # read at the half layer
    lower = priced["flat"].time["tp"] - priced["curved"].time["tp"]
    assert lower == pytest.approx((2 * MODEL.n_layers + 4) * forward
                                  + 2 * MODEL.n_layers * backward)
    assert priced["curved"].time["dp"] == pytest.approx(priced["flat"].time["dp"])


def test_a_pipeline_send_waits_after_a_chunks_forward_or_backward():
    """pp=2 of 8 microbatches (1 x 128 tokens): a stage's activation send follows its four
    layers' forward, twice the half layer four times, and its gradient send that chunk's
    backward, twice as long; each pays the curve's wait there instead of the flat figure."""
    layout = Layout.parse("pp=2,microbatches=8,schedule=1f1b").validate(2, MODEL, 8, 128)
    flat, curved = _cpu(None, 2, 2), _cpu(CURVE, 2, 2)
    priced = [evaluate(MODEL, layout, c, 128, 8, FP32_ADAM) for c in (flat, curved)]
    chunk = 2 * sync_segment_s(MODEL, 128, 1e11) * 4
    assert 4e-3 < chunk < 2 * chunk < 16e-3  # both on the curve's second line
    lower = priced[0].time["pp"] - priced[1].time["pp"]
    saved = sum(5e-3 - wait_at(CURVE, after) for after in (chunk, 2 * chunk))
    assert lower == pytest.approx(layout.microbatches * saved)


def test_an_interleaved_send_waits_after_its_chunk_not_its_stage():
    """pp=2 with two chunks a stage: a send follows two layers' forward, half the stage's."""
    layout = Layout.parse("pp=2,microbatches=8,schedule=interleaved,virtual_stages=2"
                          ).validate(2, MODEL, 16, 128)
    flat, curved = _cpu(None, 2, 2), _cpu(CURVE, 2, 2)
    priced = [evaluate(MODEL, layout, c, 128, 16, FP32_ADAM) for c in (flat, curved)]
    chunk = 2 * sync_segment_s(MODEL, 2 * 128, 1e11) * 2
    assert 4e-3 < chunk < 2 * chunk < 16e-3
    saved = sum(5e-3 - wait_at(CURVE, after) for after in (chunk, 2 * chunk))
    lower = priced[0].time["pp"] - priced[1].time["pp"]
    assert lower == pytest.approx(layout.virtual_stages * layout.microbatches * saved)


def test_a_hardware_file_cannot_set_the_planners_segment(tmp_path):
    from paraxis.plan.hardware import load_hardware_file
    from paraxis.spec.errors import ParaxisError

    path = tmp_path / "hw.json"
    path.write_text('{"gpu": "a100-80gb", "sync_segment_s": 0.1}')
    with pytest.raises(ParaxisError, match="unknown key"):
        load_hardware_file(path)


def test_with_sequence_parallelism_each_pass_reads_its_own_segment():
    """dp=2,tp=4,sp=true: four calls a pass per layer (two all-gathers, two reduce-scatters),
    the forward's after half a layer, the backward's after twice that (no re-gathers in
    paraxis's eager runtime); at the ends the loss's two, and two each for the head and the
    embedding (`head.ends_collectives`), read at the half layer."""
    layout = Layout.parse("dp=2,tp=4,sp=true").validate(8, MODEL, 16, 128)
    flat, curved = _cpu(None), _cpu(CURVE)
    priced = [evaluate(MODEL, layout, c, 128, 16, FP32_ADAM) for c in (flat, curved)]
    segment = sync_segment_s(MODEL, 8 * 128 / 4, 1e11)
    forward, backward = (5e-3 - wait_at(CURVE, s) for s in (segment, 2 * segment))
    lower = priced[0].time["tp"] - priced[1].time["tp"]
    assert lower == pytest.approx((4 * MODEL.n_layers + 6) * forward
                                  + 4 * MODEL.n_layers * backward)
    assert priced[0].time["tp_total"] - priced[1].time["tp_total"] == pytest.approx(lower)
