"""`paraxis experts` and the MoE pictures: routing, the all-to-all, a run's expert load."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from paraxis.cli import main
from paraxis.model.routing import counts_by_rank, route_batch
from paraxis.show.viz.moe import plot_all_to_all, plot_expert_load, plot_routing
from paraxis.spec.expert_placement import all_to_all_bytes, kib, send_matrix


def test_routing_of_a_batch_is_split_over_ep_ranks_as_data_parallelism_splits_it() -> None:
    cfg, routes = route_batch("tiny-moe", batch=4, seq_len=16)
    assert sorted(routes) == list(range(cfg.n_layers))  # every block of tiny-moe routes
    chosen, weights = routes[0]
    assert len(chosen) == 64 and all(len(c) == cfg.top_k for c in chosen)
    assert all(abs(sum(w) - 1) < 1e-5 for w in weights)
    counts = counts_by_rank(chosen, cfg.n_experts, ep=2)
    # rank 0 holds the first two sequences (tokens 0-31), rank 1 the last two
    first = [0] * cfg.n_experts
    for experts in chosen[:32]:
        for e in experts:
            first[e] += 1
    assert counts[0] == first
    assert sum(map(sum, counts)) == 64 * cfg.top_k


def test_pictures_draw_from_the_placement_facts() -> None:
    counts = [[3, 0, 1, 4], [0, 0, 2, 2]]
    sends = send_matrix(counts, ep=2)
    assert sends == [[3, 5], [0, 4]]
    assert all_to_all_bytes(sends, d_model=8, bytes_per_value=4) == [5 * 32, 0]
    figure = plot_all_to_all(counts, ep=2, d_model=8)
    texts = [t.get_text() for t in figure.axes[0].texts]
    assert "3\nstays" in texts and "0\n0 KiB" in texts and "5\n0.16 KiB" in texts
    assert [t.get_text() for t in figure.axes[0].get_yticklabels()] == [
        "rank 0: 0.16 KiB out", "rank 1: 0 KiB out"]  # 160 B once read "0 KiB"
    assert [kib(b) for b in (0, 512, 3 * 1024 + 300, 20 * 1024)] == ["0", "0.5", "3.3", "20"]
    plot_routing([[0, 1], [2, 3]], [[0.6, 0.4], [0.5, 0.5]], n_experts=4, ep=2)  # draws
    # the first tokens drawn, the bars counting every token of the batch (as the CLI's table)
    routing = plot_routing([[0, 1]], [[0.6, 0.4]], n_experts=4,
                           counted=[[0, 1], [0, 2], [0, 3]])
    assert "the first 1 of 3 tokens" in routing.axes[0].get_title()
    assert [bar.get_height() for bar in routing.axes[1].patches] == [3, 1, 1, 1]
    load = plot_expert_load([[[4, 4, 4, 4], [4, 4, 4, 4]], [[8, 4, 2, 2], [4, 4, 4, 4]]])
    assert "worst block 2.00x" in load.axes[1].get_title()


def test_experts_command_prints_and_draws(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["experts", "--model", "tiny-moe", "--ep", "2", "--batch", "2",
                 "--seq-len", "32", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "busiest / mean" in out and "dispatch KiB" in out
    assert (tmp_path / "routing.png").stat().st_size > 0
    assert (tmp_path / "all_to_all.png").stat().st_size > 0


@pytest.mark.parametrize(("argv", "message"), [
    (["--model", "tiny-llama"], "has no experts"),
    (["--ep", "3", "--batch", "6"], "ep=3 must divide the number of experts"),
    (["--ep", "2", "--batch", "3"], "not divisible by --ep 2"),
    (["--block", "9", "--out", "OUT"], "--block 9 is not an MoE block"),
])
def test_bad_input_is_one_line(argv: list[str], message: str, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    argv = [str(tmp_path / "pics") if a == "OUT" else a for a in argv]
    assert main(["experts", "--seq-len", "8", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "pics").exists()


@pytest.fixture(scope="module")
def ep_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Future, Path]]:
    """`paraxis train` of tiny-moe on dp=2 x ep=2 for 3 steps, started in the background by
    the plan's report test so that it trains while that test draws: (its process, its
    folder)."""
    run = tmp_path_factory.mktemp("ep") / "run"
    with ThreadPoolExecutor(1) as pool:
        yield pool.submit(
            subprocess.run, [sys.executable, "-m", "paraxis", "train", "--model", "tiny-moe",
                             "--steps", "3", "--seq-len", "32", "--nproc", "2", "--dp", "2",
                             "--ep", "2", "--metrics-file", str(run / "metrics.jsonl")],
            check=True, capture_output=True, timeout=300), run


def test_report_of_an_moe_plan_draws_the_all_to_all(tmp_path: Path,
                                                    ep_run: tuple[Future, Path]) -> None:
    from paraxis.plan.inputs import PlanInputs
    from paraxis.show.report.build import report_plan, write_report
    from paraxis.show.report.experts import experts_section

    html = write_report(tmp_path / "r.html", model="mixtral-8x7b", gpus=64,
                        layout="dp=8,tp=8,ep=8", global_batch=64, seq_len=4096).read_text()
    # with SP, the experts section the same report would hold
    sp = PlanInputs(model="mixtral-8x7b", gpus=64, layout="dp=8,tp=8,ep=8,sequence_parallel=true",
                    global_batch=64, seq_len=4096)
    _, _, shards = experts_section(report_plan(sp)[0], None)
    assert "Mixture of experts" in html and "dispatch all-to-all" in html
    assert "each rank holds 1 expert of" in html
    # the planner's sentence (plan.experts.experts_over_tp), for this layout: no SP
    # ... in the experts section and under the tp split, whose experts are drawn whole
    assert html.count("each of the tp=8 ranks repeats their work on the whole sequence "
                      "(no SP)") == 2
    assert "ranks routes only its own sequence shard (SP, dropless)" in shards
    assert "too large to build here" in html  # routing: `paraxis experts` on a checkpoint


def test_report_of_an_expert_parallel_run_draws_its_expert_load(
        tmp_path: Path, ep_run: tuple[Future, Path]) -> None:
    import json

    trained, run = ep_run
    trained.result()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(len(r["expert_tokens"]) == 4 for r in records)  # one list per MoE block
    assert main(["report", "--run", str(run), "--out", str(tmp_path / "r.html")]) == 0
    html = (tmp_path / "r.html").read_text()
    assert "expert load of the run" in html and "dispatch all-to-all" in html
    assert "routing of the first tokens" in html and "initial weights" in html
