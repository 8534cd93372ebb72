"""Run files: TOML -> TrainConfig, flags override, typos rejected, round trip."""

import argparse

import pytest

from paraxis.config import read_run_file, to_toml
from paraxis.errors import ParaxisError
from paraxis.layout import Layout
from paraxis.train import add_train_arguments, config_from_args


def parse(*argv):
    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    return config_from_args(parser.parse_args(list(argv)))


def test_example_file_then_flags_override():
    cfg = parse("--config", "examples/tiny-llama.toml", "--steps", "7", "--zero", "1")
    assert cfg.model == "tiny-llama" and cfg.steps == 7 and cfg.global_batch == 16
    assert cfg.layout == Layout(zero=1, microbatches=2)


def test_round_trip(tmp_path):
    cfg = parse("--config", "examples/tiny-llama.toml", "--lr", "0.01", "--dp", "2")
    path = tmp_path / "run.toml"
    path.write_text(to_toml(cfg))
    again = parse("--config", str(path))
    assert again == cfg


def test_round_trip_of_fields_that_default_to_none(tmp_path):
    # float | None and int | None: the type comes from the annotation, not the None default
    cfg = parse("--exit-after", "5", "--peak-tflops", "400")
    path = tmp_path / "run.toml"
    path.write_text(to_toml(cfg))
    again = parse("--config", str(path))
    assert again == cfg and again.exit_after == 5 and again.peak_tflops == 400.0
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
