"""`paraxis diagnose`: how a run ended, and why throughput fell after a move.

Run folders are written here as `paraxis train --metrics-file` writes them (a metrics file and
config.toml beside it), with the figures each question turns on; one real tiny run checks
that the command reads what training writes. The planner's figures the command prints are
priced again here with `evaluate`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from paraxis.cli import main
from paraxis.files.model_file import load_model_config
from paraxis.files.run_records import load_metrics
from paraxis.plan.attribution import per_gpu_change
from paraxis.plan.cost import evaluate
from paraxis.plan.inputs import PlanInputs
from paraxis.show.report.text import size
from paraxis.spec.layout import Layout
from paraxis.spec.precision import PRECISIONS
from paraxis.train.config import RunConfig
from paraxis.train.run_file import to_toml
from tests.test_bad_input import snapshot

ROOT = Path(__file__).resolve().parents[1]
GB = 1e9
LAYOUT_13B = ("dp=8,tp=8,pp=2,microbatches=64,schedule=interleaved,virtual_stages=2,"
              "sequence_parallel=true")
START_BYTES, GROWTH_PER_STEP = 24 * GB, 14 * GB / 1000  # the leak's line
CAPACITY_GB = 80


def run_folder(folder: Path, records: list[dict], layout: str = LAYOUT_13B,
               steps: int = 10_000, on_nan: str = "stop") -> Path:
    """A 13B run's folder: its metrics.jsonl and config.toml."""
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    config = RunConfig.from_flags(model="llama2-13b", steps=steps, global_batch=1024,
                                  seq_len=4096, precision="bf16", layout=layout,
                                  on_nan=on_nan, metrics_file=str(folder / "metrics.jsonl"))
    (folder / "config.toml").write_text(to_toml(config))
    return folder


def step_record(step: int, peak_bytes: float, loss: float | None = 2.0,
                grad_norm: float | None = 1.0, tokens_per_s: float = 230_000.0) -> dict:
    record = {"step": step, "loss": loss, "lr": 3e-4, "grad_norm": grad_norm,
              "tokens_per_s": tokens_per_s, "step_time_s": 1024 * 4096 / tokens_per_s,
              "mfu": None, "peak_mem_bytes": peak_bytes, "data_wait_s": 1e-4}
    if step % 10 == 0:  # a logging step gathers every rank's peak (pipeline stage 1 lighter)
        ranks = [peak_bytes - (0 if rank < 64 else 3 * GB) for rank in range(128)]
        record.update(peak_mem_bytes_by_rank=ranks, peak_mem_bytes_max_rank=max(ranks))
    return record


def diagnose(capsys: pytest.CaptureFixture, *argv: str) -> str:
    capsys.readouterr()
    assert main(["diagnose", *argv]) == 0
    return capsys.readouterr().out


def line(out: str, label: str) -> str:
    [found] = [text for text in out.splitlines() if text.startswith(label + ": ")]
    return found


def test_memory_that_grows_to_the_capacity_is_named_with_its_rate_and_step(tmp_path,
                                                                           capsys):
    records = [step_record(step, START_BYTES + GROWTH_PER_STEP * step) for step in range(4000)]
    folder = run_folder(tmp_path / "leak", records)
    out = diagnose(capsys, "--run", str(folder), "--memory-gb", str(CAPACITY_GB))
    # the line through the peaks is the one the records were written from
    reach = math.ceil((CAPACITY_GB * GB - START_BYTES) / GROWTH_PER_STEP)
    assert reach == 4000
    assert "rises 14 GB per 1,000 steps" in line(out, "Memory growth")
    assert f"reaches the 80 GB of the device at step {reach:,}" in line(out, "Memory growth")
    assert "3,999 (4,000 records)" in out and "of the 10,000 its config.toml asks" in out
    assert "it stopped early" in line(out, "Steps")
    cause = line(out, "Likely cause")
    assert "out of memory" in cause and "where the run ended" in cause
    assert "Something outlives its step" in cause
    # the planner's forecast for the run's layout, beside the measured peak
    cfg = load_model_config("llama2-13b")
    cluster = PlanInputs(gpus=128, memory_gb=CAPACITY_GB).cluster()
    layout = Layout.parse(LAYOUT_13B)
    estimate = evaluate(cfg, layout, cluster, 4096, 1024, PRECISIONS["bf16"])
    tensors = estimate.memory["total"] - estimate.memory["reserved"]
    forecast = line(out, "Forecast")
    assert f"the planner forecasts {size(tensors)} of tensors per GPU" in forecast
    assert f"{size(records[-1]['peak_mem_bytes'])} at step 3,999" in forecast
    # what to do: the same layout holding less, as the planner prices it
    lighter = evaluate(cfg, layout.replace(zero=1), cluster, 4096, 1024, PRECISIONS["bf16"])
    assert f"zero=1: {size(lighter.memory['total'])}" in line(out, "What to do")

    # the same run with its peak flat, far from the device: memory is not the cause
    flat = [step_record(step, 30 * GB) for step in range(4000)]
    out = diagnose(capsys, "--run", str(run_folder(tmp_path / "flat", flat)),
                   "--memory-gb", str(CAPACITY_GB))
    assert "flat (under 2% of the device" in line(out, "Memory growth")
    assert "out of memory" not in out
    assert line(out, "Likely cause").startswith("Likely cause: outside these records")


def test_a_run_whose_loss_turns_nan_says_so(tmp_path, capsys):
    records = [step_record(step, 30 * GB) for step in range(500)]
    for record in records[490:]:
        record["grad_norm"] = 40.0
    for record in records[495:]:  # as --on-nan skip writes a step that is not finite
        record.update(loss=None, grad_norm=None, skipped="loss is nan")
    folder = run_folder(tmp_path / "nan", records, on_nan="skip")
    out = diagnose(capsys, "--run", str(folder))
    numbers = line(out, "Loss and gradient norm")
    assert "the loss is NaN" in numbers and "5 step(s) were skipped" in numbers
    cause = line(out, "Likely cause")
    assert "the training diverged" in cause
    assert "the gradient norm spiked to 40 at step 490, 40.0x its median" in cause
    assert "then the loss turned NaN at step 495" in cause
    assert "--lr" in line(out, "What to do")


def test_a_short_run_that_blew_up_is_compared_with_its_first_steps(tmp_path, capsys):
    """Four steps are too few for a median before the tail: the first step is the
    reference, so a loss of 9e5 and a gradient norm of 9e18 are a divergence, not sound."""
    records = [step_record(step, 30 * GB, loss=loss, grad_norm=grad) for step, (loss, grad)
               in enumerate([(5.3, 6.0), (5.4, 4.0), (4e3, 1e10), (9e5, 9e18)])]
    out = diagnose(capsys, "--run", str(run_folder(tmp_path / "short", records)))
    assert "against the median of the 1 before them" in line(out, "Loss and gradient norm")
    cause = line(out, "Likely cause")
    assert cause.startswith("Likely cause: the training diverged: the gradient norm spiked "
                            "to 9e+18 at step 3")
    assert "the step that turns NaN ends the run before it is recorded" in cause


def test_a_spike_in_a_run_that_finished_is_not_what_ended_it(tmp_path, capsys):
    records = [step_record(step, 30 * GB) for step in range(80)]
    records[75]["grad_norm"] = 500.0
    out = diagnose(capsys, "--run", str(run_folder(tmp_path / "done", records, steps=80)))
    assert "it finished" in line(out, "Steps")
    cause = line(out, "Likely cause")
    assert "the gradient norm spiked to 500 at step 75" in cause
    assert "ends the run" not in cause and "what ended it" not in cause


def test_a_run_cut_short_under_on_nan_stop_names_the_unrecorded_step(tmp_path, capsys):
    records = [step_record(step, 30 * GB) for step in range(500)]
    out = diagnose(capsys, "--run", str(run_folder(tmp_path / "cut", records)))
    cause = line(out, "Likely cause")
    assert cause.startswith("Likely cause: outside these records")
    assert "or the next step's loss or gradient norm was not finite and --on-nan stop" in cause


def test_a_real_run_is_read_with_its_headroom_and_forecast(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--model", "tiny", "--steps", "4", "--global-batch", "4",
                 "--seq-len", "32", "--quiet", "--device", "cpu",
                 "--metrics-file", str(run / "m.jsonl")]) == 0
    profile = ROOT / "docs" / "hardware-profile.json"
    out = diagnose(capsys, "--run", str(run), "--hardware", str(profile))
    records = load_metrics(run / "m.jsonl")
    peak = max(r["peak_mem_bytes"] for r in records)
    cluster = PlanInputs(gpus=1, hardware=str(profile)).cluster()
    assert line(out, "Run") == f"Run: {run / 'm.jsonl'} and m.config.toml"
    assert "0 to 3 (4 records)" in out and "it finished" in line(out, "Steps")
    headroom = line(out, "Memory headroom")
    assert f"peaked at {size(peak)}" in headroom and "resident set" in headroom
    assert f"{size(cluster.gpu.memory_bytes - peak)} (" in headroom
    estimate = evaluate(load_model_config("tiny"), Layout(), cluster, 32, 4,
                        PRECISIONS["fp32"])
    forecast = line(out, "Forecast")
    assert f"the planner forecasts {size(estimate.memory['total'])} in all per rank" in forecast
    assert f"{size(records[-1]['peak_mem_bytes'])} at step 3 (" in forecast
    assert "too few to fit a trend" in line(out, "Memory growth")
    assert all(r["device"] == "cpu" for r in records)
    # without --hardware the run is priced on the default GPU: its resident set is not set
    # against that GPU's tensors as if it were the allocator's peak
    out = diagnose(capsys, "--run", str(run))
    assert "(measured: the process's resident set" in line(out, "Memory headroom")
    assert "not comparable with a GPU's forecast: give --hardware" in line(out, "Forecast")
    assert "x the forecast" not in line(out, "Forecast")


def test_a_run_that_stopped_at_its_exit_after_is_not_called_cut_short(tmp_path, capsys):
    """--exit-after ends a run where asked: no cause outside the records to look for."""
    run = tmp_path / "run"
    assert main(["train", "--model", "tiny", "--steps", "6", "--exit-after", "3",
                 "--global-batch", "4", "--seq-len", "32", "--quiet", "--device", "cpu",
                 "--checkpoint-dir", str(run / "ckpt"), "--metrics-file",
                 str(run / "m.jsonl")]) == 0
    out = diagnose(capsys, "--run", str(run))
    assert "it stopped after step 3, where its exit_after asks" in line(out, "Steps")
    assert "newest checkpoint holds 3 steps done" in line(out, "Steps")
    assert line(out, "Likely cause").startswith(
        "Likely cause: none: the run stopped after step 3 as its exit_after asks")
    assert "`paraxis train --resume auto` runs on to step 6" in line(out, "What to do")


def priced_move(layout: str, before: PlanInputs, after: PlanInputs) -> float:
    cfg = load_model_config("llama2-13b")
    estimates = [evaluate(cfg, Layout.parse(layout), given.cluster(), 4096, 1024)
                 for given in (before, after)]
    return per_gpu_change(*estimates)


def test_tp_moved_onto_nodes_of_four_is_named_crossing_nodes(capsys):
    out = diagnose(capsys, "--model", "llama2-13b", "--layout", LAYOUT_13B, "--gpus", "128",
                   "--cluster", "dgx-a100", "--move-to-gpus-per-node", "4")
    change = priced_move(LAYOUT_13B, PlanInputs(gpus=128, cluster_preset="dgx-a100"),
                         PlanInputs(gpus=128, cluster_preset="dgx-a100", gpus_per_node=4))
    assert change < -0.2
    assert f"{change:+.1%} per GPU (the planner's forecast)" in line(out, "Forecast")
    assert line(out, "Where the time went").startswith("Where the time went: tp ")
    collectives = line(out, "Collectives")
    assert "the TP=8 group (its all-gathers and reduce-scatters of every layer) now spans " \
           "2 nodes of 4" in collectives
    assert "it ran inside one node" in collectives
    assert "TP=8 group now spans 2 nodes" in line(out, "Likely cause")
    assert "keep TP inside a node (tp <= 4" in line(out, "What to do")


def test_a_move_to_a_thin_network_names_the_dp_group(capsys):
    out = diagnose(capsys, "--model", "llama2-13b", "--layout", LAYOUT_13B, "--gpus", "128",
                   "--cluster", "dgx-a100", "--move-to", "ethernet-1nic")
    change = priced_move(LAYOUT_13B, PlanInputs(gpus=128, cluster_preset="dgx-a100"),
                         PlanInputs(gpus=128, cluster_preset="ethernet-1nic"))
    assert f"{change:+.1%} per GPU" in line(out, "Forecast")
    assert "the DP=8 group now runs on a slower link (a ring reaches 1.25 GB/s where it " \
           "reached 20 GB/s), which carries its gradient all-reduce" in line(out, "Likely cause")
    assert "1 NIC x 12.5 GB/s" in out  # the defence's link_speed of the thin network


def test_two_runs_set_the_measured_drop_beside_the_forecast(tmp_path, capsys):
    before = run_folder(tmp_path / "before", [
        step_record(step, 30 * GB, tokens_per_s=118_000.0) for step in range(20)],
        layout=LAYOUT_13B.replace("dp=8", "dp=4"), steps=20)
    after = run_folder(tmp_path / "after", [
        step_record(step, 30 * GB, tokens_per_s=141_600.0) for step in range(20)],
        layout=LAYOUT_13B.replace("microbatches=64", "microbatches=32"), steps=20)
    out = diagnose(capsys, "--run", str(after), "--before", str(before),
                   "--cluster", "dgx-a100", "--move-to", "ethernet-1nic")
    assert "-40.0% per GPU (measured" in line(out, "Measured")
    assert "on 64 GPUs" in out and "on 128:" in out
    cfg = load_model_config("llama2-13b")
    old = evaluate(cfg, Layout.parse(LAYOUT_13B.replace("dp=8", "dp=4")),
                   PlanInputs(gpus=64, cluster_preset="dgx-a100").cluster(), 4096, 1024,
                   PRECISIONS["bf16"])
    new = evaluate(cfg, Layout.parse(LAYOUT_13B.replace("microbatches=64", "microbatches=32")),
                   PlanInputs(gpus=128, cluster_preset="ethernet-1nic").cluster(), 4096, 1024,
                   PRECISIONS["bf16"])
    change = per_gpu_change(old, new)
    assert f"{change:+.1%} per GPU (the planner's forecast), {change / -0.4:.0%} of the " \
           "measured drop" in line(out, "Forecast")
    assert "the DP=4 -> 8 group (its gradient all-reduce)" in out
    # twice the GPUs on the same batch: the after side's seconds count twice, per GPU
    assert f"dp {old.time['dp']:.3g} -> {2 * new.time['dp']:.3g} s" in line(
        out, "Where the time went")


def test_a_move_that_made_the_run_faster_is_no_slowdown(tmp_path, capsys):
    """Two runs where both the measured and the forecast throughput per GPU rose: nothing
    dropped, so no cause outside the model is sought."""
    before = run_folder(tmp_path / "before", [
        step_record(step, 30 * GB, tokens_per_s=100_000.0) for step in range(20)], steps=20)
    after = run_folder(tmp_path / "after", [
        step_record(step, 30 * GB, tokens_per_s=120_000.0) for step in range(20)], steps=20)
    out = diagnose(capsys, "--run", str(after), "--before", str(before),
                   "--cluster", "ethernet-1nic", "--move-to", "dgx-a100")
    assert "+20.0% per GPU (measured" in line(out, "Measured")
    assert "measured drop" not in out
    assert line(out, "Likely cause") == ("Likely cause: none: the planner forecasts no part "
                                         "of the step to grow, and the run after is +20.0% per "
                                         "GPU (measured).")
    assert line(out, "What to do") == "What to do: nothing to fix here."


@pytest.mark.parametrize(("argv", "words"), [
    (["--run", "{tmp}/missing"], ("missing does not exist", "--metrics-file")),
    (["--run", "{tmp}/empty"], ("holds no metrics file", "--metrics-file")),
    (["--layout", "dp=8", "--move-to", "infiniband-9000"], ("invalid choice",
                                                              "ethernet-1nic")),
    ([], ("nothing to diagnose", "--run RUN_DIR")),
    (["--before", "{tmp}/empty"], ("--before needs --run",)),
    (["--move-to", "dgx-a100"], ("no layout to price", "--layout")),
    # one layout for two runs would divide each run's tokens by GPUs it may not have had
    (["--run", "{tmp}/empty", "--before", "{tmp}/empty", "--layout", "dp=8"],
     ("--layout prices one layout on both sides", "leave --layout out")),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, words):
    (tmp_path / "empty").mkdir()
    before = snapshot(tmp_path)
    capsys.readouterr()
    try:
        code = main(["diagnose", *(a.format(tmp=tmp_path) for a in argv)])
    except SystemExit as stop:  # argparse's own checks (a --move-to it does not know)
        code = stop.code
    assert code == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured
    assert captured.err.startswith("paraxis: error: ") and "Traceback" not in captured.err
    for word in words:
        assert word in captured.err, (word, captured.err)
    assert snapshot(tmp_path) == before


def test_runs_sharing_a_folder_each_read_their_own_config(tmp_path):
    """Metrics files side by side (runs/a.jsonl, runs/b.jsonl) each get their own config and
    trace (runs/a.config.toml); a run of a folder of its own keeps config.toml. The plain
    config.toml older runs shared is read only for the metrics file it names."""
    from paraxis.commands.diagnose import find_run
    from paraxis.files.run_records import beside, found_beside

    assert beside(tmp_path / "metrics.jsonl", "config.toml") == tmp_path / "config.toml"
    assert beside(tmp_path / "a.jsonl", "trace.json") == tmp_path / "a.trace.json"
    for name in ("a", "b"):
        (tmp_path / f"{name}.jsonl").write_text('{"step": 0}\n')
    (tmp_path / "config.toml").write_text(f'[logging]\nmetrics_file = "{tmp_path / "a.jsonl"}"\n')
    assert found_beside(tmp_path / "a.jsonl", "config.toml") == tmp_path / "config.toml"
    assert found_beside(tmp_path / "b.jsonl", "config.toml") is None
    (tmp_path / "b.config.toml").write_text("[train]\nsteps = 2\n")
    assert find_run(str(tmp_path / "b.jsonl"), "--run").config == tmp_path / "b.config.toml"
    assert find_run(str(tmp_path / "a.jsonl"), "--run").config == tmp_path / "config.toml"


def test_a_run_is_priced_as_the_model_it_trained_not_its_file_edited_since(tmp_path, capsys):
    """A run writes its model's fields beside its metrics (model.json): diagnose and report
    price that, where the model file named in config.toml may have changed since."""
    from paraxis.spec.model_config import PRESETS

    model = tmp_path / "m.json"
    trained = PRESETS["tiny"].replace(name="m")
    model.write_text(json.dumps(trained.to_dict()))
    run = tmp_path / "run"
    assert main(["train", "--model", str(model), "--steps", "2", "--global-batch", "4",
                 "--seq-len", "32", "--quiet", "--device", "cpu",
                 "--metrics-file", str(run / "metrics.jsonl")]) == 0
    assert json.loads((run / "model.json").read_text()) == trained.to_dict()
    model.write_text(json.dumps(trained.replace(n_layers=8, d_model=256, n_heads=8,
                                                n_kv_heads=8, d_ff=1024).to_dict()))
    out = diagnose(capsys, "--run", str(run))
    params = trained.num_params() * 4  # fp32
    assert f"(params {size(params)}," in line(out, "Forecast")


def test_a_move_with_the_hardware_fixed_by_flags_is_refused(capsys):
    """--hardware, --gpu and the network flags lie over the cluster moved to as over the one
    before, so the move would price the same hardware twice."""
    assert main(["diagnose", "--model", "llama2-7b", "--gpus", "16", "--layout", "dp=2,tp=8",
                 "--global-batch", "64", "--seq-len", "2048", "--gpu", "a100-80gb",
                 "--network-gbps", "12.5", "--move-to", "dgx-h100"]) == 2
    error = capsys.readouterr().err
    assert "--move-to dgx-h100 with --gpu, --network-gbps: those describe the hardware on " \
        "both sides of the move" in error and error.count("\n") == 1
