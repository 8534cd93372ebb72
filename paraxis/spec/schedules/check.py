"""Will NCCL run this schedule to the end? Two checks beyond `validate`'s completeness.

`validate` simulates gloo's contract: a send is posted and forgotten, only a recv waits. NCCL
promises less, and the executor posts more at once:

- The executor posts each maximal run of consecutive send/recv actions as one
  `dist.batch_isend_irecv` group. On NCCL "point-to-point calls within a group will be
  blocking until that group of calls completes" (NCCL user guide, Point-to-point
  communication): the group is one kernel on the communication stream, it ends only when
  every op in it has met its peer's matching op, and the next group queues behind it. A send
  therefore holds its stage until the peer has posted the recv, unless the two are posted in
  one group ("merge calls that need to progress concurrently to avoid deadlocks", ibid.).
- NCCL has no tags: between two ranks it pairs the k-th send with the k-th recv (calls to
  one peer "are executed in order", ibid.). A schedule whose messages match by tag
  (`message_key`, what gloo does) can still cross its wires on NCCL.

    check_pair_order(schedule)   # each pair posts its messages in the same order on both sides
    check_blocking(schedule)     # no stage waits forever when sends block (NCCL)
    check_blocking(schedule, sends_block=False)   # gloo's contract: only recvs wait
    check_communication(schedule)                 # both NCCL checks

Both checks read only the send/recv actions and `schedule.message_key`: any other action kind
("F", "B", "W", ...) is local compute that never waits (though it parts two groups). Both run
in time linear in the number of actions: each op is looked at a fixed number of times, so a
step of P=64 stages and M=512 microbatches (some 10^5 actions) takes about as long as
`validate`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from paraxis.spec.errors import ParaxisError
from paraxis.spec.schedules.core import Action, Schedule

COMMUNICATION = ("send", "recv")
_SHOWN_STAGES = 6  # a deadlock message details this many stuck stages, then counts the rest


def check_communication(schedule: Schedule) -> None:
    """Both NCCL checks: messages paired in order, and no deadlock when sends block."""
    check_pair_order(schedule)
    check_blocking(schedule, sends_block=True)


# ------------------------------------------------------------------------- pair order


def check_pair_order(schedule: Schedule) -> None:
    """For every ordered pair (sender a, receiver b), a's sends to b and b's recvs from a name
    the same messages in the same order; else ParaxisError at the first difference."""
    sent: dict[tuple[int, int], list[tuple[int, Action]]] = {}
    received: dict[tuple[int, int], list[tuple[int, Action]]] = {}
    for stage, actions in enumerate(schedule.stages):
        for position, action in enumerate(actions):
            if action.kind == "send":
                sent.setdefault((stage, action.peer), []).append((position, action))
            elif action.kind == "recv":
                received.setdefault((action.peer, stage), []).append((position, action))
    for sender, receiver in sorted(set(sent) | set(received), key=_pair_sort_key):
        sends = sent.get((sender, receiver), [])
        recvs = received.get((sender, receiver), [])
        for index in range(max(len(sends), len(recvs))):
            send = _described(schedule, sends[index]) if index < len(sends) else None
            recv = _described(schedule, recvs[index]) if index < len(recvs) else None
            if send is None or recv is None or send[1] != recv[1]:
                raise ParaxisError(
                    f"stages {sender} -> {receiver} post their messages in different orders: "
                    f"message {index} of the pair is {send[0] if send else 'nothing'} on "
                    f"stage {sender} but {recv[0] if recv else 'nothing'} on stage "
                    f"{receiver}; NCCL pairs a send with the recv posted in the same place, "
                    f"not by tag: post stage {receiver}'s recvs in the order stage {sender} "
                    "sends them")


def _pair_sort_key(pair: tuple[int | None, int | None]) -> tuple[int, int]:
    return (-1 if pair[0] is None else pair[0], -1 if pair[1] is None else pair[1])


def _described(schedule: Schedule, entry: tuple[int, Action]) -> tuple[str, tuple]:
    position, action = entry
    key = schedule.message_key(action)
    return f"{action} (action {position}, key {key})", key


# ------------------------------------------------------------------ blocking simulation


@dataclass(eq=False)  # compared and hashed by identity: fast, and each op is one object
class _Op:
    """One send or recv as posted: which stage, which group of that stage, where."""

    stage: int
    group: int  # index among the stage's groups (maximal runs of send/recv actions)
    position: int  # index in the stage's action list
    action: Action
    key: tuple


def check_blocking(schedule: Schedule, sends_block: bool = True) -> None:
    """Run every stage's groups of posted send/recv ops and prove each stage reaches its end.

    A group is posted when its stage reaches it and completes when each of its waiting ops is
    matched, that is when the peer has posted the op with the same `message_key` (the peer is
    at the group holding it, or past it). A recv always waits; a send waits too when
    `sends_block` (NCCL), never otherwise (gloo: the send is only waited for at step end).
    Compute between groups never waits. Raises ParaxisError naming each stuck stage.

    Each op is looked at a fixed number of times: when its stage posts its group, and when
    its partner is posted (a counter of unmatched ops per waiting stage), so the simulation is
    linear in the number of actions.
    """
    groups = _groups(schedule)
    partner = _partners(groups)
    reached = [-1] * len(groups)  # the group each stage has posted last (len: finished)
    unmatched = [0] * len(groups)  # waiting ops of that group whose partner is not posted
    ready = deque(range(len(groups)))  # stages whose current group is complete

    def waits(op: _Op) -> bool:
        return sends_block or op.action.kind == "recv"

    while ready:
        stage = ready.popleft()
        group = reached[stage] + 1
        reached[stage] = group
        if group == len(groups[stage]):
            continue  # the stage ran its last action
        count = 0
        for op in groups[stage][group]:
            other = partner[op]
            if other.stage == stage:  # a message to itself: matched if posted by now
                count += waits(op) and other.group > group
            elif reached[other.stage] < other.group:
                count += waits(op)  # the peer has yet to post it
            elif reached[other.stage] == other.group and waits(other):
                # the peer waits in that very group, and this op was what it lacked
                unmatched[other.stage] -= 1
                if unmatched[other.stage] == 0:
                    ready.append(other.stage)
        unmatched[stage] = count
        if count == 0:
            ready.append(stage)
    stuck = [stage for stage in range(len(groups)) if reached[stage] < len(groups[stage])]
    if stuck:
        raise ParaxisError(_deadlock_message(groups, partner, reached, stuck, waits,
                                             sends_block))


def _groups(schedule: Schedule) -> list[list[list[_Op]]]:
    """Per stage, its maximal runs of consecutive send/recv actions: what the executor posts
    with one batch_isend_irecv each."""
    per_stage: list[list[list[_Op]]] = []
    for stage, actions in enumerate(schedule.stages):
        groups: list[list[_Op]] = []
        previous = None
        for position, action in enumerate(actions):
            if action.kind in COMMUNICATION:
                if previous not in COMMUNICATION:
                    groups.append([])
                groups[-1].append(_Op(stage, len(groups) - 1, position, action,
                                      schedule.message_key(action)))
            previous = action.kind
        per_stage.append(groups)
    return per_stage


def _partners(groups: list[list[list[_Op]]]) -> dict[_Op, _Op]:
    """Each op's matching op on the other side; ParaxisError where a message has no other
    side, two of one side, or an end that names the wrong peer."""
    ends: dict[tuple[str, tuple], _Op] = {}
    for stage_groups in groups:
        for group in stage_groups:
            for op in group:
                twin = ends.setdefault((op.action.kind, op.key), op)
                if twin is not op:
                    raise ParaxisError(
                        f"message {op.key} has two {op.action.kind}s (stage {twin.stage} "
                        f"action {twin.position} and stage {op.stage} action {op.position}); "
                        "post each message once on each side")
    partner: dict[_Op, _Op] = {}
    for (kind, key), op in ends.items():
        other = ends.get(("recv" if kind == "send" else "send", key))
        if other is None:
            missing = "recv" if kind == "send" else "send"
            raise ParaxisError(
                f"stage {op.stage} action {op.position} ({op.action}) has no matching "
                f"{missing} (message {key}); add it on stage {op.action.peer}")
        if op.action.peer != other.stage:
            raise ParaxisError(
                f"stage {op.stage} action {op.position} ({op.action}) names peer "
                f"{op.action.peer} but its {other.action.kind} is on stage {other.stage}; "
                f"set its peer to {other.stage}")
        partner[op] = other
    return partner


def _deadlock_message(groups: list[list[list[_Op]]], partner: dict[_Op, _Op],
                      reached: list[int], stuck: list[int], waits: Callable[[_Op], bool],
                      sends_block: bool) -> str:
    """One line: each stuck stage, where it waits and on which op of which peer."""
    details = []
    blocked_sends = False
    for stage in stuck[:_SHOWN_STAGES]:
        group = groups[stage][reached[stage]]
        lacking = [op for op in group if waits(op)
                   and reached[partner[op].stage] < partner[op].group]
        blocked_sends |= any(op.action.kind == "send" for op in lacking)
        posted = ", ".join(str(op.action) for op in group)
        needs = ", ".join(
            f"{partner[op].action} (stage {partner[op].stage} action "
            f"{partner[op].position})" for op in lacking)
        details.append(f"stage {stage} waits in group [{posted}] (from action "
                       f"{group[0].position}) for {needs}")
    if len(stuck) > _SHOWN_STAGES:
        rest = ", ".join(str(stage) for stage in stuck[_SHOWN_STAGES:])
        details.append(f"stages {rest} are stuck too")
    if blocked_sends:
        hint = ("a send completes only when its peer posts the recv (NCCL): post each send "
                "in one group with the recv its stage waits on next (adjacent send/recv "
                "actions), or swap the order on one side")
    else:
        hint = "post each send before the recv that waits on its peer"
    semantics = "sends block, as on NCCL" if sends_block else "sends never block"
    return f"schedule deadlocks ({semantics}): {'; '.join(details)}; {hint}"
