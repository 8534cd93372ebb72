"""Dynamic loss scaling for fp16 compute (Micikevicius et al., "Mixed Precision Training",
ICLR 2018, sec. 3.2).

fp16 gradients of small magnitude underflow to zero; multiplying the loss by S moves them into
range, and the fp32 gradients are divided by S before the update. S halves (and the step is
skipped) when a gradient overflowed, and doubles after `growth_interval` clean steps. The
overflow test is the global gradient norm, which every rank computes identically after its
collectives (the DeepSpeed FP16 optimizer's check), and a flag is reduced over every axis
(`any_rank_overflowed`), so all ranks skip together.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from paraxis.dist.watchdog import WATCH

if TYPE_CHECKING:
    from paraxis.dist.groups import ParallelGroups


class LossScaler:
    def __init__(self, init_scale: float = 2.0**16, growth_interval: int = 2000,
                 min_scale: float = 1.0) -> None:
        self.scale = init_scale
        self.last_scale = init_scale  # the scale the current gradients were made with
        self.growth_interval = growth_interval
        self.min_scale = min_scale
        self._clean_steps = 0

    def update(self, overflow: bool) -> None:
        self.last_scale = self.scale
        if overflow:
            self.scale = max(self.min_scale, self.scale / 2)
            self._clean_steps = 0
            return
        self._clean_steps += 1
        if self._clean_steps % self.growth_interval == 0:
            self.scale *= 2

    def state_dict(self) -> dict[str, float]:
        """What a checkpoint keeps, so a resumed run goes on with the same scale and the same
        count towards its next growth."""
        return {"scale": self.scale, "clean_steps": self._clean_steps}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.scale = self.last_scale = float(state["scale"])
        self._clean_steps = int(state["clean_steps"])


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a policy's dtype name (`paraxis.spec.precision` has names only, so the
    planner imports no torch)."""
    return TORCH_DTYPES[name]


TORCH_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def any_rank_overflowed(finite: bool, groups: ParallelGroups | None,
                        device: torch.device) -> bool:
    """True on every rank when any rank's gradients hold an inf/NaN. The global norm alone
    is not enough: a TP-replicated gradient enters it on its own rank only, so one rank
    could skip while another steps. A max of the flag over tp, dp (x cp) and pp settles it."""
    flag = torch.tensor([0.0 if finite else 1.0], device=device)
    for group in (groups.tp_group, groups.replica_group, groups.pp_group) if groups else ():
        if group is not None:
            with WATCH.waiting("all_reduce", group):
                dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=group)
    return bool(flag.item())
