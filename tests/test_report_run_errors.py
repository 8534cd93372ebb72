"""`paraxis report --run` and `paraxis schedule --from-trace` given a damaged run folder.

A metrics line that is JSON but not a step record, a trace that is not one, and a run folder
that cannot be written: each is one line on stderr naming the file and a fix, exit code 2, and
the folder (and an earlier --out) left as they were. Run folders are written by hand, modelled
on what `paraxis train --metrics-file` writes, so these tests train nothing.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from paraxis.cli import main
from paraxis.train.calibrate import quick
from tests.test_bad_input import snapshot  # every name: size and mtime

# one step as `paraxis train --metrics-file` writes it (a CPU run of tiny)
STEP = {"step": 0, "loss": 5.35, "lr": 3e-4, "grad_norm": 6.07, "tokens_per_s": 318.4,
        "step_time_s": 0.402, "mfu": None, "peak_mem_bytes": 342634496, "data_wait_s": 2e-4,
        "cpu_steal": 0.0, "peak_mem_bytes_by_rank": [342634496],
        "peak_mem_bytes_max_rank": 342634496, "data_bytes_read": 264}
EVENT = {"rank": 0, "stage": 0, "kind": "F", "microbatch": 0, "chunk": 0,
         "start_s": 0.0, "end_s": 0.01}


def run_folder(tmp_path: Path, lines: list[str], trace: str | None = None) -> Path:
    """A run folder with these metrics.jsonl lines (and a trace.json when given)."""
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "metrics.jsonl").write_text("".join(f"{line}\n" for line in lines))
    if trace is not None:
        (folder / "trace.json").write_text(trace)
    return folder


def fails_in_one_line(argv: list[str], capsys: pytest.CaptureFixture, *words: str) -> str:
    """Run `paraxis argv`: exit code 2 and one line on stderr holding each of `words`."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("paraxis: error: "), err
    assert "Traceback" not in err
    for word in words:
        assert word in err, (word, err)
    return err


@pytest.mark.parametrize(("line", "problem"), [
    ("[1, 2]", "a JSON list, not an object"),
    ('{"loss": 1.0}', "missing step, tokens_per_s, step_time_s"),
    (json.dumps({**STEP, "tokens_per_s": "fast"}), 'its tokens_per_s is "fast", not a number'),
    (json.dumps({**STEP, "step_time_s": 0}), "its step_time_s is 0, not above zero"),
    (json.dumps({**STEP, "peak_mem_bytes": None}), "its peak_mem_bytes is null"),
])
def test_report_refuses_a_line_that_is_not_a_step_record(tmp_path, capsys, line, problem):
    folder = run_folder(tmp_path, [json.dumps(STEP), line])
    out = tmp_path / "good.html"
    out.write_text("an earlier report\n")
    before = snapshot(tmp_path)
    fails_in_one_line(["report", "--run", str(folder), "--out", str(out)], capsys,
                      "metrics.jsonl:2 is not a step record of `paraxis train`", problem,
                      "--metrics-file")
    assert snapshot(tmp_path) == before


def test_a_step_record_may_leave_out_what_a_run_did_not_measure(tmp_path):
    from paraxis.files.run_records import load_metrics

    folder = run_folder(tmp_path, [json.dumps({**STEP, "loss": None, "cpu_steal": None}),
                                   json.dumps({"step": 1, "loss": 5.0, "tokens_per_s": 300,
                                               "step_time_s": 0.4})])
    records = load_metrics(folder / "metrics.jsonl")
    assert len(records) == 2 and records[0]["loss"] != records[0]["loss"]  # null: NaN


BAD_TRACES = [
    ('{"traceEvents": 5}', "traceEvents must be a list of events"),
    ('{"traceEvents": [5]}', "Chrome trace event 0 is 5, not an object"),
    ('{"traceEvents": [{"ph": "X", "ts": "a", "dur": 1}]}', "not a complete event"),
    ("[]", "holds no events"),
    ('{"traceEvents": [{"ph": "M"}]}', "holds no events"),
    ("5", "holds a JSON int"),
    ("[5]", "trace event 0 is 5, not an object"),
    (json.dumps([{**EVENT, "start_s": "a"}]), "start_s 'a'"),
    (json.dumps([{**EVENT, "stage": -1}]), "stage -1"),
]


@pytest.mark.parametrize(("text", "problem"), BAD_TRACES)
def test_schedule_refuses_a_malformed_trace_naming_it(tmp_path, capsys, text, problem):
    trace = tmp_path / "tr.json"
    trace.write_text(text)
    fails_in_one_line(["schedule", "--from-trace", str(trace)], capsys,
                      f"trace {trace}", problem, "trace.json a pipeline run")


@pytest.mark.parametrize(("text", "problem"), BAD_TRACES[:4])
def test_report_refuses_a_malformed_trace_in_the_run_folder(tmp_path, capsys, text, problem):
    folder = run_folder(tmp_path, [json.dumps(STEP)], trace=text)
    out = tmp_path / "good.html"
    out.write_text("an earlier report\n")
    before = snapshot(tmp_path)
    fails_in_one_line(["report", "--run", str(folder), "--out", str(out)], capsys,
                      "trace.json", problem)
    assert snapshot(tmp_path) == before


def test_a_chrome_trace_paraxis_wrote_still_loads(tmp_path):
    from paraxis.files.trace import load_trace, write_chrome_trace

    events = [EVENT, {**EVENT, "kind": "B", "start_s": 0.01, "end_s": 0.03}]
    loaded = load_trace(write_chrome_trace(events, tmp_path / "trace.json"))
    assert [(e["kind"], e["end_s"] - e["start_s"]) for e in loaded] == \
        [(e["kind"], pytest.approx(e["end_s"] - e["start_s"])) for e in events]


# --- a CPU calibration is kept in the run folder, or where that cannot be written, nowhere

PROFILE = {"calibration": {"device": {"type": "cpu"}}, "gpu": {}, "cluster": {}}


def test_a_profile_is_saved_whole_in_the_run_folder(tmp_path):
    wanted = tmp_path / "run" / quick.PROFILE_NAME
    assert quick.save_profile(PROFILE, wanted) == wanted
    assert json.loads(wanted.read_text()) == PROFILE
    assert [p.name for p in wanted.parent.iterdir()] == [quick.PROFILE_NAME]  # no staging


def test_a_profile_that_cannot_be_saved_goes_to_a_temporary_file(tmp_path):
    (tmp_path / "a_file").write_text("not a folder\n")
    wanted = tmp_path / "a_file" / quick.PROFILE_NAME  # its folder cannot be made
    saved = quick.save_profile(PROFILE, wanted)
    assert saved != wanted and json.loads(saved.read_text()) == PROFILE
    assert (tmp_path / "a_file").read_text() == "not a folder\n"
    saved.unlink()


def test_a_malformed_cached_profile_is_no_match(tmp_path):
    for text in ("[1]", '{"calibration": 5}', "not json"):
        (tmp_path / quick.PROFILE_NAME).write_text(text)
        assert not quick.matches(tmp_path / quick.PROFILE_NAME, "cpu", 2, 1, "tiny")


def test_report_on_a_read_only_run_folder_writes_nothing_into_it(tmp_path, capsys,
                                                                monkeypatch):
    """A read-only folder (chmod): the report is priced on a calibration in a temporary file
    (faked here: the committed profile). Root writes through a chmod (CI runs as root): there
    the folder's writes get the EACCES a read-only folder gives (`write_whole` refused)."""
    folder = run_folder(tmp_path, [json.dumps({**STEP, "step": i}) for i in range(3)])
    committed = quick.COMMITTED.read_text()  # read before the path is moved away below
    monkeypatch.setattr("paraxis.train.calibrate.measure.calibrate",
                        lambda *args, **kwargs: json.loads(committed))
    monkeypatch.setattr(quick, "COMMITTED", tmp_path / "no-committed-profile.json")
    before = snapshot(folder)
    folder.chmod(0o555)
    if os.access(folder, os.W_OK):  # root: the folder refuses as a read-only one would
        write_whole = quick.write_whole

        def refused(path: Path, text: str) -> None:
            if Path(path).resolve().is_relative_to(folder.resolve()):
                raise PermissionError(errno.EACCES, "Permission denied", str(path))
            write_whole(path, text)

        monkeypatch.setattr(quick, "write_whole", refused)
    try:
        out = tmp_path / "r.html"
        assert main(["report", "--run", str(folder), "--out", str(out), "--seq-len", "32",
                     "--global-batch", "4"]) == 0, capsys.readouterr().err
        assert out.is_file() and snapshot(folder) == before
    finally:
        folder.chmod(0o755)


def test_the_report_says_when_a_calibration_was_not_saved(tmp_path):
    found = quick.FoundProfile(tmp_path / "x.json", "calibrated", "a CPU", 2, 4.0,
                               unwritable=tmp_path / "run")
    assert found.describe().endswith(f"made now in 4 s, not saved: {tmp_path / 'run'} "
                                     "cannot be written")
    assert "not saved" not in quick.FoundProfile(tmp_path / "x.json", "calibrated", "a CPU",
                                                 2, 4.0).describe()


def test_schedule_takes_a_traces_stages_or_says_they_differ(tmp_path, capsys):
    """A two-stage run's trace against the default four stages: the two missing stages once
    cost nothing, and the text timeline divided by zero."""
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps([{**EVENT, "stage": s, "rank": s, "microbatch": m,
                                  "kind": kind, "start_s": 0.1 * m + t,
                                  "end_s": 0.1 * m + t + 0.01}
                                 for s in (0, 1) for m in range(4)
                                 for kind, t in (("F", 0.0), ("B", 0.05))]))
    fails_in_one_line(["schedule", "--from-trace", str(trace)], capsys,
                      "had 2 pipeline stages, not 4: give --stages 2")
    fails_in_one_line(["schedule", "--from-trace", str(trace), "--stages", "3"], capsys,
                      "give --stages 2")
    assert main(["schedule", "--from-trace", str(trace), "--stages", "2",
                 "--microbatches", "4"]) == 0
    capsys.readouterr()
    # a 1F1B run's trace has one chunk a stage and no W: not zb-v's two, nor zb-h1's split
    fails_in_one_line(["schedule", "--kind", "zb-v", "--from-trace", str(trace), "--stages",
                       "2"], capsys, "had 1 chunk(s) per stage and zb-v runs 2",
                      "--kind 1f1b or zb-h1")
    fails_in_one_line(["schedule", "--kind", "zb-h1", "--from-trace", str(trace), "--stages",
                       "2"], capsys, "the trace has no W (weight-gradient) events",
                      "--kind 1f1b")
    forwards = tmp_path / "forwards.json"  # a step cut short: no backward to replay
    forwards.write_text(json.dumps([{**EVENT, "stage": s} for s in (0, 1)]))
    fails_in_one_line(["schedule", "--from-trace", str(forwards), "--stages", "2"], capsys,
                      "no forward or backward of virtual stage 0")


@pytest.mark.parametrize(("argv", "problem"), [
    (["--backward-cost", "0"], "--backward-cost 0: every stage's must be at least"),
    (["--forward-cost", "0,0,0,0"], "--forward-cost 0,0,0,0"),
    (["--stage-scale", "1e-300,1,1,1"], "--stage-scale needs 4 factors of at least"),
    (["--kind", "zb-h1", "--weight-cost", "2", "--backward-cost", "2"],
     "--weight-cost 2 must be less than the backward 2"),
    (["--kind", "zb-h1", "--weight-cost", "0"], "a split backward's W must be at least"),
])
def test_schedule_refuses_a_stage_that_takes_no_time(capsys, argv, problem):
    fails_in_one_line(["schedule", *argv], capsys, problem)


def _chunked_trace(path, placement: str) -> None:
    """Two stages, two chunks: microbatch 0's forwards in the order the placement runs them
    (a V: the second chunk starts on the last stage; a loop: on the first)."""
    order = [(0, 0), (1, 0)] + ([(1, 1), (0, 1)] if placement == "v" else [(0, 1), (1, 1)])
    events = []
    for m in range(4):
        for t, (stage, chunk) in enumerate(order):
            for kind, extra in (("F", 0.0), ("B", 0.5), ("W", 0.7)):
                start = m + 0.05 * t + extra
                events.append({**EVENT, "stage": stage, "rank": stage, "chunk": chunk,
                               "microbatch": m, "kind": kind, "start_s": start,
                               "end_s": start + 0.01})
    path.write_text(json.dumps(events))


def test_schedule_replays_a_chunked_trace_only_as_its_own_placement(tmp_path, capsys):
    """A zb-v run's chunks sit in a V: replayed as interleaved (a loop) its costs would land
    on the wrong stages, and as zb-h1 (one chunk) the old hint to give --virtual 2 was then
    refused; each now names the kind that replays it."""
    v, loop = tmp_path / "v.json", tmp_path / "loop.json"
    _chunked_trace(v, "v")
    _chunked_trace(loop, "loop")
    base = ["schedule", "--stages", "2", "--microbatches", "4", "--from-trace"]
    fails_in_one_line([*base, str(v), "--kind", "zb-h1"], capsys,
                      "had 2 chunk(s) per stage and zb-h1 runs 1", "--kind zb-v")
    fails_in_one_line([*base, str(v), "--kind", "interleaved", "--virtual", "2"], capsys,
                      "placed its 2 chunks per stage in a V (zb-v)", "--kind zb-v")
    fails_in_one_line([*base, str(loop), "--kind", "zb-v"], capsys, "in a loop (interleaved)",
                      "--kind interleaved --virtual 2")
    assert main([*base, str(v), "--kind", "zb-v"]) == 0
    assert main([*base, str(loop), "--kind", "interleaved", "--virtual", "2"]) == 0
    capsys.readouterr()


def test_schedule_scales_the_stages_of_per_chunk_costs(capsys):
    """--model gives one cost per chunk: --stage-scale multiplies each by its stage's factor
    (it was refused as if no cost had been given per stage)."""
    argv = ["schedule", "--kind", "zb-v", "--stages", "2", "--microbatches", "4", "--model",
            "tiny-llama", "--json"]
    assert main(argv) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main([*argv, "--stage-scale", "1,3"]) == 0
    scaled = json.loads(capsys.readouterr().out)

    def forwards(run: dict, stage: int) -> list[float]:
        return sorted(e["end"] - e["start"] for e in run["events"][stage] if e["kind"] == "F")

    assert forwards(scaled, 0) == pytest.approx(forwards(plain, 0))
    assert forwards(scaled, 1) == pytest.approx([3 * f for f in forwards(plain, 1)])


def test_schedule_splits_a_model_at_the_sequence_length_train_runs(capsys):
    """The runtime's split weighs attention at the run's --seq-len (128 by default): GPT-2
    124M over 2 stages is 9 + 3 blocks there, 8 + 4 at its 1024-token context."""
    from paraxis.spec.model_config import PRESETS
    from paraxis.spec.partition import partition_layers

    costs = {}
    for seq in ("128", "1024"):
        assert main(["schedule", "--stages", "2", "--microbatches", "2", "--model",
                     "gpt2-124m", "--seq-len", seq, "--json"]) == 0
        run = json.loads(capsys.readouterr().out)
        costs[seq] = [next(e["end"] - e["start"] for e in stage if e["kind"] == "F")
                      for stage in run["events"]]
        split = partition_layers(PRESETS["gpt2-124m"], 2, seq_len=int(seq))
        mean = sum(split.costs) / 2
        assert costs[seq] == pytest.approx([c / mean for c in split.costs])
    assert costs["128"][0] > costs["128"][1] and costs["1024"][0] < costs["1024"][1]
    fails_in_one_line(["schedule", "--model", "gpt2-124m", "--seq-len", "4096"], capsys,
                      "4096")


def test_the_text_timeline_of_costs_far_apart_stays_a_few_hundred_cells(capsys):
    assert main(["schedule", "--forward-cost", "0.000001", "--backward-cost", "1000000"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("stage")]
    assert len(rows) == 4 and max(map(len, rows)) < 2000
    assert all("B7" in row for row in rows)

