"""Bytes per parameter for the model states, read from the precision policy
(`paraxis.spec.precision`): the runtime holds what the planner prices."""

from __future__ import annotations

from dataclasses import dataclass

from paraxis.spec.precision import BF16, POLICIES, PrecisionPolicy


@dataclass(frozen=True)
class Precision:
    """Bytes each parameter costs in parameters, gradients and optimizer states, and bytes
    per element of the activations the step computes in. A policy reduces gradients in
    their own dtype and gathers parameters in theirs, so grad_bytes and param_bytes are also
    the dp collectives' bytes per element (plan/comm.py)."""

    param_bytes: float
    grad_bytes: float
    optimizer_bytes: float
    activation_bytes: float = 2  # bf16/fp16 compute; 4 for fp32

    @property
    def total_bytes(self) -> float:
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes

    @classmethod
    def of(cls, policy: PrecisionPolicy) -> Precision:
        """The planner's view of a runtime policy."""
        return cls(policy.param_bytes, policy.grad_bytes, policy.optimizer_bytes,
                   activation_bytes=policy.compute_bytes)


# ZeRO (Rajbhandari et al. 2020) Sec. 3.1: fp16 params and grads (2+2) plus fp32 master copy,
# momentum and variance (K = 12): the "16 P" rule, paraxis's bf16 policy.
MIXED_ADAM = Precision.of(BF16)
# Plain fp32 Adam: fp32 params and grads, momentum and variance (4+4+8).
FP32_ADAM = Precision.of(POLICIES["fp32"])
# The --precision choices of `paraxis plan`, `paraxis memory` and `paraxis report`: the
# runtime's policies, and "mixed", the planner's older name of bf16.
PRECISIONS = {**{name: Precision.of(policy) for name, policy in POLICIES.items()},
              "mixed": MIXED_ADAM}
