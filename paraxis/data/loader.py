"""The loader: each rank reads only its share of each step's batch, ahead of the step.

    share = Share.of(layout, rank)                # dp rows and, under cp, chunks of each row
    x, y = read_share(blend, step, 16, 128, seed, share)        # (16/dp, 128/cp) int64 each
    with Loader(lambda s: read_share(blend, s, ...), range(first, last)) as loader:
        for step in range(first, last):
            (x, y), wait_s = loader.get(step)     # prepared by a thread while step-1 ran

Every rank computes the positions of the whole global batch (integers, from (seed, step):
`Blend.positions`), so the samples are the same whatever the layout and a resumed run
continues at the exact sample; it then reads from the memory-mapped tokens only its own
rows, and under context parallelism only its two chunks of each row (`context_parallel.
balance.rank_chunks`: chunk i and 2cp-1-i), the same tokens `context_parallel.chunks.
local_part` would cut from the whole rows.

Prefetch is a thread, not worker processes: a read is a few memory-mapped slices, short next
to a step, and the step's torch kernels release the GIL, so a thread overlaps reading with
compute at no start-up or pickling cost (PyTorch's DataLoader uses processes because its
samples are Python-heavy transforms; these are not). The thread reads at most `prefetch` + 1
batches ahead (`prefetch` in the queue, one waiting to enter it); a reading error reaches the
loop as one line at the step it belongs to; `close` stops the thread at once, even when it
waits on a full queue.

Test hook: `PARAXIS_TEST_DATA_SLEEP=0.8` makes every read sleep 0.8 times the loop's last
step time, a source slower than nothing but faster than compute; `tests/test_loader.py`
checks that the loop then waits for data at most 5% of a step.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

import numpy as np

from paraxis.spec.cp_balance import check_split, rank_chunks
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import Layout

if TYPE_CHECKING:
    from paraxis.data.blend import Blend

SLEEP_ENV = "PARAXIS_TEST_DATA_SLEEP"
T = TypeVar("T")


@dataclass(frozen=True)
class Share:
    """The part of every global batch one rank reads: the rows of its data-parallel rank,
    and of each row its context-parallel rank's two chunks."""

    dp_rank: int = 0
    dp: int = 1
    cp_rank: int = 0
    cp: int = 1

    @classmethod
    def of(cls, layout: Layout, rank: int) -> Share:
        """Global rank `rank`'s share under `layout`."""
        coords = layout.coords(rank)
        return cls(coords.dp_rank, layout.dp, coords.cp_rank, layout.cp)

    def rows(self, global_batch: int) -> range:
        per_rank = global_batch // self.dp
        return range(self.dp_rank * per_rank, (self.dp_rank + 1) * per_rank)

    def columns(self, seq_len: int) -> list[tuple[int, int]]:
        """The input positions [lo, hi) this rank holds of each row, in local order."""
        if self.cp == 1:
            return [(0, seq_len)]
        chunk = check_split(seq_len, self.cp)
        return [(c * chunk, (c + 1) * chunk) for c in rank_chunks(self.cp_rank, self.cp)]


def read_share(data: Blend, step: int, global_batch: int, seq_len: int, seed: int,
               share: Share, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """This rank's inputs and next-token targets of `step`'s global batch (int64), read
    from the tokens without reading anyone else's rows."""
    blend, which, starts = data.positions(step, global_batch, seq_len, seed, split)
    rows, columns = share.rows(global_batch), share.columns(seq_len)
    width = sum(hi - lo for lo, hi in columns)
    x = np.empty((len(rows), width), dtype=np.int64)
    y = np.empty_like(x)
    for local, row in enumerate(rows):
        tokens, start, at = blend.sources[which[row]].tokens, int(starts[row]), 0
        for lo, hi in columns:  # a chunk's targets are its inputs shifted by one token
            window = tokens.read(start + lo, start + hi + 1)
            x[local, at: at + hi - lo], y[local, at: at + hi - lo] = window[:-1], window[1:]
            at += hi - lo
    return x, y


def hook_sleep_fraction() -> float:
    """The test hook's fraction of a step each read sleeps (0: the hook is off)."""
    text = os.environ.get(SLEEP_ENV, "").strip()
    try:
        value = float(text) if text else 0.0
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise ParaxisError(f"{SLEEP_ENV}={text} (a test hook) must be a fraction >= 0 of the "
                           "step time; unset it to turn the hook off")
    return value


class Loader(Generic[T]):
    """Step after step's batch from `read(step)`, read `prefetch` steps ahead by a thread
    (`prefetch` 0: read when asked, in the caller's thread)."""

    def __init__(self, read: Callable[[int], T], steps: range, prefetch: int = 2) -> None:
        self._read, self._steps, self.prefetch = read, steps, prefetch
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, prefetch))
        self._stop = threading.Event()
        self._sleep = hook_sleep_fraction()
        self._step_time_s = 0.0  # the loop's last step without its wait (for the test hook)
        self._returned: float | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Loader[T]:
        if self.prefetch > 0 and len(self._steps):
            self._thread = threading.Thread(target=self._produce, name="paraxis-loader",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the thread (it may be waiting to put a batch the loop will never take)."""
        self._stop.set()
        while self._thread is not None and self._thread.is_alive():
            with contextlib.suppress(queue.Empty):
                self._queue.get_nowait()
            self._thread.join(timeout=0.05)
        self._thread = None

    def get(self, step: int) -> tuple[T, float]:
        """`step`'s batch, and the seconds the caller waited for it."""
        began = time.perf_counter()
        if self._returned is not None:
            self._step_time_s = began - self._returned
        if self._thread is None:
            try:
                batch = self._load(step)
            except Exception as error:  # noqa: BLE001 - any reading failure is one line
                raise one_line(error, step) from None
        else:
            got, batch, error = self._next_item(step)
            if error is not None:
                raise one_line(error, got) from None
            if got != step:
                raise RuntimeError(f"the loader read step {got}, the loop asked for {step}")
        self._returned = time.perf_counter()
        return batch, self._returned - began

    def _next_item(self, step: int) -> tuple[int, T, Exception | None]:
        while True:
            try:
                return self._queue.get(timeout=1.0)
            except queue.Empty:
                if self._thread is None or not self._thread.is_alive():
                    with contextlib.suppress(queue.Empty):
                        return self._queue.get_nowait()
                    raise ParaxisError(f"the data loader stopped before step {step}; it reads "
                                       f"steps {self._steps.start}..{self._steps.stop - 1}"
                                       ) from None

    def _load(self, step: int) -> T:
        if self._sleep and self._step_time_s:
            time.sleep(self._sleep * self._step_time_s)
        return self._read(step)

    def _produce(self) -> None:
        for step in self._steps:
            try:
                item = (step, self._load(step), None)
            except Exception as error:  # noqa: BLE001 - handed to the loop, which raises it
                item = (step, None, error)
            while not self._stop.is_set():
                try:
                    self._queue.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if item[2] is not None or self._stop.is_set():
                return


def one_line(error: Exception, step: int) -> ParaxisError:
    """A reading failure as the one-line error the loop stops with."""
    if isinstance(error, ParaxisError):
        return error
    text = str(error).splitlines()[0] if str(error) else ""
    return ParaxisError(f"reading the batch of step {step} failed: {type(error).__name__}"
                        f"{': ' + text if text else ''}; check the data files")
