"""The bad-input catalogue across modes: inputs that would write into the working folder, pass
unchecked in one mode of a command while checked in another, or were refused without saying
how to fix them. Same rules as `tests/test_bad_input.py`: one line `paraxis: error: ...` with
a fix, exit code 2, no traceback, and every file in the folder unchanged. Rows marked SUB run
in a subprocess."""

from __future__ import annotations

from pathlib import Path

from tests.test_bad_input import catalogue, run_row

SUB = True
TRAIN = ["train", "--steps", "1", "--quiet", "--seq-len", "32", "--global-batch", "4",
         "--device", "cpu"]
PLAN = ["plan", "--model", "tiny"]
# more ranks than any machine's cores run a verify on (4 a core), so the row holds anywhere
TOO_MANY_RANKS = "4096"

ROWS: list[tuple[str, list[str], str, str, bool]] = [
    # --- an empty --out is the working folder: refused, as `lab --out ""` is
    ("experts-out-empty", ["experts", "--out", ""], "--out is empty", "give a folder", SUB),
    ("context-out-empty", ["context", "--cp", "2", "--out", ""], "--out is empty",
     "give a folder", False),
    ("data-out-empty", ["data", "prepare", "a_folder", "--out", ""], "--out is empty",
     "give a folder, e.g. data/shards", False),
    # --- a block the model does not have, with or without pictures to draw
    ("experts-block-beyond-layers", ["experts", "--block", "99"],
     "--block 99 is not an MoE block of tiny-moe", "choose one of 0, 1, 2, 3", False),
    # --- a verify of more gloo ranks than this machine runs in reasonable time
    ("plan-verify-too-many-ranks", [*PLAN, "--verify", "1", "--gpus", TOO_MANY_RANKS],
     f"--gpus {TOO_MANY_RANKS} is more ranks than --verify trains on this machine",
     "or fewer", SUB),
    # --- --verify with flags it cannot honour on this machine's ranks (ignored before)
    ("plan-verify-network-gbps", [*PLAN, "--verify", "2", "--gpus", "2", "--network-gbps",
                                  "50"], "--network-gbps describes a cluster",
     "leave it out", False),
    ("plan-verify-json", [*PLAN, "--verify", "2", "--gpus", "2", "--json"],
     "--verify prints its measured table", "leave --json out", False),
    ("plan-verify-whole-layout", [*PLAN, "--verify", "2", "--gpus", "2", "--global-batch",
                                  "8", "--layout", "dp=2,microbatches=1"],
     "is one whole layout", "leave out microbatches", SUB),
    ("plan-verify-tp-0", [*PLAN, "--verify", "2", "--gpus", "2", "--tp", "0"],
     "--tp 0 must be at least 1", "leave it out", False),
    # --- CUDA ranks this machine cannot place (the suite sees no GPU): refused before launch
    ("train-cuda-ranks-without-gpu", [*TRAIN[:-1], "cuda", "--nproc", "2"],
     "this machine shows no CUDA GPU", "use --device cpu", SUB),
    # --- flags checked in one mode only, now in every one
    ("train-predicted-step-negative", [*TRAIN, "--predicted-step-s", "-1"],
     "--predicted-step-s -1.0", "must be a positive number", False),
    ("train-predicted-step-nan", [*TRAIN, "--predicted-step-s", "nan"],
     "--predicted-step-s nan", "must be a positive number", False),
    ("train-memory-gb-0-without-auto", [*TRAIN, "--memory-gb", "0"], "--memory-gb 0.0",
     "must be a positive number", False),
    ("plan-verify-steps-without-verify", [*PLAN, "--verify-steps", "5"],
     "--verify-steps needs --verify K", "add --verify K", SUB),
    ("plan-verify-steps-0-without-verify", [*PLAN, "--verify-steps", "0"],
     "--verify-steps 0", "must be at least 2", False),
    ("plan-verify-rounds-0", [*PLAN, "--verify", "1", "--gpus", "2", "--verify-rounds", "0"],
     "--verify-rounds 0", "must be at least 1", False),
    ("plan-nics-per-node-0", [*PLAN, "--gpus", "16", "--nics-per-node", "0"],
     "--nics-per-node 0", "leave it out for one NIC per GPU", False),
    ("report-nics-per-node-0", ["report", "--model", "tiny", "--nics-per-node", "0", "--out",
                                "r.html"], "--nics-per-node 0",
     "leave it out for one NIC per GPU", False),
    ("report-memory-gb-0", ["report", "--model", "tiny", "--memory-gb", "0", "--out",
                            "r.html"], "--memory-gb 0.0", "must be a positive number", False),
    # --- advice that names only the command's own flags
    ("memory-unknown-gpu", ["memory", "--params", "7e9", "--gpu", "foo"], "unknown GPU 'foo'",
     "choose one of a100-40gb", SUB),
    # --- refusals that said what is wrong, now also how to fix it
    ("convert-not-a-manifest", ["checkpoint", "convert", "not_paraxis", "out", "--layout",
                                "dp=1"], "manifest.json is not a paraxis checkpoint manifest",
     "use an earlier checkpoint", False),
    ("report-metrics-not-json", ["report", "--model", "tiny", "--run", "bad_run", "--out",
                                 "r.html"], "bad_run/metrics.jsonl:1 is not a JSON line",
     "give the metrics file `paraxis train --metrics-file` wrote", False),
    ("plan-hardware-a-folder", [*PLAN, "--hardware", "a_folder"],
     "hardware file a_folder is a folder", "give a .json/.toml file", False),
    ("plan-hardware-bad-toml", [*PLAN, "--hardware", "broken.toml"],
     "hardware file broken.toml is not valid TOML", "write one with paraxis calibrate", False),
    # --- etp on a dense model with tp=1
    ("plan-etp-without-tp", [*PLAN, "--layout", "etp=2,tp=1"], "etp=2 must be 1",
     "leave etp out", False),
]


def make_inputs(folder: Path) -> None:
    (folder / "a_folder").mkdir()
    (folder / "broken.toml").write_text("peak_flops = [\n")
    (folder / "bad_run").mkdir()
    (folder / "bad_run" / "metrics.jsonl").write_text("not json\n")
    (folder / "not_paraxis" / "step-00000001").mkdir(parents=True)
    (folder / "not_paraxis" / "step-00000001" / "manifest.json").write_text("[]\n")


inputs, test_bad_input_is_one_line_with_a_hint = catalogue(ROWS, make_inputs, "bad_inputs3",
                                                           exit_code=2)


def test_memory_advises_only_its_own_flags(inputs):
    # `paraxis memory` has no --hardware: the advice must not send the user to one
    code, stderr = run_row(["memory", "--params", "7e9", "--gpu", "foo"], inputs, False)
    assert code == 2 and "--hardware" not in stderr, stderr
