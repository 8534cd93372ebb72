"""Run files: TOML -> RunConfig, flags override, typos rejected, round trip."""

import argparse
import contextlib
import dataclasses
import io
import json
import math

import pytest

from paraxis.cli import main
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import Layout
from paraxis.train.config import RunConfig, sections
from paraxis.train.flags import add_arguments, config_from_args
from paraxis.train.run_file import read_run_file, to_toml


def parse(*argv):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return config_from_args(parser.parse_args(list(argv)))


def test_example_file_then_flags_override():
    cfg = parse("--config", "examples/tiny-llama.toml", "--steps", "7", "--zero", "1")
    assert cfg.model.name == "tiny-llama" and cfg.train.steps == 7
    assert cfg.train.global_batch == 16
    assert cfg.layout == Layout(zero=1, microbatches=2)


def test_a_flag_always_overrides_the_run_file(tmp_path):
    """`--lr 0.003` and `--steps 100` equal the defaults; the run file says otherwise and
    must still lose to them (it used to win: "given" was guessed by comparing with the
    defaults). End to end: the learning rates the run really used, two steps of a cosine
    schedule that spans 100 steps (the run file's exit_after stops it early)."""
    run_file = tmp_path / "run.toml"
    run_file.write_text("[train]\nsteps = 3\nglobal_batch = 1\nseq_len = 8\ndevice = \"cpu\"\n"
                        "[optimizer]\nlr = 0.01\nwarmup_steps = 0\n[checkpoint]\nexit_after = 2\n"
                        f"dir = \"{tmp_path / 'ck'}\"\n")  # --exit-after saves a checkpoint
    metrics = tmp_path / "m.jsonl"
    with contextlib.redirect_stderr(io.StringIO()):
        code = main(["train", "--config", str(run_file), "--lr", "0.003", "--steps", "100",
                     "--quiet", "--metrics-file", str(metrics)])
    assert code == 0
    lrs = [json.loads(line)["lr"] for line in metrics.read_text().splitlines()]
    floor = 0.1 * 0.003  # min_lr_ratio * lr
    assert lrs == pytest.approx([0.003, floor + 0.5 * (0.003 - floor) * (1 + math.cos(math.pi
                                                                                     / 100))])


def test_flags_override_whatever_their_value(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text("[optimizer]\nlr = 0.01\n[train]\nsteps = 7\n[logging]\nquiet = true\n"
                    "[layout]\ndp = 2\nzero = 1\nmicrobatches = 2\n")
    cfg = parse("--config", str(path), "--lr", "0.003", "--steps", "100", "--no-quiet",
                "--zero", "0")
    assert (cfg.optimizer.lr, cfg.train.steps, cfg.logging.quiet) == (0.003, 100, False)
    assert cfg.layout == Layout(dp=2, zero=0, microbatches=2)
    # --layout replaces the file's layout; single-axis flags and --grad-accum go on top
    cfg = parse("--config", str(path), "--layout", "tp=2", "--dp", "1", "--grad-accum", "4")
    assert cfg.layout == Layout(tp=2, microbatches=4)
    assert parse("--config", str(path)).optimizer.lr == 0.01


def test_every_field_has_help_and_reads_back(tmp_path):
    for section, cls in sections().items():
        if section != "layout":
            assert all(f.metadata["help"] for f in dataclasses.fields(cls)), section
    cfg = RunConfig.from_flags(model="tiny-llama", tokenizer="tok.json", seed=3, precision="bf16",
                               on_nan="skip", warmup=0, layout="tp=2,sp=true,pp=2",
                               microbatches=4, eval_every=5, quiet=True, keep=0,
                               checkpoint_dir="ck", resume="auto", nproc=4, max_restarts=1,
                               rdzv_host="10.0.0.1")
    assert cfg.layout == Layout(tp=2, pp=2, sequence_parallel=True, microbatches=4)
    path = tmp_path / "run.toml"
    path.write_text(to_toml(cfg))
    assert read_run_file(path) == cfg
    assert parse("--config", str(path)) == cfg


def test_round_trip(tmp_path):
    cfg = parse("--config", "examples/tiny-llama.toml", "--lr", "0.01", "--dp", "2")
    path = tmp_path / "run.toml"
    path.write_text(to_toml(cfg))
    again = parse("--config", str(path))
    assert again == cfg


def test_round_trip_of_fields_that_default_to_none(tmp_path):
    # float | None and int | None: the type comes from the annotation, not the None default
    cfg = parse("--exit-after", "5", "--peak-tflops", "400", "--checkpoint-dir",
                str(tmp_path / "ck"))  # a run file is checked as it is read: a valid run
    path = tmp_path / "run.toml"
    path.write_text(to_toml(cfg))
    again = parse("--config", str(path))
    assert again == cfg and again.checkpoint.exit_after == 5
    assert again.logging.peak_tflops == 400.0
    path.write_text('[logging]\npeak_tflops = "400"\n')
    with pytest.raises(ParaxisError, match="must be of type float"):
        read_run_file(path)


@pytest.mark.parametrize("text,message", [
    ("[optimizer]\nlearning_rate = 1.0\n", "unknown key 'learning_rate' in [optimizer]"),
    ("[trainer]\nsteps = 1\n", "unknown section [trainer]"),
    ("[layout]\ndp = 2\ntensor = 2\n", "unknown [layout] key(s) tensor"),
    ("[train\nsteps = 1\n", "not valid TOML"),
])
def test_typos_are_errors(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ParaxisError) as error:
        read_run_file(path)
    assert message in str(error.value)


def test_missing_file():
    with pytest.raises(ParaxisError, match="does not exist"):
        read_run_file("/nonexistent/run.toml")


def test_compile_defaults_to_on_for_cuda_only():
    """No --compile given: compiled on CUDA, where the H200 measured it faster
    (docs/gpu/README.md), except under a schedule that splits the backward; eager on CPU.
    Given, it is what it says."""
    from paraxis.train.config import TrainSection

    auto, on, off = TrainSection(), TrainSection(compile=True), TrainSection(compile=False)
    assert auto.compiles("cuda", "1f1b") and not auto.compiles("cpu", "1f1b")
    assert not auto.compiles("cuda", "zb-h1")
    assert on.compiles("cpu", "1f1b") and not off.compiles("cuda", "1f1b")


def test_a_saved_config_reads_back_the_same_run_from_any_folder(tmp_path, monkeypatch, capsys):
    """config.toml (beside the metrics and in each checkpoint) holds its paths whole: read
    back with --config from another folder, `--resume auto` continues the run, where its
    relative checkpoint folder once named none there and the run silently began again."""
    run, other = tmp_path / "run", tmp_path / "other"
    run.mkdir()
    other.mkdir()
    monkeypatch.chdir(run)
    assert main(["train", "--quiet", "--model", "tiny", "--steps", "4", "--exit-after", "2",
                 "--global-batch", "4", "--seq-len", "32", "--checkpoint-dir", "ck",
                 "--metrics-file", "m.jsonl", "--device", "cpu"]) == 0
    saved = run / "ck" / "step-00000002" / "config.toml"
    assert f'dir = "{run / "ck"}"' in saved.read_text()
    assert f'metrics_file = "{run / "m.jsonl"}"' in (run / "m.config.toml").read_text()
    monkeypatch.chdir(other)
    assert main(["train", "--quiet", "--config", str(saved), "--resume", "auto",
                 "--exit-after", "3", "--metrics-file", "m.jsonl", "--device", "cpu"]) == 0
    steps = [json.loads(line)["step"] for line in (other / "m.jsonl").read_text().splitlines()]
    assert steps and steps[0] == 2, steps  # resumed after the checkpoint's two steps
    assert not (other / "ck").exists() and (run / "ck" / "step-00000003").is_dir()
    capsys.readouterr()


def test_a_full_disk_under_the_metrics_file_is_one_line_and_leaves_the_files(
        tmp_path, monkeypatch):
    """The resolved config beside the metrics file and a resumed run's trimmed metrics are
    written whole or not at all: on a full disk one line (RunFailed, exit 3), the metrics
    file as it was and no empty config.toml or staging file left."""
    import errno

    from paraxis.files import host
    from paraxis.spec.errors import RunFailed
    from paraxis.train import resume

    metrics = tmp_path / "m.jsonl"
    metrics.write_text('{"step": 0}\n{"step": 1}\n{"step": 2}\n')
    cfg = RunConfig()
    cfg = dataclasses.replace(cfg, logging=dataclasses.replace(cfg.logging,
                                                               metrics_file=str(metrics)))

    def full(path, data, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(host.Path, "write_text", full)
    with pytest.raises(RunFailed, match="No space left on device"):
        resume.write_config(cfg)
    with pytest.raises(RunFailed, match="cannot rewrite the metrics file"):
        resume.trim_metrics(metrics, 2)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.jsonl"]
    assert metrics.read_text().count("step") == 3


def test_tensorboard_of_a_resumed_run_shows_each_step_once(tmp_path):
    """The events logged after the checkpoint a run resumes from are taken again: the
    resumed writer purges them (TensorBoard's purge_step), as the metrics file is trimmed."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from paraxis.train.metrics import MetricsSink

    for start, stop in ((0, 4), (2, 6)):  # killed after step 3, resumed from step 2
        sink = MetricsSink(None, str(tmp_path), append=start > 0, start_step=start)
        for step in range(start, stop):
            sink.writer.add_scalar("train/loss", float(step), step)
        sink.writer.close()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == [0, 1, 2, 3, 4, 5]


def test_a_saved_config_keeps_the_names_a_run_reads_first(tmp_path, monkeypatch):
    """A preset, the embedded corpus and --resume auto are names the run reads before any
    path: a folder of that name beside the run does not turn them into paths."""
    from paraxis.train.run_file import with_absolute_paths

    monkeypatch.chdir(tmp_path)
    for name in ("tiny", "embedded", "auto", "data.txt"):
        (tmp_path / name).mkdir()
    cfg = RunConfig.from_flags(model="tiny", data="embedded,data.txt:1", resume="auto",
                               checkpoint_dir="ck")
    saved = with_absolute_paths(cfg)
    assert (saved.model.name, saved.checkpoint.resume) == ("tiny", "auto")
    assert saved.data.path == f"embedded,{tmp_path / 'data.txt'}:1"
    assert saved.checkpoint.dir == str(tmp_path / "ck")
