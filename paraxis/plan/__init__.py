"""The planner: memory, compute, communication and bubble cost model plus a layout search.

Pure Python: nothing here imports torch, so `paraxis plan` answers on any laptop.
"""

from paraxis.plan.memory import model_state_bytes
from paraxis.plan.precision import FP32_ADAM, MIXED_ADAM, Precision

__all__ = ["FP32_ADAM", "MIXED_ADAM", "Precision", "model_state_bytes"]
