"""Megatron-style tensor parallelism: sharded layers, vocab-parallel loss, sequence parallelism.

`apply_tensor_parallel(model, groups, sequence_parallel)` splits a plain model (or a pipeline
stage of it) in place from a declarative plan (`apply.PLAN`); `comm` holds the autograd
communication operators, `counter` counts what they send.
"""

from paraxis.tensor_parallel.apply import PLAN, apply_tensor_parallel, full_state, gather_full
from paraxis.tensor_parallel.counter import CommCounter
from paraxis.tensor_parallel.engine import TensorParallelEngine

__all__ = ["PLAN", "CommCounter", "TensorParallelEngine", "apply_tensor_parallel",
           "full_state", "gather_full"]
