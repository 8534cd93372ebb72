"""Count the collectives tensor parallelism issues: per kind, how many and how many bytes.

    with CommCounter() as counter:
        loss = model(x, y)
        loss.backward()
    counter.count("all_reduce", phase="forward")   # 2 * layers (+ embedding, loss)

Every operator in `paraxis.parallel.tensor.comm` records into the counters that are active
in this process (a stack, so nested counters all see the event). Each event says its phase
(the forward or the backward pass) and its purpose: "activation" for the Megatron
operators inside a layer, "loss" for the vocab-parallel cross-entropy's scalars-per-token,
"param_grad" for the sum over the TP group of a replicated parameter's gradient computed on
sequence shards. The planner's cost model counts the "activation" ones per layer.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from types import TracebackType

KINDS = ("all_reduce", "all_gather", "reduce_scatter")


@dataclass(frozen=True)
class CommEvent:
    kind: str  # one of KINDS
    nbytes: int  # bytes of this rank's input to the collective
    phase: str  # "forward" or "backward"
    purpose: str  # "activation", "loss" or "param_grad"


@dataclass(eq=False)  # nested counters are told apart by identity, not by their events
class CommCounter:
    events: list[CommEvent] = field(default_factory=list)

    def __enter__(self) -> CommCounter:
        _ACTIVE.append(self)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        _ACTIVE.remove(self)

    def _select(self, kind: str | None, phase: str | None, purpose: str | None
                ) -> list[CommEvent]:
        return [e for e in self.events if (kind is None or e.kind == kind)
                and (phase is None or e.phase == phase)
                and (purpose is None or e.purpose == purpose)]

    def count(self, kind: str | None = None, phase: str | None = None,
              purpose: str | None = None) -> int:
        return len(self._select(kind, phase, purpose))

    def nbytes(self, kind: str | None = None, phase: str | None = None,
               purpose: str | None = None) -> int:
        return sum(e.nbytes for e in self._select(kind, phase, purpose))

    def summary(self) -> dict[str, dict[str, int]]:
        """{kind: {"count": n, "bytes": b}} over every event."""
        counts: Counter[str] = Counter(e.kind for e in self.events)
        return {kind: {"count": counts[kind], "bytes": self.nbytes(kind)} for kind in counts}

    def reset(self) -> None:
        self.events.clear()


_ACTIVE: list[CommCounter] = []


def record(kind: str, nbytes: int, phase: str, purpose: str = "activation") -> None:
    """Called by the communication operators; free when no counter is active."""
    if _ACTIVE:
        event = CommEvent(kind, nbytes, phase, purpose)
        for counter in _ACTIVE:
            counter.events.append(event)
