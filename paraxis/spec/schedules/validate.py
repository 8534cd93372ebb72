"""Prove a schedule complete and deadlock-free, or say in one line what is wrong with it."""

from __future__ import annotations

from paraxis.spec.errors import ParaxisError
from paraxis.spec.schedules.check import check_communication
from paraxis.spec.schedules.core import COMPUTE, Action, Schedule, simulate


def validate(schedule: Schedule) -> Schedule:
    """Prove the schedule complete and deadlock-free; return it, or raise ParaxisError.

    Complete: every stage runs F and B (and W, when backward is split) of each (microbatch,
    chunk) exactly once, F before B before W; every compute that needs a tensor from another
    stage receives it first, every one that feeds another stage sends it, and every send has
    exactly one recv. Deadlock-free twice over: the blocking-recv / async-send simulation
    (gloo) runs every action, and so does NCCL's stricter one, where sends block too and each
    pair of stages matches messages in posting order (`check.check_communication`).
    """
    if len(schedule.stages) != schedule.num_stages:
        raise ParaxisError(f"schedule has {len(schedule.stages)} action lists for "
                           f"{schedule.num_stages} stages; regenerate it with build_schedule")
    work = ("F", "B", "W") if schedule.split_backward else ("F", "B")
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
            if action.kind in COMPUTE:
                _check_compute(schedule, action, where, done, received)
                done.add((action.kind, action.microbatch, action.chunk))
            elif action.kind in ("send", "recv"):
                message = _check_message(schedule, action, where, done)
                (sends if action.kind == "send" else recvs)[message] = (
                    (sends if action.kind == "send" else recvs).get(message, 0) + 1)
                if action.kind == "recv":
                    received.add(message)
            else:
                raise ParaxisError(f"{where} has unknown kind {action.kind!r}; use F, B, W, "
                                   "send or recv")
        expected = {(k, m, c) for k in work for m in range(schedule.microbatches)
                    for c in range(schedule.virtual)}
        missing = sorted(expected - done)
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
    check_communication(schedule)
    return schedule


def _check_compute(schedule: Schedule, action: Action, where: str,
                   done: set[tuple[str, int, int]], received: set[tuple]) -> None:
    key = (action.kind, action.microbatch, action.chunk)
    if key in done:
        raise ParaxisError(f"{where} runs twice; each F, B and W runs once per step")
    before = {"B": "F", "W": "B"}.get(action.kind)
    if before and (before, action.microbatch, action.chunk) not in done:
        raise ParaxisError(f"{where} comes before its {before}; move it after "
                           f"{before}{action.microbatch}")
    if action.kind == "W":
        return  # weight gradients need nothing from another stage
    here = schedule.virtual_stage(action.stage, action.chunk)
    source = here - 1 if action.kind == "F" else here + 1
    if not 0 <= source < schedule.num_virtual_stages:
        return
    src_stage, src_chunk = schedule.place(source)
    if src_stage == action.stage:
        if (action.kind, action.microbatch, src_chunk) not in done:
            raise ParaxisError(f"{where} runs before the local compute that feeds it; "
                               "reorder the chunks")
    else:
        tensor = "act" if action.kind == "F" else "grad"
        if (tensor, action.microbatch, here) not in received:
            raise ParaxisError(f"{where} has no earlier recv of its input; add "
                               f"recv_{tensor} before it")


def _check_message(schedule: Schedule, action: Action, where: str,
                   done: set[tuple[str, int, int]]) -> tuple:
    if action.tensor not in ("act", "grad") or action.peer is None:
        raise ParaxisError(f"{where} needs tensor act/grad and a peer stage")
    message = schedule.message_key(action)
    destination = message[2]
    if not 0 <= destination < schedule.num_virtual_stages:
        raise ParaxisError(f"{where} addresses a virtual stage outside the model")
    here = schedule.virtual_stage(action.stage, action.chunk)
    if action.kind == "send":
        producer = ("F" if action.tensor == "act" else "B", action.microbatch, action.chunk)
        if producer not in done:
            raise ParaxisError(f"{where} sends before computing; move it after "
                               f"{producer[0]}{producer[1]}")
        expected = schedule.place(destination)[0]
    else:
        expected = schedule.place(here - 1 if action.tensor == "act" else here + 1)[0]
    if action.peer != expected:
        raise ParaxisError(f"{where} talks to stage {action.peer} but the tensor belongs to "
                           f"stage {expected}")
    return message
