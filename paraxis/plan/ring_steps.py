"""Ring all-reduce, step by step, in plain Python.

N ranks sit on a ring; each splits its vector into N chunks. The algorithm (Patarasuk &
Yuan 2009, "Bandwidth optimal all-reduce algorithms for clusters of workstations"; the ring
Horovod and NCCL use) runs 2(N-1) steps, every rank sending one chunk to its right neighbour
and receiving one from its left neighbour in each:

- reduce-scatter, steps s = 0..N-2: rank r sends chunk (r - s) mod N and adds the chunk
  (r - s - 1) mod N it receives to its own. Afterwards rank r holds the full sum of chunk
  (r + 1) mod N.
- all-gather, steps s = 0..N-2: rank r sends chunk (r + 1 - s) mod N (a finished one) and
  overwrites chunk (r - s) mod N with the one it receives.

The simulator keeps the values (and which ranks' contributions each chunk holds) on every
rank after every step. `paraxis.dist.ring` runs the same schedule with real send/recv and
its tests demand the same states, so `ring_schedule` is the one place the schedule lives.
"""

from __future__ import annotations

from dataclasses import dataclass

from paraxis.plan.comm import ring_all_reduce_time
from paraxis.spec.errors import ParaxisError

REDUCE_SCATTER = "reduce-scatter"
ALL_GATHER = "all-gather"


@dataclass(frozen=True)
class Transfer:
    """One message of one step: `src` sends its chunk `chunk` to `dst`."""

    src: int
    dst: int
    chunk: int


@dataclass(frozen=True)
class RingStep:
    """Everything about one of the 2(N-1) steps, and the state it leaves behind."""

    index: int  # 1-based over the whole all-reduce
    phase: str  # REDUCE_SCATTER or ALL_GATHER
    transfers: tuple[Transfer, ...]
    # values[rank][chunk] -> that chunk's elements on that rank after this step
    values: tuple[tuple[tuple[float, ...], ...], ...]
    # contributors[rank][chunk] -> ranks whose input is summed into that chunk on that rank
    contributors: tuple[tuple[frozenset[int], ...], ...]
    bytes_sent: tuple[int, ...]  # per rank, in this step

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes_sent)


@dataclass(frozen=True)
class RingSimulation:
    ranks: int
    size: int  # elements per rank's vector
    bytes_per_element: int
    initial: tuple[tuple[tuple[float, ...], ...], ...]  # values[rank][chunk] before step 1
    steps: tuple[RingStep, ...]

    @property
    def result(self) -> list[list[float]]:
        """Every rank's whole vector after the last step (the all-reduce result)."""
        last = self.steps[-1].values if self.steps else self.initial
        return [[x for chunk in rank for x in chunk] for rank in last]

    @property
    def bytes_sent_per_rank(self) -> int:
        """What the busiest rank sends over the whole all-reduce."""
        return max(sum(step.bytes_sent[r] for step in self.steps) for r in range(self.ranks)) \
            if self.steps else 0


def chunk_bounds(size: int, ranks: int) -> list[tuple[int, int]]:
    """[start, end) of each of `ranks` chunks of a `size`-element vector.

    The first size % ranks chunks get one element more: the split `torch.tensor_split`
    makes, which the real ring uses, so both cut the vector in the same places.
    """
    base, extra = divmod(size, ranks)
    bounds, start = [], 0
    for i in range(ranks):
        end = start + base + (1 if i < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def ring_schedule(ranks: int) -> list[tuple[str, list[Transfer]]]:
    """The 2(N-1) steps: phase and the chunk each rank sends to its right neighbour."""
    steps: list[tuple[str, list[Transfer]]] = []
    for s in range(ranks - 1):
        steps.append((REDUCE_SCATTER, [Transfer(r, (r + 1) % ranks, (r - s) % ranks)
                                       for r in range(ranks)]))
    for s in range(ranks - 1):
        steps.append((ALL_GATHER, [Transfer(r, (r + 1) % ranks, (r + 1 - s) % ranks)
                                   for r in range(ranks)]))
    return steps


def default_vectors(ranks: int, size: int) -> list[list[float]]:
    """Inputs that make the sums easy to follow: rank r holds (r + 1) * 10**0, 10**1, ...

    Element i of rank r is (r + 1) * 10**(i mod 3): every rank's share is visible in the
    sum's digits for small N.
    """
    return [[float((r + 1) * 10 ** (i % 3)) for i in range(size)] for r in range(ranks)]


def simulate_ring(ranks: int, vectors: list[list[float]] | None = None, size: int | None = None,
                  bytes_per_element: int = 4) -> RingSimulation:
    """Run ring all-reduce (sum) on `vectors` (one per rank) and keep every step's state."""
    if ranks < 1:
        raise ParaxisError(f"--ranks {ranks} must be at least 1")
    if vectors is None:
        size = ranks if size is None else size
        vectors = default_vectors(ranks, size)
    if len(vectors) != ranks:
        raise ParaxisError(f"got {len(vectors)} vectors for {ranks} ranks; give one per rank")
    size = len(vectors[0])
    if any(len(v) != size for v in vectors):
        raise ParaxisError("every rank's vector must have the same length")
    if size < ranks:
        raise ParaxisError(f"a vector of {size} elements cannot be cut into {ranks} chunks; "
                           f"use --size {ranks} or more")
    bounds = chunk_bounds(size, ranks)
    values = [[list(map(float, vec[a:b])) for a, b in bounds] for vec in vectors]
    owners = [[{r} for _ in range(ranks)] for r in range(ranks)]
    initial = _freeze(values)
    steps = []
    for index, (phase, transfers) in enumerate(ring_schedule(ranks), start=1):
        # Every message of a step leaves before any arrives: read all sends first.
        outgoing = [(t, list(values[t.src][t.chunk]), set(owners[t.src][t.chunk]))
                    for t in transfers]
        for t, chunk_values, chunk_owners in outgoing:
            if phase == REDUCE_SCATTER:
                # own + received, the order the real ring adds in (add_ on its own chunk)
                values[t.dst][t.chunk] = [mine + theirs for mine, theirs
                                          in zip(values[t.dst][t.chunk], chunk_values,
                                                 strict=True)]
                owners[t.dst][t.chunk] |= chunk_owners
            else:
                values[t.dst][t.chunk] = chunk_values
                owners[t.dst][t.chunk] = chunk_owners
        sent = [0] * ranks
        for t in transfers:
            sent[t.src] += (bounds[t.chunk][1] - bounds[t.chunk][0]) * bytes_per_element
        steps.append(RingStep(index, phase, tuple(transfers), _freeze(values),
                              tuple(tuple(frozenset(o) for o in row) for row in owners),
                              tuple(sent)))
    return RingSimulation(ranks, size, bytes_per_element, initial, tuple(steps))


def _freeze(values: list[list[list[float]]]) -> tuple[tuple[tuple[float, ...], ...], ...]:
    return tuple(tuple(tuple(chunk) for chunk in rank) for rank in values)


def ring_all_reduce_time_s(message_bytes: float, ranks: int, bandwidth_bytes_per_s: float,
                           latency_s: float = 0.0) -> float:
    """Time of a ring all-reduce of `message_bytes` per rank: 2(N-1) steps of X/N bytes,
    T = 2(N-1) X / (N B) + 2(N-1) a. The planner's cost model owns the formula
    (`paraxis.plan.comm.ring_all_reduce_time`, Patarasuk & Yuan 2009); this is that call."""
    return ring_all_reduce_time(message_bytes, ranks, bandwidth_bytes_per_s, latency_s)
