"""Per-GPU memory of the model states (params, grads, optimizer) under ZeRO stages 0-3."""

from __future__ import annotations

from paraxis.errors import ParaxisError
from paraxis.plan.precision import FP32_ADAM, MIXED_ADAM, Precision

__all__ = ["FP32_ADAM", "MIXED_ADAM", "Precision", "model_state_bytes", "zero_table"]


def model_state_bytes(num_params: int, dp: int, zero: int,
                      precision: Precision = MIXED_ADAM) -> dict[str, float]:
    """Bytes per GPU of `num_params` parameters replicated over `dp` ranks, sharded by ZeRO.

    Returns {"params", "grads", "optimizer"}. ZeRO-1 shards the optimizer states, ZeRO-2 also
    the gradients, ZeRO-3 also the parameters.
    """
    if num_params < 0:
        raise ParaxisError(f"parameter count {num_params} is negative; give a count >= 0")
    if dp < 1:
        raise ParaxisError(f"dp={dp} must be at least 1")
    if zero not in (0, 1, 2, 3):
        raise ParaxisError(f"zero={zero!r} must be one of 0, 1, 2, 3")
    # ZeRO (Rajbhandari et al. 2020) Sec. 5.1-5.3, Fig. 1: P_os, P_os+g, P_os+g+p divide by N_d.
    optimizer_share = 1 / dp if zero >= 1 else 1.0
    grad_share = 1 / dp if zero >= 2 else 1.0
    param_share = 1 / dp if zero >= 3 else 1.0
    return {
        "params": num_params * precision.param_bytes * param_share,
        "grads": num_params * precision.grad_bytes * grad_share,
        "optimizer": num_params * precision.optimizer_bytes * optimizer_share,
    }


def zero_table(num_params: int, gpus: int,
               precision: Precision = MIXED_ADAM) -> list[dict[str, float]]:
    """The seeds' ZeRO calculator: one row per stage with the per-GPU bytes of each state."""
    rows = []
    for zero in range(4):
        states = model_state_bytes(num_params, gpus, zero, precision)
        rows.append({"zero": zero, **states, "total": sum(states.values())})
    return rows
