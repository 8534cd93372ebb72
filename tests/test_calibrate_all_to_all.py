"""`paraxis calibrate` times each collective the planner prices, at the bytes it passes."""

from paraxis.dist.testing import run_distributed
from paraxis.plan.comm import leaving

BUFFER_BYTES = [64 * 1024, 256 * 1024]


def _two_ranks_body() -> tuple[dict[str, list[float]], dict]:
    """What each calibrated call writes on this rank, from a buffer whose block r is meant
    for rank r, and the points `collective_times` records for a tiny all-to-all and
    all-reduce over the pair."""
    import torch
    import torch.distributed as dist

    from paraxis.train.calibrate.collectives import collective_call, collective_times

    rank = dist.get_rank()
    written = {op: collective_call(op, torch.tensor([10.0 * rank, 10.0 * rank + 1]))().tolist()
               for op in ("all_to_all", "send_recv")}
    points = collective_times(["all_to_all", "all_reduce"], BUFFER_BYTES, [2],
                              torch.device("cpu"), torch.float32, repeats=1, batch_s=0.002)
    return written, points


def test_the_all_to_all_calibration_times_an_all_to_all_at_the_bytes_leaving_a_rank():
    (written0, points), (written1, _) = run_distributed(_two_ranks_body, 2)
    # an all-to-all brings every rank its block of each rank's buffer; a neighbour's
    # send/recv brings it the whole of the other's
    assert [written0["all_to_all"], written1["all_to_all"]] == [[0.0, 10.0], [1.0, 11.0]]
    assert [written0["send_recv"], written1["send_recv"]] == [[10.0, 11.0], [0.0, 1.0]]
    # the planner prices an all-to-all at the bytes that leave the rank (plan.comm.leaving),
    # every other collective at the whole buffer
    assert [size for size, _ in points["all_to_all"]["2"]] == \
        [leaving(size, 2) for size in BUFFER_BYTES]
    assert [size for size, _ in points["all_reduce"]["2"]] == BUFFER_BYTES
    assert all(seconds > 0 for op in points.values() for size, seconds in op["2"])
