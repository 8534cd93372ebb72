"""Megatron-style tensor parallelism: sharded layers, vocab-parallel loss, sequence parallelism.

`apply_tensor_parallel(model, groups, sequence_parallel)` splits a plain model (or a pipeline
stage of it) in place from a declarative plan (`apply.PLAN`); `comm` holds the autograd
communication operators, `counter` counts what they send.
"""

from paraxis.parallel.tensor.apply import PLAN, apply_tensor_parallel, full_state, gather_full
from paraxis.parallel.tensor.counter import CommCounter

__all__ = ["PLAN", "CommCounter", "apply_tensor_parallel", "full_state", "gather_full"]
