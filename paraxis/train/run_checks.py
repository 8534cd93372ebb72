"""Refuse, before anything is allocated, a layout whose model states cannot fit one rank."""

from __future__ import annotations

import os

from paraxis.files.host import available_host_bytes
from paraxis.plan.memory import layout_memory
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import ModelConfig
from paraxis.spec.precision import Precision, get_policy


def check_states_fit(model: ModelConfig, layout: Layout, precision: str,
                     device_memory_bytes: float | None, given: str | None = None) -> None:
    """Refuse, before anything is allocated, a layout whose model states alone (parameters,
    gradients, optimizer states: the planner's count, which the runtime's tensors equal)
    exceed what one rank has: its GPU's memory, or on a CPU (`device_memory_bytes` None)
    this machine's available memory shared by the node's ranks. `given`: the --model text
    (a path where one was given), for the plan command the message suggests."""
    memory = layout_memory(model, layout, 1, 1, Precision.of(get_policy(precision)))
    states = memory["params"] + memory["grads"] + memory["optimizer"]
    if device_memory_bytes is None:
        ranks, available = int(os.environ.get("LOCAL_WORLD_SIZE", 1)), available_host_bytes()
        have = available / ranks
        where = (f"the {have / 1e9:,.1f} GB each of this machine's {ranks} ranks has of its "
                 f"{available / 1e9:,.1f} GB available" if ranks > 1 else
                 f"this machine's {available / 1e9:,.1f} GB available")
    else:
        have = device_memory_bytes
        where = f"its GPU's {have / 1e9:,.1f} GB"
    if states > have:
        raise ParaxisError(
            f"{model.name} at layout {layout} holds {states / 1e9:,.1f} GB of model states per "
            f"rank (parameters, gradients, optimizer; {precision}), more than {where}; shard "
            f"them over more ranks (--zero 3, --tp, --pp{', --ep, --etp' * model.is_moe}): "
            f"`paraxis plan --model {given or model.name} "
            "--gpus N` finds a layout that fits")
