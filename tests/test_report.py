"""`paraxis report`: one self-contained HTML file, for a plan alone and for a real run."""

import json
import re
from pathlib import Path

import pytest

from paraxis.cli import main
from paraxis.dist.testing import RankContext, run_on_ranks
from paraxis.files.trace import load_trace, to_chrome_trace
from paraxis.show.report.build import write_report
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import Layout
from paraxis.train.calibrate.measure import cpu_model_name

PIPE = Layout(pp=4, microbatches=4, schedule="1f1b")
PLAN_SECTIONS = ("plan", "defence", "grid", "tp", "pipeline", "memory", "ring")


def words(html: str) -> str:
    """The report less its embedded data: URIs, whose base64 spells any four letters by
    chance: "HTTP" about once in ten reports, "CUDA" once in some twenty (seen in CI)."""
    return re.sub(r'data:[^"]*', "", html)


def assert_self_contained(html: str, sections: tuple[str, ...]) -> None:
    for anchor in sections:
        assert f'<section id="{anchor}">' in html, f"section {anchor} missing"
    images = re.findall(r'<img src="([^"]+)"', html)
    assert images and all(src.startswith("data:image/png;base64,") for src in images)
    assert len(images) >= len(sections) - 2  # plan and defence are tables
    # Nothing fetched from anywhere: no scripts, stylesheets, fonts or remote addresses.
    text = words(html).lower()
    assert "http" not in text
    for tag in ("<script", "<link", "@import", "url("):
        assert tag not in text


def cpu_profile(path: Path, ranks: int) -> dict:
    """A profile of the form `paraxis calibrate` writes, for a 2-core CPU whose collectives
    are timed over groups of 2 up to `ranks` ranks, written at `path`."""
    from paraxis.train.calibrate.profile import build_profile

    points = [[4e3, 1e-4], [4e6, 4e-3]]
    sizes = [str(n) for n in (2, 4, 8) if n <= ranks]
    profile = build_profile(
        {"name": "cpu-core", "type": "cpu", "memory_bytes": 4e9, "cores": 2},
        {"matmul": {"flops_per_s": 5e10}, "attention_flops_per_s": 2e10,
         "elementwise_Bps": 5e9},
        {ranks: {op: dict.fromkeys(sizes, points)
                 for op in ("all_reduce", "all_gather", "reduce_scatter", "send_recv")}})
    path.write_text(json.dumps(profile))
    return profile


def test_plan_only_report_has_every_section(tmp_path):
    out = write_report(tmp_path / "plan.html", model="small", gpus=4, global_batch=8,
                       seq_len=128, layout="dp=1,tp=2,pp=2,microbatches=4,schedule=1f1b")
    html = out.read_text()
    assert_self_contained(html, PLAN_SECTIONS)
    assert 'id="run"' not in html
    assert "dp=1,tp=2,pp=2" in html and "given by the user" in html
    assert "the planner's best" in html or "as fast as the planner" in html


def test_report_command_lets_the_planner_choose(tmp_path, capsys):
    out = tmp_path / "r.html"
    assert main(["report", "--model", "gpt2-124m", "--gpus", "8", "--global-batch", "32",
                 "--seq-len", "1024", "--out", str(out)]) == 0
    assert str(out) in capsys.readouterr().out
    html = out.read_text()
    assert_self_contained(html, PLAN_SECTIONS)
    assert "chosen by the planner" in html


def test_report_refuses_a_run_folder_without_metrics(tmp_path):
    with pytest.raises(ParaxisError, match="metrics.jsonl"):
        write_report(tmp_path / "x.html", run_dir=tmp_path)


def test_run_report_forecasts_with_a_calibrated_profile(tmp_path, capsys):
    """A real one-rank run, reported against the planner's prediction on a profile of the
    form `paraxis calibrate` writes: the step-time error is shown in one line."""
    from paraxis.files.model_file import load_model_config
    from paraxis.files.run_records import load_metrics, steady
    from paraxis.plan.cost import evaluate
    from paraxis.plan.hardware import build_cluster
    from paraxis.spec.precision import FP32_ADAM

    run = tmp_path / "run"
    assert main(["train", "--model", "tiny", "--steps", "8", "--global-batch", "4",
                 "--seq-len", "32", "--quiet", "--device", "cpu",
                 "--metrics-file", str(run / "metrics.jsonl")]) == 0
    hw = tmp_path / "profile.json"
    profile = cpu_profile(hw, ranks=2)
    capsys.readouterr()
    assert main(["report", "--model", "tiny", "--gpus", "1", "--layout", "dp=1",
                 "--global-batch", "4", "--seq-len", "32", "--run", str(run),
                 "--hardware", str(hw), "--precision", "fp32",
                 "--out", str(tmp_path / "r.html")]) == 0
    html = (tmp_path / "r.html").read_text()
    cluster = build_cluster(gpus=1, overrides={**profile["gpu"], **profile["cluster"]})
    predicted = evaluate(load_model_config("tiny"), Layout(), cluster, 32, 4, FP32_ADAM)
    measured = steady(load_metrics(run / "metrics.jsonl"), "step_time_s")
    error = predicted.step_time_s / measured - 1
    assert f"as calibrated in <code>{hw}</code>" in html
    assert f"the prediction is {error:+.0%} off" in html
    assert "<h1>paraxis report: tiny on 1 CPU rank on cpu-core (2 cores)</h1>" in html
    assert "CUDA" not in words(html)
    # Without those flags the run's own config.toml (written beside its metrics) says what
    # ran: the same model, layout, batch, sequence length and precision, the same forecast.
    assert main(["report", "--run", str(run), "--hardware", str(hw),
                 "--out", str(tmp_path / "r2.html")]) == 0
    assert f"the prediction is {error:+.0%} off" in (tmp_path / "r2.html").read_text()
    assert "warning" not in capsys.readouterr().err
    # a layout the run did not have is priced, and said to be another than the run's
    assert main(["report", "--run", str(run), "--hardware", str(hw), "--layout", "dp=2",
                 "--gpus", "2", "--out", str(tmp_path / "r3.html")]) == 0
    assert "warning: --layout dp=2 is not what the run ran" in capsys.readouterr().err
    assert main(["report", "--run", str(tmp_path / "nowhere"), "--hardware", str(hw),
                 "--out", str(tmp_path / "r4.html")]) == 2
    assert f"--run {tmp_path / 'nowhere'} does not exist" in capsys.readouterr().err


def test_a_run_that_shared_its_machine_is_flagged():
    """Other load on the machine spreads a run's steps (run_records.spread): the report says
    its measured step is not the layout's alone instead of blaming the forecast."""
    from paraxis.files.run_records import spread
    from paraxis.show.report.measured import Forecast

    # steps of two real paraxis demo runs here (ms, after warm-up, every third)
    quiet = [199, 225, 222, 197, 203, 216, 218, 227, 218, 204, 185, 192, 191, 200, 195, 219,
             224, 195, 202]
    loaded = [259, 429, 358, 309, 482, 331, 761, 518, 513, 435, 629, 560, 536, 611, 528, 458,
              609, 440, 255]
    assert spread([{"t": t} for t in [0, 0, 0, *quiet]], "t") < 0.15
    assert spread([{"t": t} for t in [0, 0, 0, *loaded]], "t") > 0.25
    assert spread([{"t": 1.0}] * 3, "t") == 0.0  # too few steps to say
    calm, busy = Forecast("8 CPU ranks", 0.18, 0.19, 0.12), Forecast("8 CPU ranks", 0.18, 0.46,
                                                                      0.39)
    assert not calm.disturbed and calm.caveat() == ""
    assert busy.disturbed and "other load shared this machine" in busy.caveat()


def test_ratios_read_as_a_reader_says_them():
    from paraxis.show.report.text import times

    assert times(1.8) == "1.8x faster" and times(1 / 2.5) == "2.5x slower"
    assert times(13_304 / 13_199) == "1.01x faster"  # near one: three digits, never "1x"
    assert times(1.0 / 1.008, "faster", "longer") == "1.01x longer"
    assert times(12.3) == "12x faster" and times(1.002) == "as fast"


def _lesson_holds(lesson) -> None:
    """The pipeline pictures teach what the schedules are for: interleaving shrinks the
    bubble, and 1F1B holds fewer microbatches' activations than GPipe."""
    shown = lesson.shown
    assert set(shown) == {"gpipe", "1f1b", "interleaved"}
    assert shown["interleaved"].bubble_fraction < shown["1f1b"].bubble_fraction
    assert shown["1f1b"].peak_in_flight < shown["gpipe"].peak_in_flight
    assert lesson.microbatches > lesson.stages
    assert lesson.costs.send_s < lesson.costs.forward_s / 10


def _pipeline_run(ctx: RankContext, folder: str) -> tuple[list[dict], list[tuple]]:
    """Three real training steps of `tiny` on a 4-stage 1F1B pipeline; rank 0 writes the
    metrics file exactly as `paraxis train --metrics-file` does."""
    import torch

    from paraxis.data.corpus import TokenData
    from paraxis.files.model_file import load_model_config
    from paraxis.parallelize import build_engine
    from paraxis.train.config import RunConfig
    from paraxis.train.loop import _loop

    cfg = RunConfig.from_flags(model="tiny", steps=3, global_batch=8, seq_len=32,
                               device="cpu", layout=PIPE, metrics_file=f"{folder}/metrics.jsonl",
                               quiet=True)
    model_cfg = load_model_config(cfg.model.name)
    groups = ctx.groups
    torch.manual_seed(cfg.train.seed)
    engine = build_engine(model_cfg, PIPE, groups, torch.device("cpu"), seed=cfg.train.seed,
                          seq_len=32)
    _loop(cfg, engine, TokenData.load(cfg.data.path), groups, torch.device("cpu"), groups.rank,
          model_cfg)
    scheduled = [(a.kind, a.microbatch, a.chunk) for a in engine.schedule.stages[groups.pp_rank]]
    return engine.trace_events(), scheduled


@pytest.fixture(scope="module")
def pipeline_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("run")
    per_rank = run_on_ranks(PIPE, _pipeline_run, str(folder))
    events = [e for trace, _ in per_rank for e in trace]
    (folder / "trace.json").write_text(json.dumps(events))
    return folder, per_rank


@pytest.mark.slow
def test_measured_trace_of_a_4_rank_1f1b_run(pipeline_run):
    folder, per_rank = pipeline_run
    for rank, (trace, scheduled) in enumerate(per_rank):
        assert {e["rank"] for e in trace} == {rank}
        # one event per scheduled action; computes in the schedule's order (a recv is
        # recorded where its compute waits for it)
        recorded = [(e["kind"], e["microbatch"], e["chunk"]) for e in trace]
        assert sorted(recorded) == sorted(scheduled)
        assert [a for a in recorded if a[0] in "FBW"] == [a for a in scheduled if a[0] in "FBW"]
        starts = [e["start_s"] for e in trace]
        assert starts == sorted(starts)
    chrome = json.loads(json.dumps(to_chrome_trace(load_trace(folder / "trace.json"))))
    spans = [e for e in chrome["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == sum(len(s) for _, s in per_rank)
    assert all({"ts", "dur", "pid", "tid", "name"} <= set(e) for e in spans)
    assert {e["pid"] for e in spans} == {0, 1, 2, 3}


@pytest.mark.slow
def test_run_report_puts_measured_next_to_predicted(pipeline_run, tmp_path):
    # Priced on a profile given as --hardware would give it: calibrating this CPU for a run's
    # report is the demo's part (test_demo_run_is_forecast_on_a_profile_of_this_cpu).
    folder, _ = pipeline_run
    hw = tmp_path / "profile.json"
    cpu_profile(hw, ranks=4)
    out = write_report(tmp_path / "run.html", model="tiny", gpus=4, global_batch=8,
                       seq_len=32, layout=PIPE, run_dir=folder, hardware=str(hw))
    html = out.read_text()
    assert_self_contained(html, (*PLAN_SECTIONS, "run"))
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 3
    assert "Measured vs predicted" in html and "trace.json: bubble predicted" in html
    assert 'download="trace.chrome.json" href="data:application/json;base64,' in html
    assert f"{records[0]['loss']:.3f} -&gt; {records[-1]['loss']:.3f}" in html
    # the same run as --layout auto would have left it: its records carry the pick's price,
    # and the report says who chose the layout and what was predicted then
    auto = tmp_path / "auto"
    auto.mkdir()
    (auto / "metrics.jsonl").write_text("".join(json.dumps({**r, "predicted_step_s": 0.5}) + "\n"
                                                for r in records))
    html = write_report(tmp_path / "auto.html", model="tiny", gpus=4, global_batch=8,
                        seq_len=32, layout=PIPE, run_dir=auto, hardware=str(hw)).read_text()
    assert "chosen by the planner when the run started (--layout auto)" in html
    assert "given by" not in html and "--layout auto picked this layout predicting 500 ms" in html


# ------------------------------------------------------------------ in a real browser

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]


def _chromium(page, profile, *flags: str):
    import subprocess

    return subprocess.run(["chromium", *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *flags,
                           page.as_uri()], capture_output=True, text=True, timeout=120)


def _console_lines(stderr: str) -> list[str]:
    # Chromium's --enable-logging=stderr prints each page console message as "...CONSOLE(..."
    return [line for line in stderr.splitlines() if "CONSOLE" in line]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """`paraxis demo` as a new user runs it, shortened to 30 steps (the medians of the
    forecast skip 3 warm-up steps); stdout and stderr as one stream, in order."""
    import subprocess
    import sys

    out = tmp_path_factory.mktemp("demo")
    done = subprocess.run([sys.executable, "-m", "paraxis", "demo", "--steps", "30", "--out",
                           str(out)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:]
    return out, done.stdout


@pytest.fixture(scope="module")
def demo_report(demo):
    """The demo's report, rebuilt from its run folder (the profile the demo calibrated)."""
    from paraxis.commands.demo import LAYOUT_3D, report_inputs
    from paraxis.show.report.build import build_report

    folder, _ = demo
    return build_report(report_inputs("tiny", LAYOUT_3D), folder / "parallel")


@pytest.mark.slow
def test_demo_run_is_forecast_on_a_profile_of_this_cpu(demo_report):
    from paraxis.commands.demo import LAYOUT_3D

    report = demo_report
    # The demo's plan (tiny, dp=2 x tp=2 x pp=2, 2 microbatches) is the case where the
    # pipeline lesson does not show at the run's own settings: the pictures are drawn where
    # it does, and the run's own schedule is stated next to them.
    _lesson_holds(report.lesson)
    assert report.lesson.stages == LAYOUT_3D.pp
    html = report.html()
    assert "What this plan runs: 1F1B over 2 stages with 2 microbatch(es)" in html
    assert "x faster" in html or "as fast as the planner" in html
    # Like for like: a CPU run is priced on a profile of this CPU, not on a GPU preset.
    assert report.plan.hardware.cpu and report.plan.cluster.cores_per_node > 0
    assert report.title.startswith("paraxis report: tiny on 8 CPU ranks on ")
    assert "CUDA" not in words(html) and "a100" not in report.title
    assert f"the prediction is {report.forecast.error:+.0%} off" in html


@pytest.mark.slow
def test_a_disturbed_demo_run_says_so(demo_report):
    # The run and the profile's timings record what a VM's host took (paraxis/files/host_steal.py);
    # a run that was disturbed (steps spread, or the host took more than DISTURBED_STEAL) must say
    # so in its report.
    forecast = demo_report.forecast
    assert forecast.steal is not None or not Path("/proc/stat").exists()
    assert (forecast.caveat() in demo_report.html()) if forecast.disturbed else \
        not forecast.caveat()


# The CPUs on which the demo's forecast was checked with the current CPU model (collectives
# timed at the groups' mean; each call's sync wait read at the compute before it, the
# backward's after the backward): there the test is strict.
FORECAST_CHECKED_ON = ("AMD EPYC",)


@pytest.mark.slow
@pytest.mark.xfail(not cpu_model_name().startswith(FORECAST_CHECKED_ON), strict=False, reason=(
    "the 30% target is shown on the AMD EPYC VM only: there the demo's undisturbed "
    "forecasts read within -20% to +15% under the current CPU model (`paraxis demo "
    "--steps 30`); the Intel VM has run none of its changes (there: -15% to +21% before "
    "them)"))
def test_demo_forecast_is_within_30_percent(demo_report):
    # A forecast prices the layout on this machine as a calibration found it; it cannot know
    # what else will load the machine while the run runs. On a 2-core VM that load is
    # mostly the VM's host: with 2% of the CPU time stolen the demo's
    # ranks step at 184-198 ms, with 23-31% at 489-700 ms (paraxis/files/host_steal.py), and one
    # timing taken while the host stole 26% priced a quiet run 17% slow. The run and the
    # profile's timings record what the host took, the timings it disturbed do not count
    # where the others were quiet (calibrate.quick.after_weight), and a run that was
    # disturbed anyway (steps spread, or the host took more than DISTURBED_STEAL) must say
    # so in its report; the others are held to 30%.
    forecast = demo_report.forecast
    assert forecast.steal is not None or not Path("/proc/stat").exists()
    if forecast.disturbed:
        assert forecast.caveat() in demo_report.html()
        return
    assert abs(forecast.error) <= 0.30, forecast


@pytest.mark.slow
def test_demo_prints_at_most_25_lines_before_the_loss_table(demo):
    _, output = demo
    lines = output.splitlines()
    table = next(i for i, line in enumerate(lines) if "one device" in line and "dp=2" in line)
    assert table <= 25, "\n".join(lines[:table])
    assert all(len(line) <= 200 for line in lines)  # nothing wrapped, nothing run-on


@pytest.mark.slow
def test_report_opens_in_headless_chromium(demo, tmp_path):
    import shutil

    if shutil.which("chromium") is None:
        pytest.skip("chromium is not installed (Debian: apt-get install -y chromium; "
                    ".ci/run installs it)")
    from matplotlib.image import imread

    # The demo's own report, as a new user gets it.
    folder, output = demo
    page = folder / "report.html"
    assert f"report: {page.resolve()}" in output
    # The console check must be able to fail: a page that logs an error is caught.
    noisy = tmp_path / "noisy.html"
    noisy.write_text("<html><body><script>console.error('broken')</script></body></html>")
    seen = _chromium(noisy, tmp_path / "p0", "--enable-logging=stderr", "--v=0", "--dump-dom")
    assert any("broken" in line for line in _console_lines(seen.stderr)), seen.stderr[-2000:]

    opened = _chromium(page, tmp_path / "p1", "--enable-logging=stderr", "--v=0",
                       "--dump-dom")
    assert opened.returncode == 0, opened.stderr[-2000:]
    assert _console_lines(opened.stderr) == []
    assert 'id="run"' in opened.stdout and "Measured vs predicted" in opened.stdout
    assert opened.stdout.count("<img") >= 7  # the DOM chromium built holds every picture

    shot = tmp_path / "shot.png"
    taken = _chromium(page, tmp_path / "p2", f"--screenshot={shot}", "--window-size=1280,4000",
                      "--hide-scrollbars")
    assert shot.is_file(), taken.stderr[-2000:]
    pixels = imread(shot)[..., :3]
    colours = {tuple(p) for p in (pixels[::7, ::7].reshape(-1, 3) * 255).astype(int).tolist()}
    assert len(colours) > 100, "the screenshot is (nearly) blank"
    assert pixels.std() > 0.1


def test_a_plan_without_a_pipeline_draws_its_own_model_split_into_stages(tmp_path):
    # no pp in the plan (llama2-7b, dp=8, 8 microbatches, 64 x 4096 tokens): the pipeline
    # pictures price the plan's own model in 4 stages on its GPU (its sends are small next to
    # its forwards), and the text names it
    html = write_report(tmp_path / "dense.html", model="llama2-7b", gpus=8, global_batch=64,
                        seq_len=4096, layout="dp=8,tp=1,pp=1,microbatches=8").read_text()
    assert html.count("llama2-7b split into 4 stages on 4 x a100-80gb") >= 2
    assert "gpt2-1.5b" not in html and "the model above" not in html
    assert "Mixture of experts" not in html  # a dense model's report has no experts section
    # "Faster, but too big" lists only layouts faster than the one shown: for the planner's
    # pick here none of the layouts that do not fit is faster, and the report says so
    out = write_report(tmp_path / "pick.html", model="llama2-7b", gpus=8, global_batch=512,
                       seq_len=4096)
    html = out.read_text()
    assert "Faster, but too big" not in html and "would all be slower" in html


def test_a_run_is_given_by_its_metrics_file_or_its_folder(tmp_path):
    # `paraxis train --metrics-file runs/m.jsonl` then `paraxis report --run runs/m.jsonl`
    from paraxis.show.report.measured import load_run
    from paraxis.train.config import RunConfig
    from paraxis.train.loop import run_training

    metrics = tmp_path / "m.jsonl"
    run_training(RunConfig.from_flags(model="tiny", steps=2, global_batch=2, seq_len=16,
                                      quiet=True, metrics_file=str(metrics)))
    by_file = load_run(metrics)
    assert len(by_file.records) == 2 and by_file.folder == tmp_path
    metrics.rename(tmp_path / "metrics.jsonl")
    assert len(load_run(tmp_path).records) == 2
