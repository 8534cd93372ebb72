"""Initial weights: each full (unsharded) parameter a function of its single-device name and
the seed only, so every layout, and every rank of it, starts from one device's values."""

from __future__ import annotations

import hashlib
import math

import torch

from paraxis.spec.model_config import ModelConfig


def parameter_seed(seed: int, name: str) -> int:
    """A stable 63-bit seed for one named parameter (Python's hash() is salted per process)."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


@torch.no_grad()
def init_parameter(name: str, param: torch.Tensor, cfg: ModelConfig, seed: int) -> None:
    """Fill one full (unsharded) parameter, as a function of its name and the seed only."""
    leaf = name.rsplit(".", 1)[-1]
    module = name.rsplit(".", 2)[-2] if "." in name else ""
    if leaf == "bias" or leaf.endswith("_bias"):  # and an MoE's routing bias
        param.zero_()
        return
    if "norm" in module:
        param.fill_(1.0)
        return
    generator = torch.Generator().manual_seed(parameter_seed(seed, name))
    std = 0.02
    if module in ("o", "down"):
        # GPT-2 scales residual-stream output projections by 1/sqrt(2 * layers).
        std = 0.02 / math.sqrt(2 * cfg.n_layers)
    if param.dtype == torch.float32 and param.is_contiguous() and param.device.type == "cpu":
        torch.randn(param.shape, generator=generator, out=param.detach())  # no temporary
        param.mul_(std)
        return
    values = torch.randn(param.shape, generator=generator, dtype=torch.float32) * std
    param.copy_(values.to(param.dtype))


def initial_value(name: str, shape: tuple[int, ...], cfg: ModelConfig,
                  seed: int) -> torch.Tensor:
    """A new full tensor holding parameter `name`'s single-device initial value."""
    full = torch.empty(shape)
    init_parameter(name, full, cfg, seed)
    return full

