"""Which gradients a custom autograd function's backward must compute in this pass.

A split backward (engine/pipeline_parallel/split_backward.py: zero-bubble schedules) asks
autograd for the input gradients alone (B), then for the weights' alone (W), so a function
whose backward computes both would do both twice. `needs_input_grad` is fixed at forward
time and cannot tell; the engine can: it knows whether it will run the node a gradient goes
to in the pass under way. Compiled (traced ahead of any pass) every gradient is computed:
compiled blocks do not run under split schedules (`spec.schedules.check_compile`).
"""

from __future__ import annotations

import torch
from torch.autograd.function import FunctionCtx


def wanted(ctx: FunctionCtx, index: int) -> bool:
    """Whether this backward pass needs input `index`'s gradient."""
    if not ctx.needs_input_grad[index]:
        return False
    if torch.compiler.is_compiling():
        return True
    node = ctx.next_functions[index][0]
    if node is None:
        return False
    try:
        return torch._C._will_engine_execute_node(node)
    except RuntimeError:  # a leaf's node under torch.autograd.grad: the engine cannot say
        return True
