"""Pipeline schedules as data: who runs which forward/backward, in which order, and what they
send to whom. Pure Python (no torch): the planner, the pictures and the runtime share it.

    schedule = build_schedule("1f1b", stages=4, microbatches=8)
    validate(schedule)                       # complete and deadlock-free, or ParaxisError
    schedule.bubble_fraction()               # idle share of the simulated timeline
    schedule.peak_in_flight()                # activations held per stage (memory)

Vocabulary. A *stage* is one pipeline rank. With the interleaved schedule a stage holds `v`
model *chunks*; chunk `c` of stage `s` is *virtual stage* `c * P + s` (Narayanan et al. 2021,
sec. 2.2), so activations flow s -> s+1 inside a chunk and from the last stage back to stage
0 between chunks; zb-v folds two chunks in a V instead (`core.virtual_stage_of`). An
`Action` is one of

    F        forward of `microbatch` on local `chunk`
    B        backward: with W in the schedule, only the gradient of the chunk's input (what
             the previous stage waits for); without, the whole backward
    W        the weight gradients of a split backward (`zero_bubble.py`)
    send     ship this stage's output activation ("act") or input gradient ("grad") to `peer`
    recv     receive the activation / gradient that the next F / B of this chunk needs

Communication semantics. `simulate` models gloo: a send is posted asynchronously (isend:
the sender goes on at once), a recv blocks until the matching send has been posted.
`validate` also proves the order safe for NCCL, where a send waits for its matching recv, a
group of consecutive sends and receives completes as a whole, and a pair of ranks matches
its messages in the order they were posted. Messages are keyed by `message_key` (tensor,
microbatch, destination virtual stage), and the executor tags them the same way.

Modules: `core` (actions, placement, costs, the clock), `build` (the generators),
`zero_bubble` (split-backward generators), `validate` (the proofs).
"""

from paraxis.spec.schedules.build import (
    FIXED_VIRTUAL,
    KINDS,
    SPLIT_BACKWARD,
    build_schedule,
    check_compile,
    forward_only,
    peak_held,
    pending_moments,
    placement_of,
    w_reads_weights,
)
from paraxis.spec.schedules.core import (
    COMPUTE,
    Action,
    Costs,
    Event,
    Schedule,
    Timeline,
    head_stage,
    input_message,
    place_of,
    simulate,
    stage_costs,
    virtual_stage_of,
)
from paraxis.spec.schedules.validate import validate

__all__ = ["COMPUTE", "FIXED_VIRTUAL", "KINDS", "SPLIT_BACKWARD", "Action", "Costs", "Event",
           "Schedule", "Timeline", "build_schedule", "check_compile", "forward_only",
           "head_stage", "input_message", "peak_held", "pending_moments", "place_of",
           "placement_of", "simulate", "stage_costs", "validate", "virtual_stage_of",
           "w_reads_weights"]
