"""The generators: each schedule kind's compute order per stage, then the messages around it.

    build_schedule("1f1b", stages=4, microbatches=8)
    build_schedule("interleaved", stages=4, microbatches=8, virtual=2)
    build_schedule("zb-h1", stages=4, microbatches=8)      # split backward, zero_bubble.py
    build_schedule("zb-v", stages=4, microbatches=8)       # two chunks per stage, in a V

A generator writes only the order of computes (F, B and, when backward is split, W); the
sends and receives are placed around them by `_with_communication`, the same way for every
kind, so a new schedule is a new order and nothing else.
"""

from __future__ import annotations

from bisect import bisect_left

from paraxis.spec.errors import ParaxisError
from paraxis.spec.schedules.core import (
    COMPUTE,
    Action,
    Schedule,
    held_moments,
    held_peak,
    simulate,
)
from paraxis.spec.schedules.zero_bubble import zero_bubble_order

KINDS = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-v")
# Chunks per stage a kind always uses (the V folds the model twice over the stages).
FIXED_VIRTUAL = {"zb-v": 2}
SPLIT_BACKWARD = ("zb-h1", "zb-v")  # kinds whose backward runs as B then W


def w_reads_weights(style: str, recompute: str) -> bool:
    """Whether a split backward's W reads its chunk's weights (so ZeRO-3 gathers them
    again for it): full recompute reruns the chunk's forward there, and a LayerNorm's
    backward (GPT-2 style's norms: `native_layer_norm_backward`) reads its weight even for
    the weight gradient alone; an RMSNorm's does not."""
    return recompute == "full" or style == "gpt2"


def placement_of(kind: str) -> str:
    """How a kind places its chunks on stages (`core.virtual_stage_of`): the V for zb-v,
    Megatron's loop otherwise."""
    return "v" if kind == "zb-v" else "loop"


def check_compile(kind: str, compile: bool) -> None:
    """A compiled block's backward is one fused graph computing input and weight gradients
    together, so a split W would run it again; PyTorch's zero-bubble schedules refuse
    compiled stages for the same reason."""
    if compile and kind in SPLIT_BACKWARD:
        raise ParaxisError(f"--compile cannot run schedule={kind}: its backward is split in B "
                           "and W, and a compiled block computes both at once; drop --compile "
                           "or use schedule=1f1b")

Order = list[tuple[str, int, int]]  # (kind, microbatch, chunk) computes of one stage


def build_schedule(kind: str, stages: int, microbatches: int, virtual: int = 1) -> Schedule:
    """The per-stage action lists of one training step."""
    for name, value in (("stages", stages), ("microbatches", microbatches),
                        ("virtual", virtual)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ParaxisError(f"schedule {name}={value!r} must be a positive integer")
    if kind not in KINDS:
        raise ParaxisError(f"unknown schedule {kind!r}; use one of {', '.join(KINDS)}")
    if kind in FIXED_VIRTUAL:
        if virtual not in (1, FIXED_VIRTUAL[kind]):
            raise ParaxisError(f"schedule {kind} runs {FIXED_VIRTUAL[kind]} chunks per stage, "
                               f"not virtual={virtual}; drop virtual")
        virtual = FIXED_VIRTUAL[kind]
    elif virtual > 1 and kind != "interleaved":
        raise ParaxisError(f"virtual={virtual} needs the interleaved schedule; use --kind "
                           "interleaved or virtual=1")
    if kind == "interleaved" and microbatches % stages:
        # Megatron's interleaved order walks microbatches in groups of P (sec. 2.2).
        raise ParaxisError(f"interleaved schedule needs microbatches ({microbatches}) to be a "
                           f"multiple of stages ({stages}); use microbatches="
                           f"{-(-microbatches // stages) * stages}")
    schedule = Schedule(kind, stages, microbatches, virtual, [], placement_of(kind))
    schedule.stages = _with_communication(schedule, _orders(schedule))
    return schedule


def _orders(schedule: Schedule) -> list[Order]:
    """Each stage's compute order (F, B and, split, W of every microbatch and chunk)."""
    if schedule.kind in SPLIT_BACKWARD:
        return zero_bubble_order(schedule)
    stages, microbatches, virtual = (schedule.num_stages, schedule.microbatches,
                                     schedule.virtual)
    return [_gpipe(microbatches) if schedule.kind == "gpipe"
            else _one_f_one_b(stage, stages, microbatches) if virtual == 1
            else _interleaved(stage, stages, microbatches, virtual)
            for stage in range(stages)]


def peak_held(kind: str, stages: int, microbatches: int, virtual: int,
              weights: list[list[float]]) -> list[float]:
    """Per stage, the most of `weights[stage][chunk]` summed over the (microbatch, chunk)
    activation sets held at once, from a forward until the backward that frees them (W
    where the backward is split): `Schedule.peak_in_flight` with each set weighed by its
    chunk, a stage's chunks need not be equal. From the compute orders alone (no messages:
    a layout search asks for it). `virtual` as `build_schedule` takes it."""
    if kind in FIXED_VIRTUAL:
        virtual = FIXED_VIRTUAL[kind]
    schedule = Schedule(kind, stages, microbatches, virtual, [], placement_of(kind))
    release = "W" if kind in SPLIT_BACKWARD else "B"  # `schedule` holds no actions yet
    return [held_peak(((action, chunk) for action, _, chunk in order), weights[stage], release)
            for stage, order in enumerate(_orders(schedule))]


def pending_moments(kind: str, stages: int, microbatches: int
                    ) -> list[tuple[tuple[int, ...], ...]]:
    """Per stage of a split-backward kind, its moments of most memory (`core.held_moments`:
    per chunk, the activation sets held and the sets whose B has kept gradients for their
    W), from the compute orders alone."""
    if kind not in SPLIT_BACKWARD:
        raise ParaxisError(f"schedule {kind} does not split its backward; only "
                           f"{', '.join(SPLIT_BACKWARD)} keep gradients for W")
    virtual = FIXED_VIRTUAL.get(kind, 1)
    schedule = Schedule(kind, stages, microbatches, virtual, [], placement_of(kind))
    return [held_moments(((action, chunk) for action, _, chunk in order), virtual)
            for order in _orders(schedule)]


def _gpipe(microbatches: int) -> Order:
    # All forwards, then all backwards (Huang et al. 2019): every activation is held at once.
    return ([("F", m, 0) for m in range(microbatches)]
            + [("B", m, 0) for m in range(microbatches)])


def _one_f_one_b(stage: int, stages: int, microbatches: int) -> Order:
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


def _interleaved(stage: int, stages: int, microbatches: int, virtual: int) -> Order:
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


def _with_communication(schedule: Schedule, orders: list[Order]) -> list[list[Action]]:
    """Each stage's computes with the messages between them, posted so that NCCL can run them.

    NCCL matches the messages between two ranks in the order they were posted (no tags), and
    a send does not complete until its peer posts the receive. So the order is taken from
    time: the compute orders are first run against a clock (each recv just before the
    compute that needs it, gloo's semantics), then every send goes right after the compute
    that produced it and every recv to the first gap between computes that starts after the
    send was posted (at the latest, just before the compute that needs it). Both ends of a
    pair then post in send order, and the sends and receives that meet at one gap form one
    group (`dist.batch_isend_irecv`), which completes as a whole: `validate` proves it.
    """
    naive = Schedule(schedule.kind, schedule.num_stages, schedule.microbatches,
                     schedule.virtual, [_around(schedule, stage, order)
                                        for stage, order in enumerate(orders)],
                     schedule.placement)
    timeline = simulate(naive)
    sent_at = {schedule.message_key(e.action): e.start for events in timeline.events
               for e in events if e.action.kind == "send"}
    stages = []
    for events in timeline.events:
        computes = [e for e in events if e.action.kind in COMPUTE]
        starts = [e.start for e in computes]
        gaps: list[list[tuple[float, int, Action]]] = [[] for _ in range(len(computes) + 1)]
        index = -1
        for e in events:
            if e.action.kind in COMPUTE:
                index += 1
            elif e.action.kind == "send":  # right after its compute
                gaps[index + 1].append((-1.0, len(gaps[index + 1]), e.action))
            else:  # the first gap after the send, before the compute that needs it
                sent = sent_at[schedule.message_key(e.action)]
                gap = bisect_left(starts, sent, 0, index + 1)  # computes start in order
                gaps[gap].append((sent, len(gaps[gap]), e.action))
        actions = []
        for j, gap in enumerate(gaps):
            actions += [action for _, _, action in sorted(gap)]  # sends, then recvs in time
            if j < len(computes):
                actions.append(computes[j].action)
        stages.append(actions)
    return stages


def _around(schedule: Schedule, stage: int, order: Order) -> list[Action]:
    """The recv a compute needs just before it and the send it produces just after it
    (W needs nothing from another stage and feeds none)."""
    last = schedule.num_virtual_stages - 1
    actions: list[Action] = []
    for kind, microbatch, chunk in order:
        if kind == "W":
            actions.append(Action(kind, stage, microbatch, chunk))
            continue
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
                    schedule.virtual, stages, schedule.placement)
