"""Small faults of `paraxis plan`, one test each."""

import json

import pytest

from paraxis.cli import main
from paraxis.plan.cost import evaluate
from paraxis.plan.explain import explain
from paraxis.plan.hardware import build_cluster
from paraxis.plan.search import Constraints, search
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import PRESETS

PLAN_70B = ("plan", "--model", "llama2-70b", "--gpus", "512", "--global-batch", "1024",
            "--seq-len", "4096", "--json")


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_partial_interleaved_layout_leaves_the_microbatches_to_the_search(capsys) -> None:
    code, out, _ = run_cli(capsys, *PLAN_70B, "--layout", "dp=32,tp=8,pp=2,schedule=interleaved")
    doc = json.loads(out)
    assert code == 0 and doc["mode"] == "search" and doc["layouts"]
    for estimate in doc["layouts"]:
        layout = estimate["layout"]
        assert (layout["dp"], layout["tp"], layout["pp"]) == (32, 8, 2)
        assert layout["schedule"] == "interleaved" and layout["microbatches"] % 2 == 0


def test_a_given_interleaving_depth_is_kept(capsys) -> None:
    code, out, _ = run_cli(capsys, *PLAN_70B, "--layout", "dp=32,tp=8,pp=2,virtual_stages=5")
    doc = json.loads(out)
    assert code == 0 and {e["layout"]["virtual_stages"] for e in doc["layouts"]} == {5}


def test_fractional_layers_per_virtual_stage_are_refused(capsys) -> None:
    # 80 layers over pp = 2 stages of v = 3 chunks: 13.3 layers per chunk
    code, _, err = run_cli(capsys, *PLAN_70B, "--layout",
                           "dp=32,tp=8,pp=2,schedule=interleaved,virtual_stages=3")
    assert code == 2 and "do not split into pp*virtual_stages = 6 equal chunks" in err
    code, _, err = run_cli(capsys, *PLAN_70B, "--layout", "dp=32,tp=8,pp=2,microbatches=16,"
                           "schedule=interleaved,virtual_stages=3")
    assert code == 2 and "equal chunks" in err and err.count("\n") == 1
    # the search never picks such a depth either: 80 layers, pp = 8, v = 4 is 2.5 per chunk
    result = search(PRESETS["llama2-70b"], build_cluster("a100-80gb", 512, 8), 4096, 1024,
                    Constraints(tp=8, pp=8, dp=8, zero=1, recompute=("none",)))
    assert result.ranked and all(80 % (e.layout.pp * e.layout.virtual_stages) == 0
                                 for e in result.ranked)


def test_a_layout_that_does_not_fit_is_not_said_to_fit() -> None:
    cfg, cluster = PRESETS["llama2-70b"], build_cluster("a100-80gb", 16, 8)
    best = evaluate(cfg, Layout(dp=16, zero=3), cluster, 4096, 64)
    assert not best.fits and best.memory["total"] > 290e9
    text = " ".join(explain(cfg, cluster, best))
    assert "fits without splitting" not in text
    # 463.8 GB: the ZeRO-3 buffers are the runtime's (plan.memory.zero3_buffer_bytes), each
    # layer's activations what its block keeps (tests/test_plan_activations.py), the
    # loss's workspace too (paraxis.spec.kernels)
    assert "this layout does not fit: it needs 463.8 GB per GPU > 86 GB" in text


def test_the_memory_reason_names_the_microbatch_it_is_for() -> None:
    cfg, cluster = PRESETS["llama2-70b"], build_cluster("a100-80gb", 256, 8)
    # ZeRO-3 over all 256 ranks (sharded within a node, the states alone would not fit)
    result = search(cfg, cluster, 4096, 1024, Constraints(tp=1, pp=1, zero=3, dp_shard=0,
                                                          recompute=("none",)))
    rejected = result.too_big[0]
    assert rejected.reason.startswith("needs ") and (
        f"GB of it activations of {rejected.estimate.micro_batch}-sequence microbatches of "
        "4096 tokens (recompute=none)") in rejected.reason


@pytest.mark.parametrize("constraints,message", [
    (Constraints(tp=4, max_tp=2), "tp=4 is above --max-tp 2; drop one of them"),
    (Constraints(tp=3), "tp=3 does not divide the 16 GPUs; choose tp among 1, 2, 4, 8, 16"),
    (Constraints(pp=100), "pp=100 does not divide the 16 GPUs"),
    (Constraints(tp=4, pp=4, dp=4), "tp=4 x pp=4 x dp=4 = 64 does not divide the 16 GPUs"),
    (Constraints(tp=16, tp_within_node=True),
     "tp=16 spans more than a node's 8 GPUs, which --tp-within-node forbids"),
    (Constraints(pp=4, max_pp=1), "pp=4 is above the 1 stages allowed"),
])
def test_constraints_that_leave_nothing_say_why(constraints: Constraints, message: str) -> None:
    with pytest.raises(ParaxisError) as error:
        search(PRESETS["llama2-7b"], build_cluster("a100-80gb", 16, 8), 4096, 64, constraints)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_link_speeds_are_one_direction_and_before_efficiency() -> None:
    cfg, cluster = PRESETS["llama2-70b"], build_cluster("a100-80gb", 16, 8)
    best = evaluate(cfg, Layout(dp=2, tp=8, microbatches=8, sequence_parallel=True,
                                recompute="full"), cluster, 4096, 64)
    text = " ".join(explain(cfg, cluster, best))
    # A100 NVLink: 600 GB/s both ways = 300 each way, 240 achieved at link_efficiency 0.8
    assert "at 300 GB/s per GPU each way (240 GB/s achieved at link_efficiency 0.8)" in text


def test_a_published_layout_can_be_stated_by_micro_batch_size(capsys) -> None:
    code, out, _ = run_cli(capsys, *PLAN_70B, "--layout", "dp=32,tp=8,pp=2,micro_batch=2")
    doc = json.loads(out)
    (estimate,) = doc["layouts"]
    assert code == (0 if estimate["fits"] else 1) and doc["mode"] == "evaluate"
    assert estimate["micro_batch"] == 2 and estimate["layout"]["microbatches"] == 16
    # without dp the size constrains the search
    code, out, _ = run_cli(capsys, *PLAN_70B, "--layout", "tp=8,mbs=4")
    assert code == 0 and {e["micro_batch"] for e in json.loads(out)["layouts"]} == {4}
    code, _, err = run_cli(capsys, *PLAN_70B, "--layout", "dp=32,tp=8,pp=2,micro_batch=3")
    assert code == 2 and "does not split into microbatches of 3" in err
