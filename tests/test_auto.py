"""`--layout auto`: the planner picks the layout, defends it, and the run shows
predicted next to measured; `paraxis plan --verify K` trains the top K and ranks them.

Prices come from the committed profile given with --hardware, so no test calibrates (the
calibration path is `report.hardware.choose_hardware`'s, tested with the report)."""

import json
import math
from pathlib import Path

import pytest

from bench.scale import MODEL as MODEL_08B
from paraxis.cli import main
from paraxis.commands.train import config_from_args
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import Layout
from paraxis.train.auto_layout import plan_for
from paraxis.train.config import RunConfig
from paraxis.train.run_file import read_run_file
from paraxis.train.verify import Measured, ranks_of, round_noise, spearman, table

PROFILE = str(Path(__file__).resolve().parents[1] / "docs" / "hardware-profile.json")
GB = 1e9


def _parse(*argv: str) -> RunConfig:
    from paraxis.cli import build_parser

    return config_from_args(build_parser().parse_args(["train", *argv]))


def _defence(err: str) -> list[str]:
    lines = [line for line in err.splitlines() if line.startswith("paraxis: ")]
    start = next(i for i, line in enumerate(lines) if line.startswith("paraxis: auto layout:"))
    return lines[start:start + 5]


def test_run_file_layout_auto_picks_runs_and_records_predicted_next_to_measured(
        tmp_path, capfd):
    run_dir = tmp_path / "run"
    run_file = tmp_path / "auto.toml"
    run_file.write_text(
        'layout = "auto"\n\n[model]\nname = "tiny"\n\n'
        "[train]\nsteps = 4\nglobal_batch = 8\nseq_len = 32\n\n"
        f'[logging]\nmetrics_file = "{run_dir / "metrics.jsonl"}"\nquiet = true\n'
        f'hardware = "{PROFILE}"\n\n[launch]\nnproc = 2\n')
    cfg = read_run_file(run_file)
    assert cfg.auto.enabled and cfg.layout == Layout()
    choice, _, _ = plan_for(cfg, 2)  # what the planner answers for this run

    assert main(["train", "--config", str(run_file), "--warmup", "0"]) == 0
    err = capfd.readouterr().err
    defence = _defence(err)
    assert defence[0].startswith(f"paraxis: auto layout: {choice.layout} on 2 ranks, "
                                 "predicted ")
    assert "searched" in defence[1] and "memory per rank" in err
    assert any("tie:" in line or "next best:" in line for line in defence)
    # the run ran the planner's layout and says so in its saved config
    saved = read_run_file(run_dir / "config.toml")
    assert saved.layout == choice.layout and not saved.auto.enabled
    assert saved.auto.predicted_step_s == pytest.approx(choice.best.step_time_s)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 4
    assert all(r["predicted_step_s"] == saved.auto.predicted_step_s and r["step_time_s"] > 0
               for r in records)
    assert f"step time of {choice.layout}: predicted " in err and "measured" in err


def test_layout_auto_on_the_command_line(tmp_path):
    cfg = _parse("--layout", "auto", "--nproc", "4")
    assert cfg.auto.enabled and cfg.layout == Layout()
    with pytest.raises(ParaxisError, match="leave out --zero"):
        _parse("--layout", "auto", "--zero", "1")
    run_file = tmp_path / "auto.toml"
    run_file.write_text('layout = "auto"\n[train]\nsteps = 3\n')
    assert _parse("--config", str(run_file)).auto.enabled
    # a layout given on the command line wins over the run file's auto
    given = _parse("--config", str(run_file), "--layout", "dp=2")
    assert not given.auto.enabled and given.layout == Layout(dp=2)


def _model_file(tmp_path: Path) -> str:
    path = tmp_path / "llama-0.8b.json"
    path.write_text(json.dumps(MODEL_08B.to_dict()))
    return str(path)


def test_a_model_that_fits_no_layout_ends_in_one_line(tmp_path, capfd):
    # 3 GB a rank: the profile's machine gives each of 2 ranks half its memory, 12.6 GB
    code = main(["train", "--model", _model_file(tmp_path), "--nproc", "2", "--layout", "auto",
                 "--hardware", PROFILE, "--global-batch", "8", "--seq-len", "128",
                 "--memory-gb", "3"])
    err = capfd.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert err[0].startswith("paraxis: error: no layout of 2 ranks fits llama-0.8b in 3 GB "
                             "per rank; closest: dp=")
    assert "needs" in err[0] and "--memory-gb" in err[0]


def _states_upper_bound(layout: Layout) -> float:
    """Model-state bytes of the fullest rank, counted from the model's own parameter shapes
    (not the planner's formulas): fp32 AdamW keeps 4 + 4 + 8 bytes per parameter, ZeRO
    shards them over dp (Rajbhandari et al. 2020), a stage holds its blocks and, at worst,
    both the embedding and the head, TP splits every tensor (an upper bound: norms are not
    split, but they are tiny)."""
    from paraxis.model.transformer import parameter_shapes

    per_stage = MODEL_08B.n_layers // layout.pp
    stages = [0.0] * layout.pp
    for name, shape in parameter_shapes(MODEL_08B).items():
        count = math.prod(shape)
        if name.startswith("blocks."):
            stages[int(name.split(".")[1]) // per_stage] += count
        else:
            stages = [s + count for s in stages]
    dp = layout.dp
    per_param = (4 / (dp if layout.zero >= 3 else 1) + 4 / (dp if layout.zero >= 2 else 1)
                 + 8 / (dp if layout.zero >= 1 else 1))
    return max(stages) / layout.tp * per_param


def test_the_08b_model_on_8_ranks_gets_a_layout_that_fits_each_rank(tmp_path):
    cfg = RunConfig.from_flags(model=_model_file(tmp_path), nproc=8, global_batch=8,
                               seq_len=128, hardware=PROFILE, layout="auto")
    choice, _, _ = plan_for(cfg, 8)
    limit = choice.cluster.gpu.memory_bytes
    layout = choice.layout.validate(8, choice.cfg, 8, 128)
    assert layout.world_size == 8 and choice.best.fits
    # 0.82B x 16 bytes of states is 13 GB: no rank of 3.16 GB holds them unsharded
    assert MODEL_08B.num_params() * 16 > 4 * limit
    states = _states_upper_bound(layout)
    memory = choice.best.memory
    assert states + memory["activations"] + memory["reserved"] <= limit, (layout, states / GB)


def test_plan_verify_trains_the_top_two_and_ranks_them(capsys):
    # the search flags shape what --verify ranks as they shape the plan (ignored before)
    code = main(["plan", "--verify", "2", "--verify-rounds", "1", "--verify-steps", "3",
                 "--model", "tiny", "--gpus", "2", "--global-batch", "8", "--seq-len", "32",
                 "--precision", "fp32", "--hardware", PROFILE, "--layout", "zero=1",
                 "--recompute", "none"])
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    head = out.index(next(line for line in out if line.startswith("#pred")))
    rows = [line.split() for line in out[head + 1:head + 3]]
    assert all(Layout.parse(r[4]).zero == 1 and Layout.parse(r[4]).recompute == "none"
               for r in rows), rows
    assert [int(r[0]) for r in rows] == [1, 2]  # the planner's order
    assert sorted(int(r[1]) for r in rows) == [1, 2]  # the measured ranking
    assert all(float(r[3].rstrip("s")) > 0 for r in rows)
    assert out[head + 3].startswith("Spearman rank correlation ")


def test_plan_verify_prices_and_trains_the_fused_loss(monkeypatch):
    # --fused-loss reaches both halves of --verify: the prices (the head and loss as one
    # kernel) and the training runs that measure them
    import paraxis.train.auto_layout as auto_layout

    seen = {}

    def capture(candidates, train_args, folder, rounds, steps, log):
        seen.update(candidates=candidates, train_args=train_args)
        return [Measured(str(e.layout), e.step_time_s, [e.step_time_s], rank, rank)
                for rank, e in enumerate(candidates, 1)]

    monkeypatch.setattr(auto_layout, "verify", capture)
    code = main(["plan", "--verify", "1", "--model", "tiny", "--gpus", "2", "--global-batch",
                 "8", "--seq-len", "32", "--precision", "fp32", "--hardware", PROFILE,
                 "--fused-loss"])
    assert code == 0 and "--fused-loss" in seen["train_args"]
    assert all(e.layout.tp == 1 and e.layout.zero <= 2 for e in seen["candidates"])
    priced = seen["candidates"][0]
    cfg = RunConfig.from_flags(model="tiny", nproc=2, global_batch=8, seq_len=32,
                               precision="fp32", hardware=PROFILE, layout="auto")
    chunked = plan_for(cfg, 2)[0].result.ranked
    same = next(e for e in chunked if e.layout == priced.layout)
    assert priced.memory["activations"] != same.memory["activations"]


def test_spearman_and_its_ranks():
    assert ranks_of([0.3, 0.1, 0.2, 0.1]) == [4, 1.5, 3, 1.5]
    assert spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert spearman([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert math.isnan(spearman([1, 1], [1, 2]))


def test_verify_says_when_the_rounds_disagree_more_than_the_layouts_differ():
    # one layout's medians 0.0575 and 0.0989 s over two rounds, the two layouts 1.2% apart:
    # the machine's noise, not the layouts, orders them, and the table says so
    rows = [Measured("a", 0.041, [0.0575, 0.0989], 1, 2), Measured("b", 0.043, [0.077, 0.0776],
                                                                   2, 1)]
    lines = table(rows)
    assert round_noise(rows) == pytest.approx((0.0989 - 0.0575) / 0.0782)
    assert lines[-1].startswith("Noise: between rounds one layout's median moved by up to 53%")
    assert "this machine does not order them" in lines[-1]
    quiet = [Measured("a", 0.041, [0.050, 0.051], 1, 1), Measured("b", 0.043, [0.060, 0.061],
                                                                  2, 2)]
    assert "does not order" not in table(quiet)[-1]


def test_a_rank_count_no_layout_can_run_fails_before_any_calibration(tmp_path, monkeypatch,
                                                                     capfd):
    # 3 ranks, a 2-layer model of 4 heads and a batch of 16: no (dp, tp, pp) runs it; the
    # rules say so at once, where the calibration (10-30 s, cached) came first before
    monkeypatch.setenv("PARAXIS_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "two.json"
    model.write_text(json.dumps({"name": "two-layer", "style": "llama", "vocab_size": 256,
                                 "n_layers": 2, "d_model": 64, "n_heads": 4, "n_kv_heads": 2,
                                 "d_ff": 128, "max_seq_len": 128}))
    code = main(["train", "--nproc", "3", "--layout", "auto", "--model", str(model),
                 "--seq-len", "64", "--global-batch", "16"])
    err = capfd.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "satisfies the rules" in err[0]
    assert not (tmp_path / "cache").exists()  # nothing was calibrated
