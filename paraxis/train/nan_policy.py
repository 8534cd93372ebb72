"""Numerical faults: a step whose loss or gradient is not finite is never applied.

The check needs no communication of its own: the loss every rank returns is already reduced
over the layout (dp all-reduce, pipeline broadcast, vocab-parallel sums) and the gradient norm
is the global one (`runtime.params.global_norm_squared`), and NaN/inf survive sums. So every
rank sees the same verdict on the same step and takes the same branch: all skip, or all stop.

`--on-nan stop` (default) ends the run naming the step; `--on-nan skip` drops the step's
gradients, leaves weights and optimizer state as they were, and goes on with the next batch.
fp16 loss-scaling overflows are not faults: the engine already skips those steps and lowers
the scale (`DataParallelEngine.skipped_overflow`).
"""

from __future__ import annotations

import math

from paraxis.spec.errors import RunFailed

POLICIES = ("stop", "skip")


class NumericalFault(RunFailed):
    """A NaN/inf loss or gradient under --on-nan stop."""

    same_on_every_rank = True


def nonfinite(loss: float, grad_norm: float, overflow_handled: bool = False) -> str | None:
    """What is not finite on this step ("loss is nan", "gradient norm is inf"), or None."""
    if not math.isfinite(loss):
        return f"loss is {loss}"
    if not math.isfinite(grad_norm) and not overflow_handled:
        return f"gradient norm is {grad_norm}"
    return None


def stop_message(step: int, fault: str) -> str:
    return (f"step {step}: {fault}; stopped before it changed the weights (--on-nan stop). "
            "Lower --lr, raise --warmup, set --grad-clip, or pass --on-nan skip to drop such "
            "steps")


def skip_message(step: int, fault: str) -> str:
    return (f"paraxis: warning: step {step}: {fault}; step skipped (--on-nan skip), weights "
            "unchanged")


def overflow_message(step: int, scale: float) -> str:
    """fp16's loss scaler skipped the step (not a fault: it lowers the scale and goes on)."""
    return (f"paraxis: note: step {step}: fp16 gradients overflowed; step skipped, loss scale "
            f"lowered to {scale:g}")
