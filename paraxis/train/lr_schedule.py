"""The learning rate of each step: linear warmup, then cosine decay over the run's --steps."""

from __future__ import annotations

import math

from paraxis.train.config import RunConfig


def learning_rate(step: int, cfg: RunConfig) -> float:
    """Linear warmup, then cosine decay to min_lr_ratio * lr (GPT-3 paper, appendix B)."""
    opt, steps = cfg.optimizer, cfg.train.steps
    if step < opt.warmup_steps:
        return opt.lr * (step + 1) / opt.warmup_steps
    span = max(1, steps - opt.warmup_steps)
    progress = min(1.0, (step - opt.warmup_steps) / span)
    floor = opt.lr * opt.min_lr_ratio
    return floor + 0.5 * (opt.lr - floor) * (1 + math.cos(math.pi * progress))
