"""AdamW's hyperparameters besides the learning rate, as one value: the run config's
defaults, and what every engine's optimizer is built from.

The defaults are GPT-3's (Brown et al. 2020, appendix B: beta2 0.95, weight decay 0.1), and
Megatron-LM's and torchtitan's; eps is PyTorch's.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AdamW:
    weight_decay: float = 0.1  # on matrices only (`engine.optimizer.decays`)
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8


DEFAULT_ADAMW = AdamW()
