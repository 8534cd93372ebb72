"""The planner: memory, compute, communication and bubble cost model plus a layout search.

Pure Python: nothing here imports torch, so `paraxis plan` answers on any laptop. The public
API other code calls is listed in docs/planner.md.
"""

from paraxis.plan.comm import tp_collectives_per_layer
from paraxis.plan.compute import iteration_flops, model_flops_per_token
from paraxis.plan.memory import layout_memory, model_state_bytes
from paraxis.spec.precision import FP32_ADAM, MIXED_ADAM, Precision

__all__ = ["FP32_ADAM", "MIXED_ADAM", "Precision", "iteration_flops", "layout_memory",
           "model_flops_per_token", "model_state_bytes", "tp_collectives_per_layer"]
