"""Count the bytes of tensors a process allocates: the exact, RSS-free measure of memory.

    with TensorBytes() as meter:            # start it before anything it should count
        with meter.phase("construct"):
            engine = build_engine(...)
        with meter.phase("step"):
            ...
    meter.peak, meter.peaks["construct"]  # most bytes of tensors alive at once

Resident memory (RSS) mixes tensors with the interpreter, libraries, gloo's buffers and what
the C allocator keeps after a free, so it cannot say whether a rank ever held a full copy of
the model. The PyTorch profiler's memory events can: with `profile_memory=True` every tensor
allocation and free on the CPU allocator is recorded with its address and size, and the
running total is summed from them. It counts tensors made inside the block only (a tensor
made before the block is not subtracted when it is freed inside it), so the meter
must span the whole life of what it measures (construction, loading and the steps). Frees
made by another thread (a collective's worker) are not seen either: the count errs high.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

from torch.profiler import ProfilerActivity, profile, record_function


class TensorBytes:
    """The peak of tensor bytes alive inside a `with` block (CPU allocator; on a GPU the
    CUDA allocator's own `max_memory_allocated` is the tool), overall and per phase."""

    def __init__(self) -> None:
        self.peak = 0
        self.peaks: dict[str, int] = {}  # phase -> peak while it ran
        self.starts: dict[str, int] = {}  # phase -> bytes alive when it began
        self._phases: list[str] = []
        self._profile = profile(activities=[ProfilerActivity.CPU], profile_memory=True)

    def __enter__(self) -> TensorBytes:
        self._profile.__enter__()
        return self

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Mark a phase; its peak is `peaks[name]` once the meter's block has ended."""
        self._phases.append(name)
        with record_function(f"tensor_bytes:{name}"):
            yield

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._profile.__exit__(kind, error, trace)
        if kind is not None:
            return
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "trace.json"
            self._profile.export_chrome_trace(str(path))
            events = json.loads(path.read_text())["traceEvents"]
        raw = sorted((e["ts"], e["args"]["Ev Idx"], e["args"]["Addr"], e["args"]["Bytes"])
                     for e in events
                     if e.get("name") == "[memory]" and e["args"].get("Device Type") == 0)
        # The running total is kept here, by address, from this block's events alone: the
        # allocator's own total persists between profiling sessions and goes wrong once a
        # tensor made in one is freed outside any; a free of a tensor made before the block
        # is ignored.
        live: dict[int, int] = {}
        total = 0
        memory = []
        for ts, _, address, size in raw:
            if size > 0:
                live[address] = size
                total += size
            elif address in live:
                total -= live.pop(address)
            memory.append((ts, total))
        self.peak = max((total for _, total in memory), default=0)
        for event in events:
            name = event.get("name", "")
            if name.startswith("tensor_bytes:") and "dur" in event:
                start, end = event["ts"], event["ts"] + event["dur"]
                before = [total for ts, total in memory if ts < start]
                inside = [total for ts, total in memory if start <= ts <= end]
                phase = name.split(":", 1)[1]
                self.starts[phase] = before[-1] if before else 0
                self.peaks[phase] = max(inside + before[-1:], default=0)
