"""The single-tensor all-gather and reduce-scatter under the names of the running torch.

torch 2.13 calls them `all_gather_single` and `reduce_scatter_single` and deprecates the
older `all_gather_into_tensor` and `reduce_scatter_tensor`; torch 2.12 and earlier have only
the older names. Every call site takes them from here, so paraxis runs on both.
"""

from __future__ import annotations

import torch.distributed as dist

all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = (getattr(dist, "reduce_scatter_single", None)
                         or dist.reduce_scatter_tensor)
