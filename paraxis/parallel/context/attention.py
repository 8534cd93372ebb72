"""The one entry the model calls: context-parallel causal attention, by variant name.

    out = context_parallel_attention(q, k, v, cp_group, variant="ring")

`q`, `k`, `v` are this rank's local sequence (`chunks.local_part`), after RoPE at the
tokens' global positions (`chunks.positions`); K/V at kv-head width. The variants compute
the same pairs and give the same result (to rounding): "ring" passes K/V around the group
step by step behind the compute (`ring.py`), "all_gather" gathers them once per layer
(`all_gather.py`), "all_to_all" trades the sequence split for a head split around the
kernel (DeepSpeed-Ulysses, `all_to_all.py`); which is cheapest depends on the heads, the
kv_heads and the network (the planner's call). Two levels (`hierarchical.py`, the layout's
`cp_a2a`): an all-to-all inside small groups, the ring or the all-gather across them.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from paraxis.parallel.context.all_gather import all_gather_attention
from paraxis.parallel.context.all_to_all import all_to_all_attention
from paraxis.parallel.context.hierarchical import ACROSS, CpLevels, hierarchical_attention
from paraxis.parallel.context.kernel import ChunkDocuments
from paraxis.parallel.context.ring import ring_attention
from paraxis.spec.cp_balance import VARIANTS
from paraxis.spec.errors import ParaxisError

_IMPLEMENTATIONS = {"ring": ring_attention, "all_gather": all_gather_attention,
                    "all_to_all": all_to_all_attention}
assert tuple(_IMPLEMENTATIONS) == VARIANTS


def context_parallel_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               group: dist.ProcessGroup | CpLevels | None,
                               variant: str = "ring", scale: float | None = None,
                               documents: ChunkDocuments | None = None) -> torch.Tensor:
    """Causal attention of this rank's queries over the sequence split across `group`;
    `documents` (packing, `kernel.ChunkDocuments`) keep attention within each document.
    `group` as `CpLevels`: two-level cp (`hierarchical.py`), `variant` across the levels."""
    if variant not in _IMPLEMENTATIONS:
        raise ParaxisError(f"unknown context-parallel attention {variant!r}; use one of "
                           f"{', '.join(VARIANTS)}")
    if isinstance(group, CpLevels):
        if variant not in ACROSS:
            raise ParaxisError(f"two-level cp runs {' or '.join(ACROSS)} across its "
                               f"all-to-all groups, not {variant}; set cp_attention to one "
                               "of those or drop cp_a2a")
        return hierarchical_attention(q, k, v, group, variant, scale, documents)
    return _IMPLEMENTATIONS[variant](q, k, v, group, scale, documents)
