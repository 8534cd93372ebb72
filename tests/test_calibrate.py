"""`paraxis calibrate`: the alpha-beta fit, the profile the planner reads, the real command."""

import json

import pytest

from paraxis.cli import main
from paraxis.dist.testing import gpu_count
from paraxis.plan.comm import COLLECTIVES as OPS
from paraxis.plan.comm import axis_link, collective_time, latency_steps, ring_factor
from paraxis.plan.hardware import build_cluster, load_hardware_file
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import Layout
from paraxis.train.calibrate.fit import fit_alpha_beta
from paraxis.train.calibrate.profile import build_profile

SIZES = [16e3, 128e3, 1e6, 4e6]


def synthetic(op: str, n: int, alpha: float, bandwidth: float) -> list[float]:
    # the planner's own formula (comm.py): steps * alpha + factor * bytes / bandwidth
    return [latency_steps(op, n) * alpha + ring_factor(op, n) * s / bandwidth for s in SIZES]


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("n", [2, 3, 8])
def test_fit_recovers_alpha_and_bandwidth_exactly(op, n):
    fit = fit_alpha_beta(op, n, SIZES, synthetic(op, n, 37e-6, 1.7e9))
    assert fit.alpha_s == pytest.approx(37e-6, rel=1e-9)
    assert fit.bandwidth_Bps == pytest.approx(1.7e9, rel=1e-9)
    assert fit.max_rel_error < 1e-9


def test_fit_never_returns_negative_latency():
    # a small message that happened to run fast pulls the line's intercept below zero
    times = synthetic("all_reduce", 2, 0.0, 1e9)
    times[0] *= 0.5
    fit = fit_alpha_beta("all_reduce", 2, SIZES, times)
    assert fit.alpha_s == 0.0 and fit.bandwidth_Bps > 0


@pytest.mark.parametrize("args, message", [
    (("all_reduce", 1, SIZES, [1.0] * 4), "at least 2 ranks"),
    (("all_reduce", 2, [1e3, 1e3], [1.0, 1.0]), "two different message sizes"),
    (("all_reduce", 2, SIZES, [1.0, 0.0, 1.0, 1.0]), "positive"),
    (("broadcast", 2, SIZES, [1.0] * 4), "unknown collective"),
])
def test_fit_rejects_what_it_cannot_fit(args, message):
    with pytest.raises(ParaxisError, match=message):
        fit_alpha_beta(*args)


def test_the_planner_prices_a_group_with_its_measured_fit():
    """A profile's fits go through hardware.py into comm.py: the planner then predicts
    exactly the times the fit was made from, for the group size and ranks on the node."""
    timings = {4: {op: {str(n): [list(p) for p in zip(SIZES, synthetic(op, n, a, b),
                                                      strict=True)]
                        for n, a, b in ((2, 1e-4, 2e9), (4, 3e-4, 1e9))} for op in OPS}}
    device = {"name": "cpu-core", "type": "cpu", "memory_bytes": 4e9, "cores": 2,
              "available_cores": 1.5}
    compute = {"matmul": {"flops_per_s": 1e11, "shapes": []}, "attention_flops_per_s": 4e10,
               "elementwise_Bps": 6e9, "dtype": "float32", "shapes_from": {}}
    profile = build_profile(device, compute, timings)
    cluster = build_cluster(gpus=4, overrides={**profile["gpu"], **profile["cluster"]})
    assert cluster.cores_per_node == 2 and cluster.compute_share == pytest.approx(1.5 / 4)
    assert cluster.gpu.peak_flops == 1e11 and cluster.gpu.matmul_efficiency == 1.0
    layout = Layout(dp=2, tp=2)
    tp_link, dp_link = axis_link(layout, "tp", cluster), axis_link(layout, "dp", cluster)
    for op in OPS:
        expected = synthetic(op, 2, 1e-4, 2e9)
        for size, want in zip(SIZES, expected, strict=True):
            assert collective_time(op, size, 2, tp_link) == pytest.approx(want, rel=1e-9)
            assert collective_time(op, size, 2, dp_link) == pytest.approx(want, rel=1e-9)
    whole = axis_link(Layout(dp=4), "dp", cluster)
    assert collective_time("all_gather", 1e6, 4, whole) == pytest.approx(
        synthetic("all_gather", 4, 3e-4, 1e9)[2], rel=1e-9)


def test_calibrate_two_ranks_writes_a_profile_the_planner_loads(tmp_path, capsys):
    out = tmp_path / "profile.json"
    code = main(["calibrate", "--nproc", "2", "--sizes-kb", "4,64", "--repeats", "1",
                 "--model", "tiny-llama", "--tokens", "64", "--seq-len", "32",
                 "--device", "cpu", "--busy-s", "0.2", "--out", str(out)])
    assert code == 0 and f"wrote {out}" in capsys.readouterr().out
    profile = json.loads(out.read_text())
    fits = profile["cluster"]["collectives"]
    assert set(fits) == set(OPS)
    for op in OPS:
        fit = fits[op]["2"]["2"]
        assert fit["alpha_s"] >= 0 and fit["bandwidth_Bps"] > 0
        points = profile["calibration"]["collectives"]["2"][op]["2"]
        assert len(points) == 2 and all(t > 0 for _, t in points)
    gpu = profile["gpu"]
    assert gpu["peak_flops"] > 1e8 and gpu["attention_flops"] > 1e7
    assert gpu["hbm_bandwidth_Bps"] > 1e7 and gpu["kernels"] == "eager"
    assert profile["cluster"]["cores_per_node"] == profile["calibration"]["device"]["cores"]
    assert 0 < profile["cluster"]["available_cores"] <= profile["cluster"]["cores_per_node"]
    assert load_hardware_file(out)["peak_flops"] == gpu["peak_flops"]
    # the sync wait after segments of whole GEMMs (a tiny model's: one GEMM each, one point),
    # the longest the flat figure's
    curve = profile["cluster"]["sync_wait_curve_s"]["2"]["2"]
    segments = [c for c, _ in curve]
    assert segments == sorted(set(segments)) and segments[0] > 0
    assert curve[-1][1] == profile["cluster"]["sync_wait_s"]["2"]["2"] >= 0

    code = main(["plan", "--model", "tiny", "--gpus", "2", "--global-batch", "8",
                 "--seq-len", "32", "--precision", "fp32", "--hardware", str(out),
                 "--layout", "dp=2,microbatches=1", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["hardware"]["gpu"]["name"] == "cpu-core"
    assert doc["hardware"]["cluster"]["collectives"] == fits
    assert 0 < doc["layouts"][0]["time_s"]["step"] < 60


@pytest.mark.parametrize("argv, message", [
    (["--nproc", "two"], "comma list of integers"),
    (["--nproc", "0"], "positive integers"),
    (["--sizes-kb", "64"], "at least two sizes"),
    (["--tokens", "100", "--seq-len", "32"], "multiple of --seq-len"),
    (["--tokens", "1", "--seq-len", "1"], "time at least 8 tokens a sequence and two"),
    (["--tokens", "128", "--seq-len", "128"], "time at least 8 tokens a sequence and two"),
])
def test_calibrate_bad_input_is_one_line(argv, message, capsys):
    assert main(["calibrate", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_latency_bound_times_keep_their_latency():
    """gloo between ranks that outnumber the cores: every call waits ~3 ms for a rank to be
    scheduled, whatever its size, so the times do not grow with it (measured, 8 ranks on 2
    cores, pairs). The fit keeps that latency (through the origin it priced 128 KB at
    0.45 ms, 7x too cheap); the bandwidth is bounded by what the times' scatter could hide."""
    sizes = [4096, 32768, 262144, 1048576]
    times = [3.863e-3, 2.984e-3, 3.385e-3, 3.025e-3]
    fit = fit_alpha_beta("all_reduce", 2, sizes, times)
    assert fit.alpha_s > 0
    for size, seconds in zip(sizes[:3], times[:3], strict=True):
        assert abs(fit.predict(size) / seconds - 1) < 0.35


def test_each_calibrated_rate_is_the_median_of_the_probes():
    """A slow spell during one probe (a shared machine) does not become the profile."""
    from paraxis.train.calibrate.measure import median_probe

    def probe(gemm: float, attention: float, elementwise: float, dispatch: float) -> dict:
        return {"matmul": {"flops_per_s": gemm, "shapes": [gemm]}, "dtype": "float32",
                "attention_flops_per_s": attention, "elementwise_Bps": elementwise,
                "layer_overhead_s": dispatch, "kernel_launch_s": 0.0}

    merged = median_probe([probe(96e9, 40e9, 19e9, 2.8e-3), probe(67e9, 30e9, 16e9, 1.5e-3),
                           probe(90e9, 38e9, 14e9, 1.7e-3)])
    assert merged["matmul"] == {"flops_per_s": 90e9, "shapes": [90e9]}  # that probe's shapes
    assert (merged["attention_flops_per_s"], merged["elementwise_Bps"],
            merged["layer_overhead_s"]) == (38e9, 16e9, 1.7e-3)  # each its own median
    assert [p["matmul_flops_per_s"] for p in merged["probes"]] == [96e9, 67e9, 90e9]


def test_a_profile_serves_a_run_only_at_its_own_models_shapes(tmp_path):
    """The committed profile (small-llama's shapes) does not price a tiny model's run: its
    GEMM rates and per-layer dispatch are another model's."""
    from paraxis.train.calibrate.quick import matches

    path = tmp_path / "hardware-profile.json"
    profile = {
        "cluster": {"collectives": {"all_reduce": {"8": {}}}, "sync_wait_s": {"8": {}}},
        "calibration": {"device": {"type": "cpu", "model": "AMD EPYC", "cores": 2},
                        "compute": {"shapes_from": {"model": "small-llama"}, "matmul": {}},
                        "collectives": {"8": {"all_reduce": {}}}}}
    path.write_text(json.dumps(profile))
    assert matches(path, "AMD EPYC", 2, 8, "small-llama")
    assert not matches(path, "AMD EPYC", 2, 8, "tiny")  # another model's shapes
    assert not matches(path, "Intel Xeon", 2, 8, "small-llama")  # another CPU
    assert not matches(path, "AMD EPYC", 2, 4, "small-llama")  # rank count not timed
    del profile["cluster"]["sync_wait_s"]  # made before calls were timed after compute
    path.write_text(json.dumps(profile))
    assert not matches(path, "AMD EPYC", 2, 8, "small-llama")
    profile["cluster"]["sync_wait_s"] = {"8": {}}
    del profile["calibration"]["collectives"]  # nothing a re-timing after a run could read
    path.write_text(json.dumps(profile))
    assert not matches(path, "AMD EPYC", 2, 8, "small-llama")


def test_a_model_file_of_the_same_name_with_other_shapes_is_another_model(tmp_path,
                                                                         monkeypatch):
    """A profile records what its model holds (`ModelConfig.shape_key`) beside its name: a
    model.json of another project, or the same file edited, does not reuse it, and
    --layout auto keeps each one's calibration in a folder of its own."""
    from paraxis.files.model_file import load_model_config
    from paraxis.spec.model_config import PRESETS
    from paraxis.train.auto_layout import cache_folder
    from paraxis.train.calibrate.quick import matches

    monkeypatch.chdir(tmp_path)
    model = tmp_path / "model.json"
    model.write_text(json.dumps(PRESETS["tiny"].to_dict()))
    first = load_model_config("model.json")
    profile = {"cluster": {"collectives": {}, "sync_wait_s": {}},
               "calibration": {"device": {"type": "cpu", "model": "AMD EPYC", "cores": 2},
                               "compute": {"shapes_from": {"model": "model.json",
                                                           "shape": first.shape_key()},
                                           "matmul": {}}}}
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile))
    assert matches(path, "AMD EPYC", 2, 1, "model.json")
    assert matches(path, "AMD EPYC", 2, 1, "./model.json")  # the same file, spelt otherwise
    saved = tmp_path / "run" / "model.json"  # a run's copy of its model, as report reads it
    saved.parent.mkdir()
    saved.write_text(json.dumps(first.replace(name="another name").to_dict()))
    assert matches(path, "AMD EPYC", 2, 1, str(saved))
    model.write_text(json.dumps(PRESETS["tiny"].replace(d_model=128).to_dict()))
    assert not matches(path, "AMD EPYC", 2, 1, "model.json")
    second = load_model_config("model.json")
    assert first.name == second.name
    assert cache_folder(first, 32, 1) != cache_folder(second, 32, 1)
    del profile["calibration"]["compute"]["shapes_from"]["shape"]  # made before shapes were kept
    path.write_text(json.dumps(profile))
    assert matches(path, "AMD EPYC", 2, 1, "model.json")


def _sync_body(segments_s: list[float], flops_per_s: float) -> tuple[float, float]:
    """On every rank: its own segment alone (seconds, the median of 7), and sync_wait with
    that segment."""
    import statistics
    import time

    import torch
    import torch.distributed as dist

    from paraxis.train.calibrate.collectives import sync_wait

    segment = segments_s[dist.get_rank()]
    a = torch.randn(256, 256)
    gemms = max(1, round(segment * flops_per_s / (2 * 256**3)))
    alone = []
    for _ in range(7):
        started = time.perf_counter()
        for _ in range(gemms):
            a @ a
        alone.append(time.perf_counter() - started)
    return statistics.median(alone), sync_wait(segment, flops_per_s, torch.device("cpu"))


def test_a_call_waits_for_the_rank_that_computes_longer():
    """Rank 1 computes ~30 ms more per cycle than rank 0: a call after the segments waits
    for it, so the wait beyond the idle call is half the difference (the ranks' mean).

    On a host whose cores change speed from one tenth of a second to the next, the idle call
    timed once before the rounds read up to 5 ms where it takes 0.3 (one CI run read a wait
    of 0.0, this VM 0.0 in 2 of 12 launches): so each round times its own.
    A third process on the two cores still moves a launch out of the band (0.32 while
    another process collected the tests beside the suite): up to three launches, one must land
    in it; a sync_wait that did not see the wait, or counted it twice, misses all three."""
    from paraxis.dist.testing import run_distributed

    ratios = []
    for _ in range(3):
        (alone0, wait), (alone1, wait1) = run_distributed(_sync_body, 2,
                                                          ([0.004, 0.034], 5e10))
        assert wait == pytest.approx(wait1)  # one figure for the group
        ratios.append(wait / ((alone1 - alone0) / 2))
        if 0.4 < ratios[-1] < 1.8:
            return
    raise AssertionError(f"the wait over half the difference read {ratios}, not 0.4-1.8")


def test_the_planner_charges_every_call_its_calibrated_wait():
    timings = {2: {op: {"2": [list(p) for p in zip(SIZES, synthetic(op, 2, 1e-4, 2e9),
                                                   strict=True)]} for op in OPS}}
    device = {"name": "cpu-core", "type": "cpu", "memory_bytes": 4e9, "cores": 2}
    compute = {"matmul": {"flops_per_s": 1e11, "shapes": []}, "attention_flops_per_s": 4e10,
               "elementwise_Bps": 6e9, "dtype": "float32", "shapes_from": {}}
    waited = build_profile(device, compute, timings, {2: {"2": 3e-3}})
    assert waited["cluster"]["sync_wait_s"] == {"2": {"2": 3e-3}}
    plain, charged = (build_cluster(gpus=2, overrides={**p["gpu"], **p["cluster"]})
                      for p in (build_profile(device, compute, timings), waited))
    layout = Layout(tp=2)
    for op in OPS:
        extra = (collective_time(op, 1e6, 2, axis_link(layout, "tp", charged), calls=3)
                 - collective_time(op, 1e6, 2, axis_link(layout, "tp", plain), calls=3))
        assert extra == pytest.approx(3 * 3e-3)
    # ranks with devices of their own (GPUs) pay no such wait, even where a file states one
    gpus = build_cluster("a100-80gb", 2, overrides={"sync_wait_s": {"2": {"2": 3e-3}}})
    assert axis_link(layout, "tp", gpus).call_latency_s == 0.0


def test_calibration_sizes_reach_the_largest_message_a_run_sends():
    """Fits extrapolate badly (8 gloo ranks on 2 cores: a 26 MB all-reduce fitted on sizes
    up to 4 MiB at 22 ms; the 32 MiB point now committed took 129 ms), so the default sizes
    pass the DP gradient bucket, and a quick calibration reaches its model's gradients where
    they are larger."""
    from paraxis.files.model_file import load_model_config
    from paraxis.plan.hardware import GPU
    from paraxis.train.calibrate.measure import DEFAULT_SIZES_KB
    from paraxis.train.calibrate.quick import QUICK_SIZES, quick_sizes

    assert max(DEFAULT_SIZES_KB) * 1024 >= GPU.gradient_bucket_bytes
    assert quick_sizes("tiny") == list(QUICK_SIZES)  # 0.9 MB of gradients: covered
    gradients = 4 * load_model_config("small-llama").num_params()
    assert quick_sizes("small-llama") == [*QUICK_SIZES, gradients]


def test_the_bench_before_refits_on_the_small_sizes_only():
    """bench's "small sizes" before prices with fits of the calibration's own times up to
    4 MiB. Latency-bound times up to 4 MiB (as 8 ranks on 2 cores measure) leave the
    bandwidth unknown: the 32 MiB point sets it, and the before does not have it."""
    from bench.befores import small_sizes

    def seconds(size: float) -> float:  # 20 ms a call; 32 MiB takes 5x longer
        return 0.1 if size > 4 * 2**20 else 0.02 * (1 + size / 1e9)

    slow = {op: {"8": [[s, seconds(s)] for s in [*SIZES, 32 * 2**20]]} for op in OPS}
    device = {"name": "cpu-core", "type": "cpu", "memory_bytes": 4e9, "cores": 2}
    compute = {"matmul": {"flops_per_s": 1e11}, "attention_flops_per_s": 4e10,
               "elementwise_Bps": 6e9}
    profile = build_profile(device, compute, {8: slow})
    for fits in (profile, small_sizes(profile)):
        fit = fits["cluster"]["collectives"]["all_reduce"]["8"]["8"]
        priced = latency_steps("all_reduce", 8) * fit["alpha_s"] + ring_factor(
            "all_reduce", 8) * 32 * 2**20 / fit["bandwidth_Bps"]
        # the fit weighs relative errors, so the flat points pull the large one down a little
        assert priced == (pytest.approx(0.1, rel=0.2) if fits is profile else
                          pytest.approx(0.02, rel=0.1))


def test_a_cached_profile_is_timed_again_once_after_its_run(tmp_path, monkeypatch):
    """The demo's profile is made before its run; the report after it probes the cores and
    times the compute again, prices with the means, and keeps them for later reports."""
    from paraxis.train.calibrate import measure as command
    from paraxis.train.calibrate import quick

    cpu, cores = command.cpu_model_name(), command.cpu_cores()
    before = {"peak_flops": 80e9, "attention_flops": 40e9, "hbm_bandwidth_Bps": 20e9,
              "layer_overhead_s": 400e-6}
    after = {"peak_flops": 100e9, "attention_flops": 20e9, "hbm_bandwidth_Bps": 10e9,
             "layer_overhead_s": 800e-6}
    sizes = [4096.0, 1048576.0]
    profile = {"gpu": dict(before),
               "cluster": {"available_cores": 2.0, "collectives": {"all_reduce": {"8": {}}},
                           "sync_wait_s": {"8": {"2": 1e-3}},
                           "sync_wait_curve_s": {"8": {"2": [[1e-3, 0.5e-3], [4e-3, 1e-3]]}}},
               "calibration": {"device": {"type": "cpu", "model": cpu, "cores": cores},
                               "compute": {"shapes_from": {"model": "tiny", "tokens": 2048,
                                                           "seq_len": 128}, "matmul": {}},
                               "collectives": {"8": {"all_reduce": {"2": [[sizes[0], 2e-3],
                                                                          [sizes[1], 6e-3]]}}}}}
    (tmp_path / quick.PROFILE_NAME).write_text(json.dumps(profile))
    probes = []
    again = {"times": {"all_reduce": {"2": [[sizes[0], 4e-3], [sizes[1], 8e-3]]}},
             "sync_wait_s": {"2": 3e-3},
             "sync_wait_curve_s": {"2": [[1e-3, 1.5e-3], [4e-3, 3e-3]]}}
    monkeypatch.setattr(command, "available_cores", lambda *a: probes.append(a) or 1.0)
    monkeypatch.setattr(quick, "_rates_again", lambda shapes: probes.append(shapes) or after)
    monkeypatch.setattr(command, "collectives_again",
                        lambda profile, ranks, repeats: probes.append(ranks) or again)
    monkeypatch.setattr(quick, "COMMITTED", tmp_path / "absent.json")
    monkeypatch.setattr(quick, "StealMeter", _QuietHost)  # this VM's host may be busy now
    for _ in range(2):
        found = quick.profile_for_cpu_run(8, tmp_path, "tiny")
        assert found.how == "cached" and "collectives" in found.describe()
    assert len(probes) == 3  # cores, compute and collectives, once
    saved = json.loads(found.path.read_text())
    assert saved["cluster"]["available_cores"] == 1.5
    assert saved["gpu"] == {k: (before[k] + after[k]) / 2 for k in before}
    assert saved["calibration"]["compute_after_run"] == after
    # the collectives refitted on the means of each point, the waits averaged
    assert saved["calibration"]["collectives_after_run"] == {"8": again}
    assert saved["cluster"]["sync_wait_s"] == {"8": {"2": 2e-3}}
    assert saved["cluster"]["sync_wait_curve_s"] == {"8": {"2": [[1e-3, 1e-3], [4e-3, 2e-3]]}}
    assert saved["calibration"]["cpu_steal"] == [None, 0.0]
    fit = saved["cluster"]["collectives"]["all_reduce"]["8"]["2"]
    for size, mean in zip(sizes, (3e-3, 7e-3), strict=True):
        priced = latency_steps("all_reduce", 2) * fit["alpha_s"] \
            + ring_factor("all_reduce", 2) * size / fit["bandwidth_Bps"]
        assert priced == pytest.approx(mean, rel=0.05)


def test_a_quick_profile_without_a_comparable_curve_keeps_the_flat_wait():
    """A cached profile timed before the curve existed: the timing after the run brings a
    curve, which alone would carry none of the before/after weights; the flat figure is
    mixed and no curve is written."""
    from paraxis.train.calibrate.quick import _price_collectives

    sizes = [4096.0, 1048576.0]
    profile = {"gpu": {}, "cluster": {"sync_wait_s": {"8": {"2": 1e-3}}},
               "calibration": {"collectives": {"8": {"all_reduce": {"2": [
                   [sizes[0], 2e-3], [sizes[1], 6e-3]]}}}}}
    again = {"times": {"all_reduce": {"2": [[sizes[0], 4e-3], [sizes[1], 8e-3]]}},
             "sync_wait_s": {"2": 3e-3}, "sync_wait_curve_s": {"2": [[1e-3, 2e-3], [4e-3, 3e-3]]}}
    _price_collectives(profile, 8, again, 0.0)  # the timing after the run counts for nothing
    assert profile["cluster"]["sync_wait_s"] == {"8": {"2": 1e-3}}
    assert "sync_wait_curve_s" not in profile["cluster"]


class _QuietHost:
    """A StealMeter that reads no steal: what a quiet VM's host would give."""

    share = 0.0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


def test_timings_a_vms_host_disturbed_do_not_count_when_the_others_were_quiet(tmp_path):
    from paraxis.files.host_steal import DISTURBED_STEAL, cpu_ticks, stolen_share
    from paraxis.train.calibrate.quick import after_weight

    quiet, busy = DISTURBED_STEAL / 4, 3 * DISTURBED_STEAL
    assert after_weight(quiet, quiet) == after_weight(busy, busy) == 0.5
    assert after_weight(busy, quiet) == 1.0 and after_weight(quiet, busy) == 0.0
    assert after_weight(None, quiet) == 0.5 and after_weight(None, busy) == 0.0
    # /proc/stat's cpu line: user nice system idle iowait irq softirq steal guest guest_nice
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 50 800 10 0 0 40 0 0\ncpu0 1 2 3\n")
    start = cpu_ticks(stat)
    stat.write_text("cpu  160 0 70 900 10 0 0 70 0 0\n")
    assert start == (40, 1000) and stolen_share(start, cpu_ticks(stat)) == 30 / 210
    assert stolen_share(start, start) is None and cpu_ticks(tmp_path / "none") is None


def test_calibration_steal_is_that_of_the_timings_that_count(tmp_path):
    from paraxis.train.calibrate.quick import calibration_steal

    path = tmp_path / "hardware-profile.json"

    def steal(shares, weight=None) -> float | None:
        calibration = {"cpu_steal": shares}
        if weight is not None:
            calibration["after_run_weight"] = weight
        path.write_text(json.dumps({"calibration": calibration}))
        return calibration_steal(path)

    assert steal([0.30]) == 0.30  # calibrated just now: its only timings
    assert steal([0.30, 0.02], 1.0) == 0.02  # the disturbed timings before did not count
    assert steal([0.02, 0.30], 0.0) == 0.02  # nor the disturbed ones after
    assert steal([0.20, 0.30], 0.5) == 0.30  # both counted: the worse of the two
    assert steal([None, 0.05], 0.5) == 0.05
    path.write_text("not json")
    assert calibration_steal(path) is None


def _two_pairs_body() -> tuple[float, float]:
    """On 4 ranks in two pairs: a pair call on which ranks 0 and 1 also sleep 20 ms (their
    pair is the unlucky one), timed as the calibration times a collective."""
    import time

    import torch
    import torch.distributed as dist

    from paraxis.train.calibrate.collectives import _seconds_per_call, neighbour_group

    group, flag = neighbour_group(2), torch.zeros(1)
    slow = dist.get_rank() < 2

    def call() -> None:
        if slow:
            time.sleep(0.02)
        dist.all_reduce(flag, group=group)

    return _seconds_per_call(call, torch.device("cpu"), 3, 0.1, group)


def test_a_collective_is_priced_at_the_groups_mean_not_the_slowest_rank():
    """Each group's time is its slowest member's; the groups running at once are samples of
    one call, priced at their mean. A pair that sleeps 20 ms a call beside one that does not:
    about 10 ms, where the world's slowest rank (what calibrations timed before) reads 20."""
    from paraxis.dist.testing import run_distributed

    (mean, slowest), *others = run_distributed(_two_pairs_body, 4)
    assert all(o == pytest.approx((mean, slowest)) for o in others)  # one figure for all
    assert slowest == pytest.approx(0.02, abs=0.008)
    assert mean == pytest.approx(slowest / 2, abs=0.004)


def test_the_bench_before_prices_the_slowest_ranks_times():
    from bench.befores import slowest_rank

    device = {"name": "cpu-core", "type": "cpu", "memory_bytes": 4e9, "cores": 2}
    compute = {"matmul": {"flops_per_s": 1e11}, "attention_flops_per_s": 4e10,
               "elementwise_Bps": 6e9}
    timed = {op: {"2": [[s, 0.001 * (1 + s / 1e8)] for s in SIZES]} for op in OPS}
    profile = build_profile(device, compute, {8: timed})
    profile["calibration"]["collectives_slowest"] = {"8": {op: {"2": [
        [s, 2 * t] for s, t in points["2"]]} for op, points in timed.items()}}
    mean, slow = (p["cluster"]["collectives"]["all_reduce"]["8"]["2"]
                  for p in (profile, slowest_rank(profile)))
    assert slow["alpha_s"] == pytest.approx(2 * mean["alpha_s"], rel=1e-6)
    assert slow["bandwidth_Bps"] == pytest.approx(mean["bandwidth_Bps"] / 2, rel=1e-6)


def _dispatch_figures(device_type: str) -> tuple[float, float]:
    from paraxis.train.calibrate.measure import compute_body

    probe = compute_body("tiny", 64, 32, 2, device_type, probes=1)
    return probe["layer_overhead_s"], probe["kernel_launch_s"]


def test_a_cpu_calibration_prices_dispatch_per_layer_and_a_gpu_one_per_kernel():
    """A CPU rank's dispatch is its own time, a layer's (GPU.layer_overhead_s); a GPU's host
    issues kernels ahead of the device, priced per kernel (GPU.kernel_launch_s), which the
    profile carries: a layer's launches then cost the host what the timed block took. A
    CPU's profile gives 0 there: not priced."""
    from paraxis.plan.compute import layer_kernels
    from paraxis.plan.cost import evaluate
    from paraxis.spec.model_config import PRESETS

    overhead, launch = _dispatch_figures("cpu")
    assert overhead > 0 and launch == 0.0
    probe = {"matmul": {"flops_per_s": 1e12}, "attention_flops_per_s": 5e11,
             "elementwise_Bps": 1e12, "layer_overhead_s": 0.0}
    device = {"name": "a GPU", "type": "cuda", "memory_bytes": 80e9, "cores": 0}
    gpu = build_profile(device, {**probe, "kernel_launch_s": 25e-6}, {})["gpu"]
    assert gpu["kernel_launch_s"] == 25e-6 and gpu["layer_overhead_s"] == 0.0
    # one layer's host time, at a microbatch too small for the GPU to matter
    cfg = PRESETS["tiny"]
    steps = [evaluate(cfg, Layout(), build_cluster("h100-sxm-80gb", 1, 1, {
        "kernels": "eager", "kernel_launch_s": launch}), 32, 1).step_time_s
        for launch in (25e-6, 50e-6)]
    assert steps[1] - steps[0] == pytest.approx(
        cfg.n_layers * layer_kernels(cfg, "eager") * 25e-6, rel=0.05)


@pytest.mark.skipif(gpu_count() == 0, reason="needs a CUDA GPU")
def test_a_gpu_calibration_measures_its_hosts_seconds_a_kernel():
    """On CUDA, the block's time on one token over its eager kernels: tens of microseconds
    on the lent H100s' and H200s' hosts (docs/gpu/README.md); in a spawned rank."""
    from paraxis.dist.testing import run_distributed

    ((overhead, launch),) = run_distributed(_dispatch_figures, 1, ("cuda",), device="cuda")
    assert overhead == 0.0 and 2e-6 < launch < 5e-4, launch


def test_the_committed_profile_is_where_runs_look_for_it():
    from paraxis.train.calibrate import quick

    assert quick.COMMITTED.is_file()
    profile = json.loads(quick.COMMITTED.read_text())
    assert profile["calibration"]["compute"]["shapes_from"]["model"] == "small-llama"


def _failing_body() -> None:
    raise RuntimeError("Unable to find address for: bogus0")


def test_a_failed_calibration_rank_is_one_line():
    """A rank that cannot join (a wrong GLOO_SOCKET_IFNAME), runs out of memory or times out
    ends the calibration with one line naming the part, not the launcher's traceback."""
    from paraxis.spec.errors import RunFailed
    from paraxis.train.calibrate.measure import on_ranks

    with pytest.raises(RunFailed, match=r"the calibration's collectives on 2 rank\(s\) failed: "
                                        r".*Unable to find address for: bogus0") as error:
        on_ranks("collectives", _failing_body, 2, ())
    assert "\n" not in str(error.value)


def test_a_cpu_profile_shares_its_machine_over_the_ranks_planned():
    """A profile keeps the machine's memory over the ranks it timed (8 for the committed
    one); a plan of fewer ranks gives each its larger share, not the 8-rank one."""
    from paraxis.plan.inputs import PlanInputs
    from paraxis.train.calibrate import quick

    profile = json.loads(quick.COMMITTED.read_text())
    machine = profile["gpu"]["memory_bytes"] * profile["cluster"]["gpus_per_node"]
    for ranks in (1, 2, 8, 16):
        cluster = PlanInputs(gpus=ranks, hardware=str(quick.COMMITTED)).cluster()
        assert cluster.gpu.memory_bytes == pytest.approx(machine / ranks)
