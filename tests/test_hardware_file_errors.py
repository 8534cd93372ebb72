"""A malformed `--hardware FILE` (a calibrated profile edited by hand, cut short, or not a
profile at all) is one line naming the file, the key and the shape expected, with a fix, and
exit code 2: never a traceback from deep in the cost model (`plan/hardware_values.py`,
`check_structure`). Valid profiles, the documented ones included, plan as before."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from paraxis.cli import main
from paraxis.plan import comm, hardware_values
from paraxis.plan.hardware import load_hardware_file

ROOT = Path(__file__).resolve().parents[1]

DOCS = Path(__file__).resolve().parents[1] / "docs"
PLAN = ["plan", "--model", "tiny", "--gpus", "2"]
FIX = "re-run `paraxis calibrate --out"


def fit(alpha: object = 1e-4, bandwidth: object = 5e8) -> dict[str, object]:
    """One calibrated collective fit, as `paraxis calibrate` writes it."""
    return {"alpha_s": alpha, "bandwidth_Bps": bandwidth, "max_rel_error": 0.1}


def all_reduce(by_ranks: object) -> dict[str, object]:
    return {"collectives": {"all_reduce": by_ranks}}


def cpu(**tables: object) -> dict[str, object]:
    """A CPU profile's cluster section holding `tables` (the planner reads them on CPUs)."""
    return {"cluster": {"cores_per_node": 2, **tables}}


# (id, the file's contents, what the one line must name)
BAD: list[tuple[str, object, list[str]]] = [
    # the reviewer's cases
    ("top-level-list", [], ["holds a list, not an object of keys"]),
    ("collectives-a-number", {"collectives": 5},
     ["collectives is a number (5)", "expected an object"]),
    ("collectives-unknown-op", {"collectives": {"x": 1}},
     ["collectives.x is not a collective", "all_reduce"]),
    ("fit-without-alpha", all_reduce({"8": {"2": {}}}),
     ["collectives.all_reduce.8.2 has no alpha_s", '"bandwidth_Bps": bytes/s > 0']),
    ("alpha-a-string", all_reduce({"8": {"2": fit(alpha="x")}}),
     ["collectives.all_reduce.8.2.alpha_s = 'x' must be a number >= 0"]),
    ("ranks-not-a-count", all_reduce({"x": {"2": fit()}}),
     ["collectives.all_reduce.x is not a count of ranks on the node", "whole number >= 1"]),
    ("zero-bandwidth", all_reduce({"8": {"2": fit(bandwidth=0)}}),
     ["collectives.all_reduce.8.2.bandwidth_Bps = 0 must be a number > 0"]),
    # more of the same kind
    ("top-level-string", "a100-80gb", ["holds a string, not an object of keys"]),
    ("top-level-null", None, ["holds null"]),
    ("group-size-zero", all_reduce({"8": {"0": fit()}}),
     ["collectives.all_reduce.8.0 is not a count of ranks in the group"]),
    ("negative-alpha", {"cluster": all_reduce({"8": {"2": fit(alpha=-1e-4)}})},
     ["cluster.collectives.all_reduce.8.2.alpha_s = -0.0001 must be a number >= 0"]),
    ("quoted-bandwidth", all_reduce({"8": {"2": fit(bandwidth="5e8")}}),
     ["bandwidth_Bps = '5e8' must be a number > 0"]),
    ("boolean-alpha", all_reduce({"8": {"2": fit(alpha=True)}}),
     ["alpha_s = True must be a number"]),
    ("ranks-a-list", all_reduce({"8": [fit()]}),
     ["collectives.all_reduce.8 is a list", "expected an object"]),
    ("fit-a-number", all_reduce({"8": {"2": 3}}),
     ["collectives.all_reduce.8.2 is a number (3)", "alpha_s"]),
    ("sync-wait-a-string", cpu(sync_wait_s={"8": {"2": "x"}}),
     ["cluster.sync_wait_s.8.2 = 'x' must be seconds >= 0"]),
    ("negative-scalar-call", cpu(scalar_call_s={"8": {"8": -1.0}}),
     ["cluster.scalar_call_s.8.8 = -1.0 must be seconds >= 0"]),
    ("scalar-calls-flat", cpu(scalar_call_s={"8": 2e-3}),
     ["cluster.scalar_call_s.8 is a number", "expected an object"]),
    ("curve-a-number", cpu(sync_wait_curve_s={"8": {"2": 5}}),
     ["cluster.sync_wait_curve_s.8.2 is a number (5)", "[segment_s, wait_s] pairs"]),
    ("curve-point-of-three", cpu(sync_wait_curve_s={"8": {"2": [[1e-3, 2e-3, 3e-3]]}}),
     ["cluster.sync_wait_curve_s.8.2[0] = [0.001, 0.002, 0.003] is not a pair"]),
    ("calibration-a-number", {"cores_per_node": 2, "calibration": 5},
     ["calibration is a number (5)"]),
]


def plan_with(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main([*PLAN, "--hardware", str(path)])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("content,names", [row[1:] for row in BAD], ids=[row[0] for row in BAD])
def test_a_malformed_profile_is_one_line(tmp_path, capsys, content, names) -> None:
    path = tmp_path / "hw.json"
    path.write_text(json.dumps(content))
    before = path.read_bytes()
    code, err = plan_with(path, capsys)
    lines = err.strip().splitlines()
    assert code == 2, err
    assert "Traceback" not in err
    assert len(lines) == 1 and lines[0].startswith(f"paraxis: error: hardware file {path}"), err
    assert FIX in lines[0], lines[0]
    for name in names:
        assert name in lines[0], lines[0]
    assert path.read_bytes() == before, "a refused profile was changed on disk"


def test_a_malformed_toml_profile_names_the_table(tmp_path, capsys) -> None:
    path = tmp_path / "hw.toml"
    path.write_text('[cluster.collectives.all_reduce."8"."2"]\nalpha_s = "x"\n'
                    "bandwidth_Bps = 5e8\n")
    code, err = plan_with(path, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "cluster.collectives.all_reduce.8.2.alpha_s = 'x'" in err and FIX in err


@pytest.mark.parametrize("profile", sorted(DOCS.rglob("hardware-profile.json")),
                         ids=lambda p: str(p.relative_to(DOCS)))
def test_the_calibrated_profiles_in_docs_load(profile) -> None:
    flat = load_hardware_file(profile)
    assert flat["collectives"] and "calibration" not in flat


def test_a_valid_profile_still_plans(capsys) -> None:
    code, err = plan_with(DOCS / "hardware-profile.json", capsys)
    assert code == 0, err


def test_empty_and_partial_tables_still_plan(tmp_path, capsys) -> None:
    """What older or interrupted calibrations leave (tests/test_calibrate.py writes such
    profiles): tables with nothing measured, a curve of no points, keys the planner skips."""
    path = tmp_path / "hw.json"
    path.write_text(json.dumps({
        "schema": "paraxis.hardware-profile/1",
        "gpu": {"name": "cpu-core", "peak_flops": 1e11, "memory_bytes": 16e9,
                "hbm_bandwidth_Bps": 1e10, "nvlink_bandwidth_Bps": 4e8},
        "cluster": {"gpus_per_node": 2, "cores_per_node": 2, "sync_wait_s": {"8": {}},
                    "collectives": {"all_reduce": {"8": {}},
                                    "all_gather": {"2": {"2": fit()}}},
                    "sync_wait_curve_s": {"2": {"2": []}},
                    "scalar_call_s": {"2": {"2": 0.0}}},
        "calibration": {"device": {"type": "cpu"}, "anything": [1, 2]},
    }))
    code, err = plan_with(path, capsys)
    assert code == 0, err


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d["gpu"].pop("memory_bytes"), "a calibration profile without gpu.memory_bytes"),
    (lambda d: d["gpu"].pop("peak_flops"), "a calibration profile without gpu.peak_flops"),
    (lambda d: d.pop("cluster"), "a calibration profile without cluster.gpus_per_node"),
    (lambda d: d.update(schema="paraxis.hardware-profile/2"), "not 'paraxis.hardware-profile/1'"),
    (lambda d: d["gpu"].update(hbm_bandwidth_Bps=1e-300), "is below 1e\\+06 B/s"),
    (lambda d: d["gpu"].update(peak_flops=10**400), "peak_flops = .* must be a number"),
    (lambda d: d["gpu"].update(bf16="false"), "bf16 = 'false' must be true or false"),
])
def test_a_profile_that_would_be_priced_as_another_machine_is_refused(tmp_path, capsys, edit,
                                                                     message) -> None:
    """A calibration profile missing a key calibrate always writes would be completed from
    the preset beneath (an A100's memory and FLOP/s for a CPU rank); another version's
    profile, a rate no machine has, a number past a float and a quoted boolean are refused."""
    profile = json.loads((ROOT / "docs" / "hardware-profile.json").read_text())
    edit(profile)
    path = tmp_path / "hw.json"
    path.write_text(json.dumps(profile))
    code, err = plan_with(path, capsys)
    assert code == 2 and re.search(message, err) and err.count("\n") == 1, err


def test_the_ops_a_profile_may_fit_are_the_planners() -> None:
    assert hardware_values.COLLECTIVES == comm.COLLECTIVES


def test_a_bad_value_is_named_before_the_flags_work_on_it(tmp_path, capsys) -> None:
    """A CPU profile's gpus_per_node = 0: its memory is shared over that count first, and the
    line named memory_bytes = 0.0, not the file's own zero."""
    profile = json.loads((DOCS / "hardware-profile.json").read_text())
    profile["cluster"]["gpus_per_node"] = 0
    path = tmp_path / "hw.json"
    path.write_text(json.dumps(profile))
    code, err = plan_with(path, capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert f"hardware file {path}: hardware gpus_per_node = 0 must be above 0" in err


@pytest.mark.parametrize("flags", [["--nvlink-gbps", "1000"], ["--gpu", "h100-sxm-80gb"],
                                   ["--gpus-per-node", "1"]])
def test_flags_a_cpu_profile_leaves_nothing_to_are_refused(capsys, flags) -> None:
    """A CPU profile's ranks share one machine whose rates and calls it measured: a link
    speed, a GPU or nodes of fewer ranks would be ignored or price a network that is not
    there."""
    profile = str(ROOT / "docs" / "hardware-profile.json")
    assert main(["plan", "--model", "tiny", "--gpus", "2", "--hardware", profile, *flags]) == 2
    error = capsys.readouterr().err
    assert f"{flags[0]} with the CPU profile" in error and error.count("\n") == 1


def test_a_reserve_of_all_the_memory_is_one_line(tmp_path, capsys) -> None:
    """A reserve at or above the GPU's memory leaves nothing: said as that, not as every
    layout needing a larger GPU."""
    path = tmp_path / "hw.toml"
    path.write_text("[gpu]\nreserved_bytes = 1e12\n")
    code, err = plan_with(path, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "reserved_bytes = 1e+12 holds back all of the GPU's memory_bytes" in err, err
