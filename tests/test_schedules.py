"""Schedules as data: the generators are complete and deadlock-free, corruptions are caught,
and the simulated bubble and memory match the published figures."""

import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paraxis.show.viz.text_timeline import render_timeline
from paraxis.spec.errors import ParaxisError
from paraxis.spec.schedules import Action, Schedule, build_schedule, simulate, validate

CASES = [(kind, p, m, v)
         for p in (1, 2, 3, 4, 8) for m in (1, 2, 3, 4, 8, 12, 16)
         for kind, v in (("gpipe", 1), ("1f1b", 1), ("interleaved", 1), ("interleaved", 2),
                         ("interleaved", 3), ("interleaved", 4))
         if kind != "interleaved" or m % p == 0]


@pytest.mark.parametrize("kind,p,m,v", CASES)
def test_generators_are_valid_and_bubble_matches_the_papers(kind, p, m, v):
    schedule = validate(build_schedule(kind, p, m, v))
    for forward, backward in ((1.0, 1.0), (1.0, 2.0)):
        # GPipe/1F1B: (P-1)/(M+P-1) of the timeline (Huang et al. 2019); interleaved: the
        # bubble over ideal time is (P-1)/(v*M) (Narayanan et al. 2021, sec. 2.2), which as a
        # share of the timeline is (P-1)/(v*M+P-1).
        assert schedule.bubble_fraction(forward, backward) == pytest.approx(
            (p - 1) / (v * m + p - 1))
        assert schedule.bubble_ratio(forward, backward) == pytest.approx((p - 1) / (v * m))


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 2), (3, 16), (8, 8)])
def test_peak_in_flight(p, m):
    assert build_schedule("gpipe", p, m).peak_in_flight() == [m] * p
    one_f_one_b = build_schedule("1f1b", p, m).peak_in_flight()
    assert one_f_one_b[0] == min(p, m)
    assert one_f_one_b == [min(p - s, m) for s in range(p)]


def test_interleaved_holds_more_chunks_but_each_is_smaller():
    # Megatron's warm-up: (P-s-1)*2 + (v-1)*P forwards, plus the first steady one.
    peaks = build_schedule("interleaved", 4, 8, 2).peak_in_flight()
    assert peaks == [(4 - s - 1) * 2 + 4 + 1 for s in range(4)]


def test_one_f_one_b_order_on_four_stages():
    schedule = build_schedule("1f1b", 4, 8)
    order = [str(a) for a in schedule.compute_order(0)]
    assert order == ["F0", "F1", "F2", "F3", "B0", "F4", "B1", "F5", "B2", "F6", "B3", "F7",
                     "B4", "B5", "B6", "B7"]
    last = [str(a) for a in schedule.compute_order(3)]
    assert last[:4] == ["F0", "B0", "F1", "B1"]


def test_render_shows_one_row_per_stage():
    text = render_timeline(build_schedule("gpipe", 2, 2).simulate(1, 1))
    assert text.splitlines() == ["stage 0 | F0 F1 .  .  B0 B1", "stage 1 | .  F0 F1 B0 B1 ."]


@pytest.mark.parametrize("kind, costs, scale", [
    ("1f1b", (2, 3), None), ("gpipe", (1, 1.5), None), ("1f1b", (1, 2), (1, 1, 1.5)),
    ("interleaved", (0.1, 0.3), None)])
def test_render_draws_every_action_at_its_cost(kind, costs, scale):
    """A cell is a common divisor of the costs: each action fills cost / cell cells (a cell
    of the shortest cost once rounded 1.5 cells to 1 or 2 and let B1 overwrite F3)."""
    chunks = 2 if kind == "interleaved" else 1
    schedule = build_schedule(kind, 3, 6, chunks)
    scale = scale or (1, 1, 1)
    timeline = schedule.simulate([costs[0] * f for f in scale], [costs[1] * f for f in scale])
    rows = render_timeline(timeline).splitlines()
    assert len(rows) == 3  # no line about hidden actions
    for stage, row in zip(timeline.events, rows, strict=True):
        cells = row.split("|")[1].split()
        computes = [e for e in stage if e.action.kind in "FB"]
        shortest = min(computes, key=lambda e: e.end - e.start)
        cell = (shortest.end - shortest.start) / cells.count(_label_of(shortest, chunks))
        for event in computes:
            assert cells.count(_label_of(event, chunks)) == round((event.end - event.start)
                                                                  / cell)


def test_simulation_visits_each_action_once(monkeypatch):
    """A stage blocked on a message wakes when it is posted: a deep pipeline once took a
    pass over every stage per stage of its backward chain (P^2: 100,000 stages ran for
    hours)."""
    from paraxis.spec.schedules import core

    schedule = build_schedule("1f1b", 500, 2)
    calls = []
    counted = core.input_message
    monkeypatch.setattr(core, "input_message",
                        lambda schedule, action: calls.append(action) or counted(schedule,
                                                                                 action))
    timeline = schedule.simulate()
    computes = sum(a.kind in "FB" for actions in schedule.stages for a in actions)
    assert len(calls) <= 2 * computes  # at most one blocked visit besides the one that runs
    assert timeline.makespan == 3 * (500 + 2 - 1)  # (p + m - 1) slots of F + B


def _label_of(event, chunks: int) -> str:
    return f"{event.action.kind}{event.action.microbatch}" + (
        "ab"[event.action.chunk] if chunks > 1 else "")


# ------------------------------------------------------------------ corrupted schedules


def _corrupt(schedule: Schedule, stage: int, new_actions: list[Action]) -> Schedule:
    stages = [list(a) for a in schedule.stages]
    stages[stage] = new_actions
    return dataclasses.replace(schedule, stages=stages)


@pytest.mark.parametrize("kind,p,m,v", [c for c in CASES if c[1] > 1][::3])
def test_validator_rejects_drop_swap_and_reorder(kind, p, m, v):
    schedule = build_schedule(kind, p, m, v)
    rng = random.Random(f"{kind}{p}{m}{v}")
    for _ in range(5):
        stage = rng.randrange(p)
        actions = schedule.stages[stage]
        # drop any action: a compute goes missing, or a message loses one end
        dropped = list(actions)
        del dropped[rng.randrange(len(dropped))]
        with pytest.raises(ParaxisError):
            validate(_corrupt(schedule, stage, dropped))
        # swap a forward with its own backward
        microbatch, chunk = rng.randrange(m), rng.randrange(v)
        f = actions.index(Action("F", stage, microbatch, chunk))
        b = actions.index(Action("B", stage, microbatch, chunk))
        swapped = list(actions)
        swapped[f], swapped[b] = swapped[b], swapped[f]
        with pytest.raises(ParaxisError):
            validate(_corrupt(schedule, stage, swapped))
        # reorder: move a recv after the compute that needs it
        recvs = [i for i, a in enumerate(actions) if a.kind == "recv"]
        if recvs:
            i = rng.choice(recvs)
            recv = actions[i]
            needs = Action("F" if recv.tensor == "act" else "B", stage, recv.microbatch,
                           recv.chunk)
            moved = list(actions)
            moved.insert(actions.index(needs), moved.pop(i))  # lands just after it
            with pytest.raises(ParaxisError, match="no earlier recv"):
                validate(_corrupt(schedule, stage, moved))


def test_validator_finds_a_deadlock():
    # Stage 0 holds back the activation of microbatch 0 until the very end, but waits for
    # that microbatch's gradient before: each stage waits for the other forever.
    schedule = build_schedule("1f1b", 2, 4)
    actions = list(schedule.stages[0])
    send = actions.index(Action("send", 0, 0, 0, "act", 1))
    actions.append(actions.pop(send))
    with pytest.raises(ParaxisError, match="deadlocks"):
        validate(_corrupt(schedule, 0, actions))


def test_validator_rejects_a_wrong_peer_and_a_duplicate():
    schedule = build_schedule("gpipe", 3, 2)
    actions = list(schedule.stages[1])
    i = next(i for i, a in enumerate(actions) if a.kind == "send")
    actions[i] = dataclasses.replace(actions[i], peer=0)
    with pytest.raises(ParaxisError, match="talks to stage 0"):
        validate(_corrupt(schedule, 1, actions))
    doubled = list(schedule.stages[2]) + [Action("F", 2, 0, 0)]
    with pytest.raises(ParaxisError, match="runs twice"):
        validate(_corrupt(schedule, 2, doubled))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.integers(1, 5), st.integers(1, 3),
       st.sampled_from(["gpipe", "1f1b", "interleaved"]))
def test_any_shape_validates_and_every_send_is_received(p, groups, v, kind):
    m = p * groups
    v = v if kind == "interleaved" else 1
    schedule = validate(build_schedule(kind, p, m, v))
    timeline = simulate(schedule, 1.0, 2.0, comm_cost=0.25)
    # communication can only stretch the timeline
    assert timeline.makespan >= schedule.simulate().makespan
    sends = sorted(schedule.message_key(a) for s in schedule.stages for a in s
                   if a.kind == "send")
    recvs = sorted(schedule.message_key(a) for s in schedule.stages for a in s
                   if a.kind == "recv")
    assert sends == recvs and len(set(sends)) == len(sends)


@pytest.mark.parametrize("args,message", [
    (("interleaved", 4, 6, 2), "multiple of stages"),
    (("1f1b", 4, 8, 2), "needs the interleaved schedule"),
    (("zb", 4, 8, 1), "unknown schedule"),
    (("gpipe", 0, 8, 1), "must be a positive integer"),
])
def test_bad_input_is_one_line(args, message):
    with pytest.raises(ParaxisError, match=message) as error:
        build_schedule(*args)
    assert "\n" not in str(error.value)


def test_schedule_command_prints_timeline_bubble_and_memory():
    import json
    import subprocess
    import sys

    def paraxis(*args):
        return subprocess.run([sys.executable, "-m", "paraxis", "schedule", *args],
                              capture_output=True, text=True, timeout=60)

    text = paraxis("--kind", "1f1b", "--stages", "4", "--microbatches", "8")
    assert text.returncode == 0
    assert "stage 3 | .  .  .  F0 B0 B0 F1" in text.stdout
    assert "bubble fraction: 27.3%" in text.stdout and "[4, 3, 2, 1]" in text.stdout
    data = json.loads(paraxis("--kind", "interleaved", "--stages", "2", "--microbatches", "4",
                              "--virtual", "2", "--json").stdout)
    assert data["bubble_fraction"] == pytest.approx(1 / 9)
    assert len(data["events"]) == 2 and data["peak_in_flight"][1] == 3
    # --kind interleaved alone runs 2 chunks per stage (1 would be plain 1F1B, 27.3% above)
    interleaved = paraxis("--kind", "interleaved", "--stages", "4", "--microbatches", "8")
    assert interleaved.returncode == 0 and "2 chunks per stage" in interleaved.stdout
    bubble = float(interleaved.stdout.split("bubble fraction: ")[1].split("%")[0])
    assert bubble < 27.3
    bad = paraxis("--kind", "interleaved", "--stages", "4", "--microbatches", "6",
                  "--virtual", "2")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
