"""Zero-bubble schedules: backward split in two, and the weight half fills the idle slots.

A backward pass does two jobs: B, the gradient of the stage's input, which the previous
stage is waiting for, and W, the gradients of the stage's weights, which nobody waits for
until the optimizer step. Run separately, B stays on the critical path and W can be moved
into the slots where 1F1B would sit idle (Qi et al. 2023, "Zero Bubble Pipeline
Parallelism"). The price is memory: a microbatch's saved activations stay until its W.

- **zb-h1** (the paper's handcrafted schedule; PyTorch's ScheduleInterleavedZeroBubble with
  one chunk per stage): 1F1B's order with each backward split, stage s running its W's s
  microbatches late. Those late W's fill the ends of the step, where 1F1B waits: each
  stage's idle time falls from (P-1)(F+B+W) to (P-1)(F+B-W), a third at F = B = W. Every
  stage then holds up to P microbatches, 1F1B's most (its stage 0's).
- **zb-v** (Qi et al. 2024, "Pipeline Parallelism with Controllable Memory", sec. 6;
  PyTorch's ScheduleZBVZeroBubble): two chunks per stage folded in a V (stage s runs virtual
  stages s and 2P-1-s, `core.virtual_stage_of`), so stage 0 both starts and ends the model
  and the first backward starts after one trip down and up. Each stage fills with
  2(P-s)-1 forwards down the V, alternates forwards of the two chunks while the first
  microbatches come back up, runs chunk 1 as F-B-W for P-s microbatches, then the steady
  state F-B-W on chunk 0 and on chunk 1 in turn; at the end its last B's go first and its
  W's fill the wait. Every stage holds up to 2P half-size chunk activations (P of the whole
  stage, 1F1B's most), balanced over the stages, and at F = B = W the bubble is half an F per
  stage boundary, whatever M.

The order comes out of the unit-time run once and is then plain data like any other
schedule: validated, simulated with real costs, executed and drawn.
"""

from __future__ import annotations

from paraxis.spec.schedules.core import Schedule

Order = list[tuple[str, int, int]]


def zero_bubble_order(schedule: Schedule) -> list[Order]:
    """Each stage's compute order (F, B, W of every microbatch and chunk)."""
    make = _v if schedule.placement == "v" else _h1
    return [make(stage, schedule.num_stages, schedule.microbatches)
            for stage in range(schedule.num_stages)]


def _h1(stage: int, stages: int, microbatches: int) -> Order:
    """1F1B with split backward; stage s starts its W's after its first s + 1 B's."""
    warmup = min(stages - stage - 1, microbatches)
    order: Order = [("F", m, 0) for m in range(warmup)]
    backwards = weights = 0

    def backward() -> None:
        nonlocal backwards, weights
        order.append(("B", backwards, 0))
        backwards += 1
        if backwards > stage:  # the W's run `stage` microbatches behind the B's
            order.append(("W", weights, 0))
            weights += 1

    for forward in range(warmup, microbatches):
        order.append(("F", forward, 0))
        backward()
    while backwards < microbatches:
        backward()
    return order + [("W", m, 0) for m in range(weights, microbatches)]


def _v(stage: int, stages: int, microbatches: int) -> Order:
    """zb-v's phases on one stage. The phases need 2P-1 microbatches to fill the V; with
    fewer, the order is written for 2P-1 and the missing microbatches' actions dropped."""
    filled = max(microbatches, 2 * stages - 1)
    order: Order = []
    count = {kind: [0, 0] for kind in ("F", "B", "W")}  # next microbatch per kind and chunk

    def run(kind: str, chunk: int) -> None:
        order.append((kind, count[kind][chunk], chunk))
        count[kind][chunk] += 1

    for _ in range(2 * (stages - stage) - 1):  # down the V
        run("F", 0)
    for _ in range(stage):  # the first microbatches come back up through chunk 1
        run("F", 1)
        run("F", 0)
    for _ in range(stages - stage):
        for kind in ("F", "B", "W"):
            run(kind, 1)
    while count["F"][1] < count["F"][0] or count["F"][0] < filled:  # steady state
        if count["F"][0] < filled:
            run("F", 0)
        for kind, chunk in (("B", 0), ("W", 0), ("F", 1), ("B", 1), ("W", 1)):
            run(kind, chunk)
    for _ in range(stage):  # the last B's first: the stages before this one wait for them
        run("B", 0)
        run("B", 1)
    for _ in range(stages - stage):
        run("B", 0)
        run("W", 0)
    for chunk in (1, 0):  # the W's held back fill the end
        while count["W"][chunk] < count["B"][chunk]:
            run("W", chunk)
    return [item for item in order if item[1] < microbatches]
