"""Token ids in one or more arrays (memory-mapped shard files), read as one sequence.

A prepared corpus is many shard files; joining them into one array would need the whole
corpus in memory on every rank. `TokenShards` keeps each shard memory-mapped and finds a
window's shard(s) by binary search over their end offsets, so a read of `n` tokens touches
only those tokens' pages, even when the window crosses a shard boundary.

    tokens = TokenShards([np.memmap("shard-00000.bin", np.uint8, "r"), ...])
    window = tokens.read(start, start + seq_len + 1)   # int64; counted in bytes_read
    tokens[:1024]                                      # a plain slice, not counted

`read` is the loader's path and counts the bytes it asks for (`bytes_read`), so a test can
see that each rank reads only its share; slicing is for checks (the vocabulary scan, the
fingerprint) and tests, and is not counted.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from paraxis.spec.errors import ParaxisError


class TokenShards:
    """One sequence of token ids over `arrays`, in order, never joined for a read."""

    def __init__(self, arrays: Sequence[np.ndarray]) -> None:
        if not arrays:
            raise ParaxisError("no token shards given; give data that holds tokens")
        dtypes = {np.dtype(a.dtype) for a in arrays}
        if len(dtypes) > 1:
            raise ParaxisError(f"token shards mix dtypes {sorted(d.name for d in dtypes)}; "
                               "prepare the source again")
        self.arrays = [a.reshape(-1) for a in arrays]
        self.ends = np.cumsum([len(a) for a in self.arrays])  # end offset of each shard
        self.dtype = dtypes.pop()
        self.bytes_read = 0  # what `read` was asked for, in bytes of the stored dtype
        self._lock = threading.Lock()  # the prefetch thread and evaluation both read

    def __len__(self) -> int:
        return int(self.ends[-1])

    def read(self, start: int, stop: int) -> np.ndarray:
        """Tokens [start, stop) as int64, counted in `bytes_read`."""
        out = self._range(start, stop).astype(np.int64)
        with self._lock:
            self.bytes_read += (stop - start) * self.dtype.itemsize
        return out

    def _range(self, start: int, stop: int) -> np.ndarray:
        if not 0 <= start <= stop <= len(self):
            raise IndexError(f"tokens [{start}, {stop}) outside [0, {len(self)})")
        if start == stop:
            return np.empty(0, self.dtype)
        first = int(np.searchsorted(self.ends, start, side="right"))  # the shard holding start
        parts, at = [], start
        for index in range(first, len(self.arrays)):
            base = int(self.ends[index - 1]) if index else 0
            end = min(stop, int(self.ends[index]))
            parts.append(np.asarray(self.arrays[index][at - base: end - base]))
            at = end
            if at == stop:
                break
        if len(parts) == 1:  # within one shard (the usual case): no copy to join
            return parts[0]
        return np.concatenate(parts)

    def __getitem__(self, key: slice) -> np.ndarray:
        """A slice of the whole sequence in the stored dtype (not counted in bytes_read)."""
        if not isinstance(key, slice):
            raise TypeError("TokenShards takes slices; use read(start, stop) for windows")
        start, stop, step = key.indices(len(self))
        return self._range(start, max(start, stop))[::step]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        """Every token joined into one array: for tests and small data only."""
        whole = self._range(0, len(self))
        return whole if dtype is None else whole.astype(dtype)

    def tobytes(self) -> bytes:
        return np.asarray(self).tobytes()

    def tolist(self) -> list[int]:
        return np.asarray(self).tolist()
