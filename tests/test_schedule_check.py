"""The NCCL checks: messages posted in the same order on both ends of each pair, and no stage
stuck when a send blocks until its peer posts the recv (a batch_isend_irecv group completes
as a whole). Generated schedules pass; hand-written ones that only tag-matching or only
non-blocking sends would save are caught."""

import time

import pytest

from paraxis.spec.errors import ParaxisError
from paraxis.spec.schedules import Action, Schedule, build_schedule
from paraxis.spec.schedules.check import check_blocking, check_communication, check_pair_order

CASES = [(kind, p, m, v)
         for p in (1, 2, 3, 4, 8) for m in (1, 2, 3, 4, 8, 12, 16)
         for kind, v in (("gpipe", 1), ("1f1b", 1), ("interleaved", 1), ("interleaved", 2),
                         ("interleaved", 3), ("interleaved", 4), ("zb-h1", 1), ("zb-v", 2))
         if kind != "interleaved" or m % p == 0]


def _handwritten(*rows: str, microbatches: int) -> Schedule:
    """One string per stage, v=1: F0 / B0 / W0 compute on microbatch 0; >a0 / >g0 send its
    activation to the next stage / its gradient to the previous one; <a0 / <g0 receive them."""
    stages = []
    for stage, row in enumerate(rows):
        actions = []
        for token in row.split():
            head = token[0]
            if head in "FBW":
                actions.append(Action(head, stage, int(token[1:])))
                continue
            tensor = "act" if token[1] == "a" else "grad"
            downstream = (head == ">") == (tensor == "act")  # act flows to s+1, grad to s-1
            actions.append(Action("send" if head == ">" else "recv", stage, int(token[2:]),
                                  0, tensor, stage + 1 if downstream else stage - 1))
        stages.append(actions)
    return Schedule("handwritten", len(rows), microbatches, 1, stages)


# ----------------------------------------------------------------- generated schedules


@pytest.mark.parametrize("kind,p,m,v", CASES)
def test_generated_schedules_post_each_pair_in_order_and_pass_gloo(kind, p, m, v):
    schedule = build_schedule(kind, p, m, v)
    check_pair_order(schedule)
    check_blocking(schedule, sends_block=False)


@pytest.mark.parametrize("kind,p,m,v", CASES)
def test_generated_schedules_do_not_deadlock_when_sends_block(kind, p, m, v):
    check_communication(build_schedule(kind, p, m, v))


def test_a_large_step_is_checked_in_linear_time():
    schedule = build_schedule("1f1b", 32, 256)  # 48k actions
    started = time.perf_counter()
    check_communication(schedule)
    # generous: about 0.3 s here, a quadratic scan would take minutes
    assert time.perf_counter() - started < 20


# ------------------------------------------------------------------- hand-written cases

# Stage 0 warms up with one forward more than 1F1B, and stage 1 runs W between its gradient
# send and its next recv: each stage posts a send alone in a group, then computes, then
# receives. Tags match and a non-blocking send would go through, but on NCCL stage 0's send
# of act1 waits for stage 1's recv of it, which waits behind stage 1's send of grad0, which
# waits for stage 0's recv of it, which waits behind the first send.
SPLIT = ("F0 >a0 F1 >a1 F2 >a2 <g0 B0 W0 <g1 B1 W1 <g2 B2 W2",
         "<a0 F0 B0 >g0 W0 <a1 F1 B1 >g1 W1 <a2 F2 B2 >g2 W2")
# The same actions, each send posted in one group with the recv its stage needs next.
GROUPED = ("F0 >a0 F1 >a1 <g0 B0 W0 F2 >a2 <g1 B1 W1 <g2 B2 W2",
           "<a0 F0 B0 >g0 <a1 W0 F1 B1 >g1 <a2 W1 F2 B2 >g2 W2")


def test_sends_posted_alone_on_both_sides_deadlock_only_when_sends_block():
    split = _handwritten(*SPLIT, microbatches=3)
    check_pair_order(split)
    check_blocking(split, sends_block=False)  # gloo: sends never wait
    with pytest.raises(ParaxisError, match="deadlocks") as error:
        check_blocking(split)
    message = str(error.value)
    assert "\n" not in message
    assert "stage 0 waits in group [send_act1->1]" in message
    assert "for recv_act1<-0 (stage 1 action 5)" in message
    assert "stage 1 waits in group [send_grad0->0]" in message
    assert "for recv_grad0<-1 (stage 0 action 6)" in message
    assert "post each send in one group with the recv" in message


def test_the_same_sends_grouped_with_the_next_recv_complete():
    grouped = _handwritten(*GROUPED, microbatches=3)
    split = _handwritten(*SPLIT, microbatches=3)
    assert [sorted(map(str, a)) for a in grouped.stages] == [
        sorted(map(str, a)) for a in split.stages]
    check_communication(grouped)


def test_w_is_local_compute_it_never_waits_but_it_parts_two_groups():
    check_communication(_handwritten(*GROUPED, microbatches=3))  # nothing waits on a W
    # In SPLIT it is stage 1's W0 that parts send_grad0 from recv_act1: without the Ws they
    # are one group, stage 0's lone send of act1 is matched, and the step completes.
    no_w = tuple(" ".join(t for t in row.split() if t[0] != "W") for row in SPLIT)
    check_communication(_handwritten(*no_w, microbatches=3))


def test_recvs_posted_before_sends_deadlock_under_either_contract():
    # Each stage waits for the other's message before sending its own: no semantics helps.
    crossed = _handwritten("F0 <g0 B0 >a0", "<a0 F0 B0 >g0", microbatches=1)
    for sends_block in (True, False):
        with pytest.raises(ParaxisError, match="stage 0 waits in group \\[recv_grad0<-1\\]"
                           ".*stage 1 waits in group \\[recv_act0<-0\\].*post each send "
                           "before the recv"):
            check_blocking(crossed, sends_block=sends_block)


def test_a_pair_posting_its_messages_in_another_order_is_caught():
    # Stage 0 sends act1 before act0; stage 1 receives act0 first. Matched by tag (gloo) and
    # with every op grouped so nothing blocks, but NCCL pairs act1 with the recv of act0.
    swapped = _handwritten("F0 F1 >a1 >a0 <g0 B0 <g1 B1", "<a0 F0 <a1 F1 B0 >g0 B1 >g1",
                           microbatches=2)
    check_blocking(swapped)
    with pytest.raises(ParaxisError, match="stages 0 -> 1 post their messages in different "
                       "orders: message 0 of the pair is send_act1->1 .* on stage 0 but "
                       "recv_act0<-0 .* on stage 1") as error:
        check_pair_order(swapped)
    assert "\n" not in str(error.value)
    with pytest.raises(ParaxisError, match="different orders"):
        check_communication(swapped)


def test_a_message_without_its_other_end_or_twice_or_to_the_wrong_peer():
    lost = _handwritten("F0 >a0 B0", "F0 B0", microbatches=1)
    with pytest.raises(ParaxisError, match="message 0 of the pair is send_act0->1 .* but "
                       "nothing on stage 1"):
        check_pair_order(lost)
    with pytest.raises(ParaxisError, match="has no matching recv"):
        check_blocking(lost)
    doubled = _handwritten("F0 >a0 >a0 B0", "<a0 F0 B0", microbatches=1)
    with pytest.raises(ParaxisError, match="has two sends"):
        check_blocking(doubled)
    astray = _handwritten("F0 >a0 B0", "<a0 F0 B0", "", microbatches=1)
    astray.stages[0][1] = Action("send", 0, 0, 0, "act", 2)
    with pytest.raises(ParaxisError, match="names peer 2 but its recv is on stage 1"):
        check_blocking(astray)
