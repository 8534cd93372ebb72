"""The plan a report shows: the given layout priced, or the planner's pick, on the hardware
the report prices (every section reads it)."""

from __future__ import annotations

from dataclasses import dataclass

from paraxis.plan.cost import Estimate, evaluate
from paraxis.plan.hardware import Cluster
from paraxis.plan.inputs import PlanInputs
from paraxis.plan.rates import for_precision
from paraxis.plan.search import SearchResult, search
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import ModelConfig
from paraxis.train.run_hardware import Hardware


@dataclass
class Plan:
    inputs: PlanInputs
    hardware: Hardware
    cfg: ModelConfig
    cluster: Cluster
    seq_len: int
    layout: Layout
    estimate: Estimate
    search: SearchResult | None  # None when the search found nothing that fits
    chosen_by: str  # "planner", "user", or "auto" (the run's --layout auto picked it)

    @property
    def memory(self) -> dict[str, float]:
        """The planner's memory of the busiest stage, per device (`device_memory`)."""
        return self.device_memory(self.estimate)

    def device_memory(self, estimate: Estimate) -> dict[str, float]:
        """An estimate's memory per device; on a CPU its reserve is a rank's process baseline
        (interpreter, PyTorch, gloo), as `paraxis calibrate` measured it."""
        return dict(estimate.memory)


def make_plan(hardware: Hardware) -> Plan:
    """The plan for `hardware.inputs`: the given layout priced, else the planner's pick."""
    inputs = hardware.inputs
    cfg = inputs.model_config()
    precision = inputs.precision_rule()
    cluster = for_precision(inputs.cluster(), precision)  # the peak its MFU is counted on
    seq_len = inputs.sequence_length(cfg)
    try:
        result: SearchResult | None = search(cfg, cluster, seq_len, inputs.global_batch,
                                             precision=precision)
    except ParaxisError:
        result = None  # no layout satisfies the rules; a user layout may still be given
    if inputs.layout is not None:
        layout, chosen_by = Layout.parse(inputs.layout), "user"
    elif result and result.ranked:
        layout, chosen_by = result.ranked[0].layout, "planner"
    else:
        reason = "" if result is None else \
            f" ({len(result.too_big)} layouts priced, none fits in memory)"
        raise ParaxisError(f"the planner found no layout for {cfg.name} on "
                           f"{hardware.ranks(cluster.world_size)}{reason}; add GPUs or give "
                           "--layout")
    layout.validate(cluster.world_size, cfg, inputs.global_batch, seq_len)
    estimate = evaluate(cfg, layout, cluster, seq_len, inputs.global_batch, precision)
    return Plan(inputs, hardware, cfg, cluster, seq_len, layout, estimate, result, chosen_by)
