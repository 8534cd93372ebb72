"""What a runtime steps with: AdamW over a model's tensors (fused where torch allows), the
clipping factor, a step skipped on non-finite gradients without waiting on the host, and the
bytes its states hold."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from torch import nn

from paraxis.model.checkpoint.entries import step_count
from paraxis.spec.optimizer import AdamW
from paraxis.spec.units import runs_within


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        storage = t.untyped_storage()
        if storage.nbytes():
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
    return (t for state in optimizer.state.values() for t in state.values()
            if isinstance(t, torch.Tensor))


GROUP_BYTES = 64 * 2**20  # the most parameter bytes one AdamW group holds


def decays(param: nn.Parameter) -> bool:
    """Weight decay on matrices only, not biases or norms: the GPT-2/nanoGPT convention."""
    return param.dim() >= 2


def make_adamw(params: Iterable[nn.Parameter], hyper: AdamW) -> torch.optim.AdamW:
    """AdamW with decay where `decays` says."""
    params = [p for p in params if p.requires_grad]
    decay = [p for p in params if decays(p)]
    no_decay = [p for p in params if not decays(p)]
    return adamw(decay, no_decay, hyper)


def adamw(decay: list[torch.Tensor], no_decay: list[torch.Tensor], hyper: AdamW
          ) -> torch.optim.AdamW:
    """AdamW over `decay` (with weight decay) and `no_decay` tensors.

    fused=True: one kernel per group reads each element's parameter, gradient and moments
    once and writes them once (torch's fused AdamW, on CUDA and CPU), where the foreach path
    runs about ten multi-tensor ops over whole fp32 tensors: 25M fp32 parameters step in
    31 ms fused against 120 ms foreach on one thread of this project's CPU VM
    (`python -m tools.probes.adamw_kernels`; tests/test_kernels.py keeps the two within fp32
    rounding). Each element's update is computed alone, so a sharded optimizer matches the
    single-device one (tests/test_dp_equivalence.py). Groups hold at most GROUP_BYTES of
    parameters, so a shard's step never works on more than that at once.
    """
    groups = [{"params": chunk, "weight_decay": decay_rate}
              for tensors, decay_rate in ((decay, hyper.weight_decay), (no_decay, 0.0))
              for chunk in runs_within(tensors, lambda t: t.numel() * t.element_size(),
                                       GROUP_BYTES) if chunk]
    # A rank whose shard holds only padding has nothing to step; AdamW needs some group.
    groups = groups or [{"params": [], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=0.0, betas=hyper.betas, eps=hyper.eps,
                             fused=fusable(decay + no_decay))


def fusable(tensors: list[torch.Tensor]) -> bool:
    """Whether torch's fused AdamW takes these tensors: floating point, on CPU or CUDA
    (none at all: a rank with nothing to step)."""
    return all(t.is_floating_point() and t.device.type in ("cpu", "cuda") for t in tensors)


def clip_factor(norm: torch.Tensor, max_norm: float) -> torch.Tensor:
    """What gradients are multiplied by to bring the norm down to `max_norm` (1 when it is
    below): torch.nn.utils.clip_grad_norm_'s formula, on the device."""
    return (max_norm / (norm + 1e-6)).clamp(max=1.0)


def step_unless_nonfinite(optimizer: torch.optim.Optimizer, nonfinite: torch.Tensor | None
                          ) -> None:
    """`optimizer.step()`, skipped where `nonfinite` (a 0-d bool tensor) is true: by the
    fused kernel itself, which then changes neither weights, moments nor step count, so the
    host never waits; an unfused optimizer has to read the flag first."""
    if nonfinite is None:
        optimizer.step()
    elif optimizer.defaults.get("fused"):
        optimizer.found_inf = nonfinite.float()  # read by torch's fused Adam/AdamW
        try:
            optimizer.step()
        finally:
            del optimizer.found_inf
    elif not bool(nonfinite):
        optimizer.step()


def init_adam_state(optimizer: torch.optim.Optimizer) -> None:
    """Allocate AdamW's moments now rather than at the first step, so the memory logged at
    start is the memory training holds, and checkpoints list them from step 0 (the same
    zeros torch would create lazily)."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state[p]
            if not state:
                state["step"] = step_count(0, p.device)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
