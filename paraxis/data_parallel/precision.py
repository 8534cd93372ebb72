"""Dynamic loss scaling for fp16 compute (Micikevicius et al., "Mixed Precision Training",
ICLR 2018, sec. 3.2).

fp16 gradients of small magnitude underflow to zero; multiplying the loss by S moves them into
range, and the fp32 gradients are divided by S before the update. S halves (and the step is
skipped) when a gradient overflowed, and doubles after `growth_interval` clean steps. The
overflow test is the global gradient norm, which every rank computes identically after its
collectives (the DeepSpeed FP16 optimizer's check), so all ranks skip together.
"""

from __future__ import annotations


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
