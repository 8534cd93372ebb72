"""The schedule as data: actions, where each model chunk sits, and the clock that runs them.

`Schedule` holds one action list per stage; `simulate` runs those lists against a clock with
given costs and returns a `Timeline`. Nothing here decides an order: the generators
(`build.py`, `zero_bubble.py`) do, and `validate.py` proves an order complete and safe.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

from paraxis.spec.errors import ParaxisError

COMPUTE = ("F", "B", "W")
PLACEMENTS = ("loop", "v")


@dataclass(frozen=True)
class Action:
    kind: str  # "F", "B", "W", "send" or "recv"
    stage: int
    microbatch: int
    chunk: int = 0
    tensor: str | None = None  # "act" or "grad" for send/recv
    peer: int | None = None  # the other stage of a send/recv

    def __str__(self) -> str:
        chunk = f"c{self.chunk}" if self.chunk else ""
        if self.kind in COMPUTE:
            return f"{self.kind}{self.microbatch}{chunk}"
        arrow = "->" if self.kind == "send" else "<-"
        return f"{self.kind}_{self.tensor}{self.microbatch}{chunk}{arrow}{self.peer}"


# ------------------------------------------------------------------ where chunks sit


def virtual_stage_of(stage: int, chunk: int, stages: int, placement: str = "loop") -> int:
    """(stage, chunk) -> virtual stage, the position of that model chunk in the layer stack.

    "loop" (Megatron's interleaving, Narayanan et al. 2021 sec. 2.2): chunk c of every stage
    comes after chunk c-1 of all stages, so activations loop from the last stage back to
    stage 0. "v" (two chunks, Qi et al. 2024 "Pipeline Parallelism with Controllable Memory"):
    chunk 0 runs down the stages and chunk 1 back up, so stage 0 holds the first and the last
    chunk, the loss is computed on stage 0, and the turn at stage P-1 needs no message.
    """
    if placement == "v":
        return stage if chunk == 0 else 2 * stages - 1 - stage
    return chunk * stages + stage


def place_of(virtual_stage: int, stages: int, placement: str = "loop") -> tuple[int, int]:
    """Virtual stage -> (stage, chunk); the inverse of `virtual_stage_of`."""
    if placement == "v":
        if virtual_stage < stages:
            return virtual_stage, 0
        return 2 * stages - 1 - virtual_stage, 1
    return virtual_stage % stages, virtual_stage // stages


def head_stage(stages: int, placement: str = "loop") -> int:
    """The stage of the last virtual stage (final norm, LM head, loss): the last stage, or
    stage 0 in zb-v's V, where the last virtual stage comes back to the first."""
    return place_of(2 * stages - 1 if placement == "v" else stages - 1, stages, placement)[0]


# ----------------------------------------------------------------------------- costs


CostSpec = float | Sequence[float]


@dataclass(frozen=True)
class Costs:
    """Time of one microbatch on one virtual stage: forward, whole backward (B + W when fused)
    and the weight-gradient part W; plus the time of one point-to-point message."""

    forward: tuple[float, ...]
    backward: tuple[float, ...]
    weight: tuple[float, ...]
    comm: float = 0.0

    def of(self, action: Action, virtual_stage: int, split: bool) -> float:
        if action.kind == "F":
            return self.forward[virtual_stage]
        if action.kind == "W":
            return self.weight[virtual_stage]
        whole = self.backward[virtual_stage]
        return whole - self.weight[virtual_stage] if split else whole


def stage_costs(schedule: Schedule, forward: CostSpec = 1.0, backward: CostSpec = 2.0,
                weight: CostSpec | None = None, comm: float = 0.0) -> Costs:
    """Costs per virtual stage from a number (the whole stage, split evenly over its v
    chunks), a list per stage (each split over its chunks: an unbalanced pipeline) or a list
    per virtual stage (one per chunk). `weight` defaults to half the backward (Qi et al.
    2023 take F, B and W as equal)."""

    def spread(value: CostSpec, name: str) -> tuple[float, ...]:
        count, chunks = schedule.num_virtual_stages, schedule.virtual
        if isinstance(value, int | float):
            values = [float(value) / chunks] * count
        elif len(value) == schedule.num_stages:
            values = [float(value[schedule.place(v)[0]]) / chunks for v in range(count)]
        elif len(value) == count:
            values = [float(x) for x in value]
        else:
            raise ParaxisError(f"{name} costs have {len(value)} values for {schedule.num_stages}"
                               f" stages ({count} chunks); give one per stage or per chunk")
        if any(x < 0 for x in values):
            raise ParaxisError(f"{name} costs must not be negative, got {list(value)!r}")
        return tuple(values)

    forwards, backwards = spread(forward, "forward"), spread(backward, "backward")
    weights = (tuple(b / 2 for b in backwards) if weight is None
               else spread(weight, "weight"))
    for w, b in zip(weights, backwards, strict=True):
        if w > b:
            raise ParaxisError(f"a weight-gradient cost ({w:g}) exceeds its whole backward "
                               f"({b:g}); W is a part of the backward")
    return Costs(forwards, backwards, weights, comm)


# -------------------------------------------------------------------------- schedule


@dataclass
class Schedule:
    kind: str
    num_stages: int
    microbatches: int
    virtual: int
    stages: list[list[Action]]
    placement: str = "loop"  # how chunks map to virtual stages (`virtual_stage_of`)

    # ------------------------------------------------------------ geometry of chunks

    @property
    def num_virtual_stages(self) -> int:
        return self.num_stages * self.virtual

    @property
    def split_backward(self) -> bool:
        """True when backward runs as B (input gradient) then W (weight gradients)."""
        return any(a.kind == "W" for actions in self.stages for a in actions)

    def virtual_stage(self, stage: int, chunk: int) -> int:
        return virtual_stage_of(stage, chunk, self.num_stages, self.placement)

    def place(self, virtual_stage: int) -> tuple[int, int]:
        """Virtual stage -> (stage, chunk)."""
        return place_of(virtual_stage, self.num_stages, self.placement)

    def message_key(self, action: Action) -> tuple[str, int, int]:
        """(tensor, microbatch, destination virtual stage): the same on both ends of a
        message, and unique within a step (the executor turns it into a p2p tag)."""
        here = self.virtual_stage(action.stage, action.chunk)
        if action.kind == "recv":
            return (action.tensor or "", action.microbatch, here)
        step = 1 if action.tensor == "act" else -1
        return (action.tensor or "", action.microbatch, here + step)

    def message_tag(self, action: Action) -> int:
        tensor, microbatch, destination = self.message_key(action)
        return (microbatch * self.num_virtual_stages + destination) * 2 + (tensor == "grad")

    # ------------------------------------------------------------------ derived figures

    def simulate(self, forward_cost: CostSpec = 1.0, backward_cost: CostSpec = 2.0,
                 comm_cost: float = 0.0, weight_cost: CostSpec | None = None) -> Timeline:
        return simulate(self, forward_cost, backward_cost, comm_cost, weight_cost)

    def bubble_fraction(self, forward_cost: CostSpec = 1.0, backward_cost: CostSpec = 2.0,
                        weight_cost: CostSpec | None = None) -> float:
        """Idle share of the pipeline: 1 - busy / (stages * makespan), from the simulated
        actions (GPipe and 1F1B: (P-1)/(M+P-1), Huang et al. 2019 sec. 2.3)."""
        return self.simulate(forward_cost, backward_cost, 0.0, weight_cost).bubble_fraction

    def bubble_ratio(self, forward_cost: CostSpec = 1.0, backward_cost: CostSpec = 2.0,
                     weight_cost: CostSpec | None = None) -> float:
        """Idle time over ideal (busy) time, the figure Narayanan et al. 2021 (sec. 2.2) quote:
        (P-1)/M for 1F1B, (P-1)/(v*M) for interleaved 1F1B."""
        timeline = self.simulate(forward_cost, backward_cost, 0.0, weight_cost)
        return timeline.idle_time / timeline.busy_time

    def peak_in_flight(self) -> list[int]:
        """Per stage, the most (microbatch, chunk) activation sets held at once: from a
        forward until the backward that frees them, which is W when backward is split (the
        weight gradients need the saved inputs). With v chunks each is 1/v of the stage's
        blocks in the mean (`build.peak_held` weighs each by its own)."""
        release = "W" if self.split_backward else "B"
        return [held_peak(((a.kind, a.chunk) for a in actions), [1] * self.virtual, release)
                for actions in self.stages]

    def compute_order(self, stage: int) -> list[Action]:
        return [a for a in self.stages[stage] if a.kind in COMPUTE]

    def to_dict(self) -> dict:
        return {"kind": self.kind, "stages": self.num_stages, "microbatches": self.microbatches,
                "virtual": self.virtual, "placement": self.placement,
                "actions": [[asdict(a) for a in actions] for actions in self.stages]}


def held_peak(computes: Iterable[tuple[str, int]], weights: Sequence[float],
              release: str) -> float:
    """The most of `weights[chunk]` summed over a stage's (microbatch, chunk) activation sets
    held at once, its computes (kind, chunk) in order: each set from its forward until
    `release` ("B", or "W" where the backward is split) frees it."""
    held = peak = 0
    for kind, chunk in computes:
        if kind == "F":
            held += weights[chunk]
            peak = max(peak, held)
        elif kind == release:
            held -= weights[chunk]
    return peak


def held_moments(computes: Iterable[tuple[str, int]], virtual: int
                 ) -> tuple[tuple[int, ...], ...]:
    """A split-backward stage's moments of most memory, its computes (kind, chunk) in order:
    after each F and each B, the (microbatch, chunk) sets it holds per chunk, activations
    (from the F until the W) then the gradients B keeps for W (from the B until the W), as
    one tuple of 2 `virtual` counts. Only the moments no other one holds at least as much
    in every count: the peak of any weighing of the counts is at one of them."""
    held = [0] * (2 * virtual)
    moments: set[tuple[int, ...]] = set()
    for kind, chunk in computes:
        if kind == "F":
            held[chunk] += 1
        elif kind == "B":
            held[virtual + chunk] += 1
        elif kind == "W":
            held[chunk] -= 1
            held[virtual + chunk] -= 1
            continue
        moments.add(tuple(held))
    return tuple(m for m in moments if not any(
        o != m and all(a >= b for a, b in zip(o, m, strict=True)) for o in moments))


@dataclass(frozen=True)
class Event:
    action: Action
    start: float
    end: float


@dataclass
class Timeline:
    events: list[list[Event]] = field(default_factory=list)  # per stage, in execution order

    @property
    def makespan(self) -> float:
        return max((e.end for stage in self.events for e in stage), default=0.0)

    def busy(self, stage: int) -> float:
        return sum(e.end - e.start for e in self.events[stage] if e.action.kind in COMPUTE)

    @property
    def busy_time(self) -> float:
        return sum(self.busy(stage) for stage in range(len(self.events)))

    @property
    def idle_time(self) -> float:
        return len(self.events) * self.makespan - self.busy_time

    def idle_by_stage(self) -> list[float]:
        """Per stage, the time it waits within the step (makespan minus its compute)."""
        makespan = self.makespan
        return [makespan - self.busy(stage) for stage in range(len(self.events))]

    @property
    def bubble_fraction(self) -> float:
        total = len(self.events) * self.makespan
        return self.idle_time / total if total else 0.0


def simulate(schedule: Schedule, forward_cost: CostSpec = 1.0, backward_cost: CostSpec = 2.0,
             comm_cost: float = 0.0, weight_cost: CostSpec | None = None,
             action_seconds: Mapping[Action, float] | None = None,
             start_s: Sequence[float] | None = None) -> Timeline:
    """Run the action lists against a clock: computes take their cost (`stage_costs`: a
    number for every stage, or one per stage or chunk), a send or recv is posted at once,
    and a compute that needs a message waits until `comm_cost` after its send was posted
    (the runtime posts a recv where the schedule says and waits for it only there). A recv
    event spans from its posting to its data's arrival. Raises ParaxisError on deadlock.

    `action_seconds` gives some actions their own time instead (a measured step replayed
    action by action, `viz.trace.replay`: a compute's time, or how long posting a send held
    its stage); `start_s`, each stage's clock at the start."""
    costs = stage_costs(schedule, forward_cost, backward_cost, weight_cost, comm_cost)
    own = action_seconds or {}
    split = schedule.split_backward
    clocks = [0.0] * schedule.num_stages if start_s is None else [float(t) for t in start_s]
    if len(clocks) != schedule.num_stages:
        raise ParaxisError(f"start_s has {len(clocks)} clocks for {schedule.num_stages} stages")
    positions = [0] * schedule.num_stages
    sent: dict[tuple, float] = {}
    timeline = Timeline([[] for _ in range(schedule.num_stages)])
    # A stage runs until a compute waits on a send not yet posted; posting that send wakes
    # it (each action is visited once, whatever the order of the stages). A recv posted
    # before its send gets its arrival when the send is posted.
    waiting: dict[tuple, int] = {}  # message key -> the stage blocked on it
    unanswered: dict[tuple, tuple[int, int]] = {}  # message key -> (stage, event) of its recv
    ready = deque(range(schedule.num_stages))

    def arrival(posted: float, sent_at: float) -> float:  # a recv's data, `comm` after its send
        return max(posted, sent_at + costs.comm)

    while ready:
        stage = ready.popleft()
        actions = schedule.stages[stage]
        while positions[stage] < len(actions):
            action = actions[positions[stage]]
            start = clocks[stage]
            if action.kind in COMPUTE:
                needed = input_message(schedule, action)
                if needed is not None:
                    if needed not in sent:
                        waiting[needed] = stage
                        break  # blocked until the peer posts the send
                    start = max(start, sent[needed] + costs.comm)
                here = schedule.virtual_stage(stage, action.chunk)
                seconds = own.get(action)
                end = start + (costs.of(action, here, split) if seconds is None else seconds)
            elif action.kind == "send":
                end = start + own.get(action, 0.0)
                key = schedule.message_key(action)
                sent[key] = end
                if key in unanswered:
                    peer, index = unanswered.pop(key)
                    recv = timeline.events[peer][index]
                    timeline.events[peer][index] = Event(recv.action, recv.start,
                                                         arrival(recv.start, end))
                if key in waiting:
                    ready.append(waiting.pop(key))
            else:
                key = schedule.message_key(action)
                end = arrival(start, sent[key]) if key in sent else start
                if key not in sent:
                    unanswered[key] = (stage, len(timeline.events[stage]))
            timeline.events[stage].append(Event(action, start, end))
            clocks[stage] = end if action.kind in COMPUTE or action.kind == "send" else start
            positions[stage] += 1
    if any(positions[s] < len(actions) for s, actions in enumerate(schedule.stages)):
        stuck = ", ".join(f"stage {s} at {actions[positions[s]]}"
                          for s, actions in enumerate(schedule.stages)
                          if positions[s] < len(actions))
        raise ParaxisError(f"schedule deadlocks: {stuck} wait for sends that never come; "
                           "post each send before the recv that waits on its peer")
    return timeline


def input_message(schedule: Schedule, action: Action) -> tuple[str, int, int] | None:
    """The message key of what an F or B needs from another stage (None: nothing, its input
    is the step's data, the loss, or a chunk of this same stage)."""
    if action.kind not in ("F", "B"):
        return None
    here = schedule.virtual_stage(action.stage, action.chunk)
    source = here - 1 if action.kind == "F" else here + 1
    if not 0 <= source < schedule.num_virtual_stages:
        return None
    if schedule.place(source)[0] == action.stage:
        return None
    return ("act" if action.kind == "F" else "grad", action.microbatch, here)
