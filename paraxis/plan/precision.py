"""Bytes per parameter for the model states: the one place the 2+2+12 rule lives."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Precision:
    """Bytes each parameter costs in parameters, gradients and optimizer states, and bytes
    per element of the activations the step computes in."""

    param_bytes: float
    grad_bytes: float
    optimizer_bytes: float
    activation_bytes: float = 2  # bf16/fp16 compute; 4 for fp32

    @property
    def total_bytes(self) -> float:
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes


# ZeRO (Rajbhandari et al. 2020) Sec. 3.1: fp16 params and grads (2+2) plus fp32 master copy,
# momentum and variance (K = 12): the "16 P" rule.
MIXED_ADAM = Precision(2, 2, 12)
# Plain fp32 Adam: fp32 params and grads, momentum and variance (4+4+8).
FP32_ADAM = Precision(4, 4, 8, activation_bytes=4)
# The --precision choices of `paraxis plan`, `paraxis memory` and `paraxis report`.
PRECISIONS = {"mixed": MIXED_ADAM, "fp32": FP32_ADAM}
