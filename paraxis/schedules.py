"""Pipeline schedules as data: who runs which forward/backward, in which order, and what they
send to whom. Pure Python (no torch): the planner, the pictures and the runtime share it.

    schedule = build_schedule("1f1b", stages=4, microbatches=8)
    validate(schedule)                       # complete and deadlock-free, or ParaxisError
    schedule.bubble_fraction()               # idle share of the simulated timeline
    schedule.peak_in_flight()                # activations held per stage (memory)

Vocabulary. A *stage* is one pipeline rank. With the interleaved schedule a stage holds `v`
model *chunks*; chunk `c` of stage `s` is *virtual stage* `c * P + s` (Narayanan et al. 2021,
sec. 2.2), so activations flow s -> s+1 inside a chunk and from the last stage back to stage
0 between chunks. An `Action` is one of

    F / B    forward / backward of `microbatch` on local `chunk`
    send     ship this stage's output activation ("act") or input gradient ("grad") to `peer`
    recv     receive the activation / gradient that the next F / B of this chunk needs

Communication semantics (what `simulate` and `validate` model, and what the executor does):
a send is posted asynchronously (isend: the sender goes on at once), a recv blocks until the
matching send has been posted. Messages are matched by `message_key` (tensor, microbatch,
destination virtual stage), never by arrival order, so the executor tags them the same way.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

from paraxis.errors import ParaxisError

KINDS = ("gpipe", "1f1b", "interleaved")
COMPUTE = ("F", "B")


@dataclass(frozen=True)
class Action:
    kind: str  # "F", "B", "send" or "recv"
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


@dataclass
class Schedule:
    kind: str
    num_stages: int
    microbatches: int
    virtual: int
    stages: list[list[Action]]

    # ------------------------------------------------------------ geometry of chunks

    @property
    def num_virtual_stages(self) -> int:
        return self.num_stages * self.virtual

    def virtual_stage(self, stage: int, chunk: int) -> int:
        # Megatron's interleaving: chunk c of every stage comes after chunk c-1 of all stages.
        return chunk * self.num_stages + stage

    def place(self, virtual_stage: int) -> tuple[int, int]:
        """Virtual stage -> (stage, chunk)."""
        return virtual_stage % self.num_stages, virtual_stage // self.num_stages

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

    def simulate(self, forward_cost: float = 1.0, backward_cost: float = 2.0,
                 comm_cost: float = 0.0) -> Timeline:
        return simulate(self, forward_cost, backward_cost, comm_cost)

    def bubble_fraction(self, forward_cost: float = 1.0, backward_cost: float = 2.0) -> float:
        """Idle share of the pipeline: 1 - busy / (stages * makespan), from the simulated
        actions (GPipe and 1F1B: (P-1)/(M+P-1), Huang et al. 2019 sec. 2.3)."""
        return self.simulate(forward_cost, backward_cost).bubble_fraction

    def bubble_ratio(self, forward_cost: float = 1.0, backward_cost: float = 2.0) -> float:
        """Idle time over ideal (busy) time, the figure Narayanan et al. 2021 (sec. 2.2) quote:
        (P-1)/M for 1F1B, (P-1)/(v*M) for interleaved 1F1B."""
        timeline = self.simulate(forward_cost, backward_cost)
        return timeline.idle_time / timeline.busy_time

    def peak_in_flight(self) -> list[int]:
        """Per stage, the most (microbatch, chunk) forwards whose backward has not run yet:
        the activations held at once. With v chunks each one is 1/v of the stage's layers."""
        peaks = []
        for actions in self.stages:
            held, peak = 0, 0
            for action in actions:
                if action.kind == "F":
                    held += 1
                    peak = max(peak, held)
                elif action.kind == "B":
                    held -= 1
            peaks.append(peak)
        return peaks

    def compute_order(self, stage: int) -> list[Action]:
        return [a for a in self.stages[stage] if a.kind in COMPUTE]

    def to_dict(self) -> dict:
        return {"kind": self.kind, "stages": self.num_stages, "microbatches": self.microbatches,
                "virtual": self.virtual,
                "actions": [[asdict(a) for a in actions] for actions in self.stages]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict())


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

    @property
    def busy_time(self) -> float:
        return sum(e.end - e.start for stage in self.events for e in stage
                   if e.action.kind in COMPUTE)

    @property
    def idle_time(self) -> float:
        return len(self.events) * self.makespan - self.busy_time

    @property
    def bubble_fraction(self) -> float:
        total = len(self.events) * self.makespan
        return self.idle_time / total if total else 0.0


# ----------------------------------------------------------------------------- generators


def build_schedule(kind: str, stages: int, microbatches: int, virtual: int = 1) -> Schedule:
    """The per-stage action lists of one training step."""
    for name, value in (("stages", stages), ("microbatches", microbatches),
                        ("virtual", virtual)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ParaxisError(f"schedule {name}={value!r} must be a positive integer")
    if kind not in KINDS:
        raise ParaxisError(f"unknown schedule {kind!r}; use one of {', '.join(KINDS)}")
    if virtual > 1 and kind != "interleaved":
        raise ParaxisError(f"virtual={virtual} needs the interleaved schedule; use --kind "
                           "interleaved or virtual=1")
    if kind == "interleaved" and microbatches % stages:
        # Megatron's interleaved order walks microbatches in groups of P (sec. 2.2).
        raise ParaxisError(f"interleaved schedule needs microbatches ({microbatches}) to be a "
                           f"multiple of stages ({stages}); use microbatches="
                           f"{-(-microbatches // stages) * stages}")
    schedule = Schedule(kind, stages, microbatches, virtual, [])
    for stage in range(stages):
        if kind == "gpipe":
            order = _gpipe(microbatches)
        elif kind == "1f1b" or virtual == 1:
            order = _one_f_one_b(stage, stages, microbatches)
        else:
            order = _interleaved(stage, stages, microbatches, virtual)
        schedule.stages.append(_with_communication(schedule, stage, order))
    return schedule


def _gpipe(microbatches: int) -> list[tuple[str, int, int]]:
    # All forwards, then all backwards (Huang et al. 2019): every activation is held at once.
    return ([("F", m, 0) for m in range(microbatches)]
            + [("B", m, 0) for m in range(microbatches)])


def _one_f_one_b(stage: int, stages: int, microbatches: int) -> list[tuple[str, int, int]]:
    # PipeDream-Flush (Narayanan et al. 2021, sec. 2.2): P-s-1 warm-up forwards, then one
    # forward / one backward, then the remaining backwards; at most P-s activations held.
    warmup = min(stages - stage - 1, microbatches)
    order = [("F", m, 0) for m in range(warmup)]
    forward, backward = warmup, 0
    while forward < microbatches:
        order += [("F", forward, 0), ("B", backward, 0)]
        forward, backward = forward + 1, backward + 1
    order += [("B", m, 0) for m in range(backward, microbatches)]
    return order


def _interleaved(stage: int, stages: int, microbatches: int, virtual: int
                 ) -> list[tuple[str, int, int]]:
    # Megatron-LM's interleaved 1F1B (Narayanan et al. 2021, sec. 2.2): forwards visit
    # chunks in groups of P microbatches, backwards the chunks in reverse order.
    total = microbatches * virtual

    def forward_item(k: int) -> tuple[str, int, int]:
        group, within = divmod(k, stages * virtual)
        return ("F", group * stages + within % stages, within // stages)

    def backward_item(k: int) -> tuple[str, int, int]:
        group, within = divmod(k, stages * virtual)
        return ("B", group * stages + within % stages, virtual - 1 - within // stages)

    warmup = min((stages - stage - 1) * 2 + (virtual - 1) * stages, total)
    order = [forward_item(k) for k in range(warmup)]
    forward, backward = warmup, 0
    while forward < total:
        order += [forward_item(forward), backward_item(backward)]
        forward, backward = forward + 1, backward + 1
    order += [backward_item(k) for k in range(backward, total)]
    return order


def _with_communication(schedule: Schedule, stage: int, order: list[tuple[str, int, int]]
                        ) -> list[Action]:
    """Put the recv a compute needs just before it and the send it produces just after it."""
    last = schedule.num_virtual_stages - 1
    actions: list[Action] = []
    for kind, microbatch, chunk in order:
        here = schedule.virtual_stage(stage, chunk)
        source = here - 1 if kind == "F" else here + 1  # who feeds this compute
        target = here + 1 if kind == "F" else here - 1  # who this compute feeds
        tensor_in = "act" if kind == "F" else "grad"
        if 0 <= source <= last and schedule.place(source)[0] != stage:
            actions.append(Action("recv", stage, microbatch, chunk, tensor_in,
                                  schedule.place(source)[0]))
        actions.append(Action(kind, stage, microbatch, chunk))
        if 0 <= target <= last and schedule.place(target)[0] != stage:
            actions.append(Action("send", stage, microbatch, chunk, tensor_in,
                                  schedule.place(target)[0]))
    return actions


def forward_only(schedule: Schedule) -> Schedule:
    """The evaluation step of `schedule`: its forwards and activation messages, in the same
    order, without backwards (a held-out loss needs no gradients)."""
    stages = [[a for a in actions if a.kind == "F" or (a.kind in ("send", "recv")
                                                       and a.tensor == "act")]
              for actions in schedule.stages]
    return Schedule(schedule.kind, schedule.num_stages, schedule.microbatches,
                    schedule.virtual, stages)


# ------------------------------------------------------------------------------ checking


def validate(schedule: Schedule) -> Schedule:
    """Prove the schedule complete and deadlock-free; return it, or raise ParaxisError.

    Complete: every stage runs F and B of each (microbatch, chunk) exactly once, F before B;
    every compute that needs a tensor from another stage receives it first, every one that
    feeds another stage sends it, and every send has exactly one recv. Deadlock-free: the
    blocking-recv / async-send simulation runs every action.
    """
    if len(schedule.stages) != schedule.num_stages:
        raise ParaxisError(f"schedule has {len(schedule.stages)} action lists for "
                           f"{schedule.num_stages} stages; regenerate it with build_schedule")
    last = schedule.num_virtual_stages - 1
    sends: dict[tuple, int] = {}
    recvs: dict[tuple, int] = {}
    for stage, actions in enumerate(schedule.stages):
        done: set[tuple[str, int, int]] = set()
        received: set[tuple] = set()
        for position, action in enumerate(actions):
            where = f"stage {stage} action {position} ({action})"
            if action.stage != stage:
                raise ParaxisError(f"{where} is listed on stage {stage} but names stage "
                                   f"{action.stage}; keep each action on its own stage")
            if not (0 <= action.microbatch < schedule.microbatches
                    and 0 <= action.chunk < schedule.virtual):
                raise ParaxisError(f"{where} names a microbatch or chunk outside the step")
            here = schedule.virtual_stage(stage, action.chunk)
            key = (action.kind, action.microbatch, action.chunk)
            if action.kind in COMPUTE:
                if key in done:
                    raise ParaxisError(f"{where} runs twice; each F and B runs once per step")
                if action.kind == "B" and ("F", action.microbatch, action.chunk) not in done:
                    raise ParaxisError(f"{where} comes before its forward; move it after "
                                       f"F{action.microbatch}")
                source = here - 1 if action.kind == "F" else here + 1
                tensor = "act" if action.kind == "F" else "grad"
                if 0 <= source <= last:
                    src_stage, src_chunk = schedule.place(source)
                    needed_key = (tensor, action.microbatch, here)
                    if src_stage == stage:
                        if (action.kind, action.microbatch, src_chunk) not in done:
                            raise ParaxisError(f"{where} runs before the local compute that "
                                               "feeds it; reorder the chunks")
                    elif needed_key not in received:
                        raise ParaxisError(f"{where} has no earlier recv of its input; add "
                                           f"recv_{tensor} before it")
                done.add(key)
            elif action.kind in ("send", "recv"):
                if action.tensor not in ("act", "grad") or action.peer is None:
                    raise ParaxisError(f"{where} needs tensor act/grad and a peer stage")
                message = schedule.message_key(action)
                destination = message[2]
                if not 0 <= destination <= last:
                    raise ParaxisError(f"{where} addresses a virtual stage outside the model")
                if action.kind == "send":
                    producer = ("F" if action.tensor == "act" else "B", action.microbatch,
                                action.chunk)
                    if producer not in done:
                        raise ParaxisError(f"{where} sends before computing; move it after "
                                           f"{producer[0]}{producer[1]}")
                    expected = schedule.place(destination)[0]
                    sends[message] = sends.get(message, 0) + 1
                else:
                    expected = schedule.place(
                        here - 1 if action.tensor == "act" else here + 1)[0]
                    recvs[message] = recvs.get(message, 0) + 1
                    received.add(message)
                if action.peer != expected:
                    raise ParaxisError(f"{where} talks to stage {action.peer} but the "
                                       f"tensor belongs to stage {expected}")
            else:
                raise ParaxisError(f"{where} has unknown kind {action.kind!r}; use F, B, send "
                                   "or recv")
        expected_work = {(k, m, c) for k in COMPUTE for m in range(schedule.microbatches)
                         for c in range(schedule.virtual)}
        missing = sorted(expected_work - done)
        if missing:
            kind, microbatch, chunk = missing[0]
            raise ParaxisError(f"stage {stage} never runs {kind}{microbatch} of chunk {chunk} "
                               f"({len(missing)} computes missing); add them")
    for message in sorted(set(sends) | set(recvs)):
        if sends.get(message, 0) != 1 or recvs.get(message, 0) != 1:
            raise ParaxisError(f"message {message} is sent {sends.get(message, 0)} time(s) and "
                               f"received {recvs.get(message, 0)} time(s); pair each send "
                               "with one recv")
    simulate(schedule)  # raises on deadlock
    return schedule


def simulate(schedule: Schedule, forward_cost: float = 1.0, backward_cost: float = 2.0,
             comm_cost: float = 0.0) -> Timeline:
    """Run the action lists against a clock: F/B take their cost (split evenly over the v
    chunks), a send is posted at once, a recv ends `comm_cost` after its send was posted or
    when the stage reaches it, whichever is later. Raises ParaxisError on deadlock."""
    costs = {"F": forward_cost / schedule.virtual, "B": backward_cost / schedule.virtual}
    clocks = [0.0] * schedule.num_stages
    positions = [0] * schedule.num_stages
    posted: dict[tuple, float] = {}
    timeline = Timeline([[] for _ in range(schedule.num_stages)])
    remaining = sum(len(actions) for actions in schedule.stages)
    while remaining:
        progressed = False
        for stage, actions in enumerate(schedule.stages):
            while positions[stage] < len(actions):
                action = actions[positions[stage]]
                start = clocks[stage]
                if action.kind in COMPUTE:
                    end = start + costs[action.kind]
                elif action.kind == "send":
                    posted[schedule.message_key(action)] = start
                    end = start
                else:
                    sent = posted.get(schedule.message_key(action))
                    if sent is None:
                        break  # blocked until the peer posts the send
                    end = max(start, sent + comm_cost)
                timeline.events[stage].append(Event(action, start, end))
                clocks[stage] = end
                positions[stage] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = ", ".join(f"stage {s} at {actions[positions[s]]}"
                              for s, actions in enumerate(schedule.stages)
                              if positions[s] < len(actions))
            raise ParaxisError(f"schedule deadlocks: {stuck} wait for sends that never come; "
                               "post each send before the recv that waits on its peer")
    return timeline
