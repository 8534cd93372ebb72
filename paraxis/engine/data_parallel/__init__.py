"""Data parallelism: bucketed, overlapped gradient all-reduce and ZeRO stages 1-3.

- `flat.py`: flat padded parameter units and the dp collectives on them,
- `buckets.py`: gradient hooks that launch bucket reductions during backward,
- `zero.py`: the sharded optimizer (ZeRO-1/2/3) and per-block parameter gathering (ZeRO-3),
- `loss_scale.py`: fp16 loss scaling, an overflow agreed over every axis, policy dtype names
  to torch dtypes,
- `masters.py`: fp32 master weights of 16-bit parameters (the precision policy's),
- `engine.py`: `DataParallelEngine`, the Engine contract on a dp group (dp = 1: a group of one).
"""

from paraxis.engine.data_parallel.engine import DataParallelEngine

__all__ = ["DataParallelEngine"]
