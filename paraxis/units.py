"""Units, and the default sizes that more than one module reads (no torch import)."""
from __future__ import annotations

GB = 1e9  # decimal, as GPU datasheets and the course count memory (16 x 7e9 bytes = 112 GB)
MIB = 2**20  # binary, as the CUDA driver (nvidia-smi) and PyTorch's bucket sizes count

# The data-parallel gradient bucket: PyTorch DDP's bucket_cap_mb = 25, counted in MiB
# (torch/nn/parallel/distributed.py: "bucket_cap_mb: Single bucket size limit in MiB");
# paraxis's runtime fills buckets of this size; the planner prices their calls and memory.
DEFAULT_BUCKET_MB = 25.0
DEFAULT_BUCKET_BYTES = int(DEFAULT_BUCKET_MB * MIB)

# Memory held back from the model on every GPU: the CUDA context, NCCL workspaces and the
# allocator's slack (a round 2 GB; a CPU profile replaces it with a rank's measured baseline).
DEFAULT_RESERVED_BYTES = 2e9
