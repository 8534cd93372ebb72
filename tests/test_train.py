"""Single-device training: gradient accumulation equivalence, the loop, the command line."""

import json
import math
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from paraxis.engine.contract import LocalEngine
from paraxis.model.transformer import build_model
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import PRESETS
from paraxis.train.config import RunConfig
from paraxis.train.loop import run_training
from paraxis.train.lr_schedule import learning_rate


@pytest.mark.parametrize("accum", [2, 4])
def test_grad_accumulation_equals_one_big_batch(accum):
    cfg = PRESETS["tiny-llama"]
    torch.manual_seed(0)
    x = torch.randint(0, 256, (8, 32))
    y = torch.randint(0, 256, (8, 32))
    engines = [LocalEngine(build_model(cfg, seed=5), Layout(microbatches=m)) for m in (1, accum)]
    losses = [engine.forward_backward(x, y) for engine in engines]
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    for p, q in zip(engines[0].model.parameters(), engines[1].model.parameters(), strict=True):
        # fp32 sums in another order: elements that cancel to ~0 are compared on the scale of
        # the tensor's largest gradient.
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-5 * p.grad.abs().max())
    for engine in engines:
        engine.clip_grad_norm(1.0)
        engine.optimizer_step(1e-3)
    # Adam's first step is ~lr * grad/(|grad| + eps): where a gradient is near eps, a rounding
    # difference moves the weight by a fraction of lr, so weights are compared within 1e-5.
    for p, q in zip(engines[0].model.parameters(), engines[1].model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-5)


def test_training_run_with_accumulation_matches_without(tmp_path):
    common = dict(model="tiny", steps=4, global_batch=8, seq_len=32, device="cpu", quiet=True)
    plain = run_training(RunConfig.from_flags(**common, metrics_file=str(tmp_path / "m.jsonl")))
    accum = run_training(RunConfig.from_flags(**common, layout=Layout(microbatches=4)))
    for a, b in zip(plain, accum, strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
    lines = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [0, 1, 2, 3]
    assert set(lines[0]) >= {"step", "loss", "lr", "tokens_per_s", "step_time_s",
                             "peak_mem_bytes"}


def test_loss_falls():
    records = run_training(RunConfig.from_flags(model="tiny", steps=40, global_batch=8,
                                                seq_len=64, device="cpu", quiet=True))
    assert records[-1]["loss"] < records[0]["loss"] - 1.0


def test_learning_rate_warms_up_then_decays():
    cfg = RunConfig.from_flags(steps=100, warmup=10, lr=1.0, min_lr_ratio=0.1)
    rates = [learning_rate(s, cfg) for s in range(100)]
    assert rates[0] == pytest.approx(0.1) and rates[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(rates[9:], rates[10:], strict=False))
    # the cosine over the 90 steps after warmup, from lr down to the 0.1 floor
    for step in (10, 55, 99):
        progress = (step - 10) / 90
        assert rates[step] == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


def test_a_resume_under_another_schedule_says_so(tmp_path, capsys):
    """The schedule spans --steps: a resume that raises it (or changes --lr, --min-lr-ratio,
    --warmup) stretches the cosine under the steps already trained, and says so in one note
    with the rate the step takes now and under the checkpoint's schedule."""
    common = dict(model="tiny", global_batch=4, seq_len=32, device="cpu", warmup=1,
                  checkpoint_dir=str(tmp_path / "ck"))
    run_training(RunConfig.from_flags(**common, steps=4, exit_after=2))
    capsys.readouterr()
    run_training(RunConfig.from_flags(**common, steps=4, resume="auto", exit_after=3))
    assert "learning-rate schedule" not in capsys.readouterr().err  # the same schedule
    run_training(RunConfig.from_flags(**common, steps=8, resume="auto", lr=1e-3))
    notes = [line for line in capsys.readouterr().err.splitlines() if "schedule" in line]
    now, saved = (learning_rate(3, RunConfig.from_flags(steps=8, warmup=1, lr=1e-3)),
                  learning_rate(3, RunConfig.from_flags(steps=4, warmup=1)))
    assert notes == [
        "paraxis: note: the learning-rate schedule is not the checkpoint's (--steps 4 -> 8, "
        f"--lr 0.003 -> 0.001): step 3 runs at lr {now:.3g} where the checkpoint's schedule "
        f"gave {saved:.3g}"]


def paraxis(*args):
    return subprocess.run([sys.executable, "-m", "paraxis", *args], capture_output=True,
                          text=True, timeout=120)


def test_help_lists_subcommands():
    result = paraxis("--help")
    assert result.returncode == 0
    assert "train" in result.stdout and "demo" in result.stdout


def test_every_command_prints_its_help(capsys):
    # argparse %-formats help strings: a bare "5%" in one option broke `paraxis train --help`
    from paraxis.cli import COMMANDS, build_parser

    parser = build_parser()
    for name, _, _ in COMMANDS:
        with pytest.raises(SystemExit) as exit_:
            parser.parse_args([name, "--help"])
        assert exit_.value.code == 0, name
        assert "usage: paraxis " + name in capsys.readouterr().out


BAD_TRAIN = [
    (["--model", "gpt5"], "unknown model 'gpt5'"),
    (["--data", "/nonexistent/tokens.bin"], "does not exist"),
    (["--seq-len", "4096"], "over tiny's context"),
    (["--global-batch", "10", "--grad-accum", "4"], "not divisible by dp*microbatches"),
    (["--steps", "0"], "--steps 0 must be at least 1"),
    (["--tp", "3"], "dp*tp*pp"),
]


@pytest.fixture(scope="module")
def bad_train_runs() -> dict[tuple[str, ...], subprocess.CompletedProcess]:
    """`paraxis train` with each of BAD_TRAIN's flags, two at a time: a process's start-up
    (importing torch) is most of its time and takes one core, so two cores run two."""
    with ThreadPoolExecutor(2) as pool:
        results = pool.map(lambda args: paraxis("train", "--steps", "1", "--quiet", *args),
                           [args for args, _ in BAD_TRAIN])
        return {tuple(args): result
                for (args, _), result in zip(BAD_TRAIN, results, strict=True)}


@pytest.mark.parametrize("args,message", BAD_TRAIN)
def test_bad_train_input_is_one_line_without_traceback(bad_train_runs, args, message):
    result = bad_train_runs[tuple(args)]
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("paraxis: error:"), result.stderr
    assert message in lines[0]
    assert "Traceback" not in result.stderr


def test_a_rotary_model_trains_past_its_pretraining_context():
    """RoPE positions are computed, not looked up: a Llama-style model trains past its
    max_seq_len (as long-context training does), where the planner prices it too."""
    records = run_training(RunConfig.from_flags(model="tiny-llama", steps=1, global_batch=2,
                                                seq_len=2 * PRESETS["tiny-llama"].max_seq_len,
                                                quiet=True))
    assert len(records) == 1 and records[0]["loss"] > 0


def test_adam_betas_and_eps_reach_the_optimizer():
    """--adam-beta1/--adam-beta2/--adam-eps (Megatron-LM's names) change the update."""
    common = dict(model="tiny", steps=3, global_batch=2, seq_len=32, quiet=True)
    base = [r["loss"] for r in run_training(RunConfig.from_flags(**common))]
    again = [r["loss"] for r in run_training(RunConfig.from_flags(**common))]
    beta = [r["loss"] for r in run_training(RunConfig.from_flags(**common, adam_beta2=0.5))]
    assert base == again and base[0] == beta[0] and base[2] != beta[2]
