"""The report's figures are the planner's: memory bars, pipeline costs, step-time rows."""

import re

import pytest

from paraxis.plan.attribution import part_changes
from paraxis.plan.cost import DEFAULT_OVERLAP, STEP_PARTS, pipeline_time
from paraxis.plan.experts import DEFAULT_IMBALANCE
from paraxis.plan.inputs import PlanInputs
from paraxis.plan.rates import for_precision, overlap_on
from paraxis.show.report import pictures
from paraxis.show.report.pipeline import _what_the_run_used, priced_costs
from paraxis.show.report.plan import Plan, make_plan
from paraxis.show.report.text import duration, plan_section
from paraxis.show.viz.memory import zero_rows
from paraxis.train.run_hardware import choose_hardware

STATES = ("params", "grads", "optimizer")


def plan_of(model: str, layout: str, gpus: int, global_batch: int,
            gpu: str = "h100-sxm-80gb") -> Plan:
    inputs = PlanInputs(model=model, gpus=gpus, gpu=gpu, precision="mixed",
                        global_batch=global_batch, layout=layout)
    return make_plan(choose_hardware(inputs, None, gpus, model))


@pytest.mark.parametrize("model, layout, gpus, batch", [
    ("llama2-7b", "cp=2,dp=2,zero=1", 4, 8),  # states sharded over dp x cp
    ("mixtral-8x7b", "ep=4,dp=4,tp=2,zero=1", 8, 16),  # routed experts over ep
    ("gpt2-1.5b", "pp=4,schedule=zb-v,microbatches=8", 4, 16),  # zb-v's V placement
])
def test_memory_bars_are_the_planners_count(model, layout, gpus, batch, monkeypatch):
    plan = plan_of(model, layout, gpus, batch)
    drawn = {}
    monkeypatch.setattr(pictures, "plot_stage_memory",
                        lambda rows, *args: drawn.setdefault("stages", rows))
    monkeypatch.setattr(pictures, "plot_zero_memory",
                        lambda *args, **kwargs: drawn.setdefault("zero", (args, kwargs)))
    monkeypatch.setattr(pictures, "figure_data_uri", lambda fig: "")
    pictures._memory(plan)
    worst = plan.memory
    busiest = int(worst["stage"])
    bars = drawn["stages"]
    assert len(bars) == plan.layout.pp + 1  # one per stage, then the busiest one's whole
    for state in STATES:
        assert bars[busiest][state] == pytest.approx(worst[state], rel=1e-12), state
        assert bars[-1][state] == worst[state]
    (num_params, ranks, *_), options = drawn["zero"]
    assert ranks == plan.layout.zero_ranks
    at_its_zero = zero_rows(num_params, ranks, plan.inputs.precision_rule(),
                            options["expert_params"], options["ep"])[plan.layout.zero]
    assert at_its_zero == {k: bars[busiest][k] for k in STATES}


def planners_microbatch(plan: Plan) -> tuple[float, float]:
    """The planner's own forward and backward per microbatch on the busiest stage."""
    precision = plan.inputs.precision_rule()
    cluster = for_precision(plan.cluster, precision)
    pipe = pipeline_time(plan.cfg, plan.layout, cluster, plan.seq_len,
                         plan.estimate.micro_batch, precision,
                         overlap_on(cluster, DEFAULT_OVERLAP), DEFAULT_IMBALANCE, {})
    return pipe.forward, pipe.backward


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_pipeline_costs_are_the_planners(recompute):
    plan = plan_of("gpt2-1.5b", f"pp=4,dp=2,microbatches=8,recompute={recompute}", 8, 64,
                   gpu="a100-80gb")
    forward, backward = planners_microbatch(plan)
    costs = priced_costs(plan.estimate, plan.layout)
    assert (costs.forward_s, costs.backward_s) == pytest.approx((forward, backward), rel=1e-9)
    # the rerun forward sits in the backward: more than twice the forward under recompute
    assert (backward > 2.5 * forward) == (recompute == "full")
    row = _what_the_run_used(plan, None, "").split("this plan, priced")[1]
    assert duration(forward) in row and duration(backward) in row


def seconds(text: str) -> float:
    value, unit = text.split()
    return float(value) * {"s": 1, "ms": 1e-3, "µs": 1e-6}[unit]


def test_step_time_rows_add_up_to_the_step():
    # whole experts on sequence shards (SP, etp=1): their gradients' sum over tp is a part
    plan = plan_of("mixtral-8x7b", "tp=2,ep=4,dp=4,sequence_parallel=true,etp=1,zero=1", 8,
                   16)
    e = plan.estimate
    assert e.time["tp_grads"] > 0
    assert sum(e.time[k] for k in STEP_PARTS) == pytest.approx(e.step_time_s, rel=1e-12)
    assert sum(c.before_s for c in part_changes(e, e)) == pytest.approx(e.step_time_s)
    table = plan_section(plan).split("<h3>Step time</h3>")[1]
    rows = dict(re.findall(r"<tr><td>([^<]*)</td><td>([^<]*)</td><td>\d+%</td></tr>", table))
    assert "tp grads" in rows
    step = seconds(rows.pop("step"))
    assert sum(map(seconds, rows.values())) == pytest.approx(step, rel=2e-3)
