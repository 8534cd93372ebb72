"""One transformer layer's TP collectives over time: all of them, and those on the critical
path once the GEMMs beside them hide what they can (Megatron-LM's backward overlap, and
Transformer Engine's userbuffers pipelining every collective with its GEMM).

The collectives a layer issues are `comm.tp_collectives_per_layer`'s; each is priced by
`comm.collective_time` on the TP group's link.
"""

from __future__ import annotations

from paraxis.plan.comm import Link, collective_time, scatter_time, tp_collectives_per_layer

# Megatron's SP keeps only the sequence shard of the two column-parallel GEMM inputs (the
# memory activations.py counts) and all-gathers them again in the backward (Korthikanti et
# al. 2022 Sec. 4.2.2): two extra all-gathers per layer. paraxis's own runtime lets autograd
# keep the gathered input instead, so it has none (`regather=False`,
# `GPU.megatron_runtime`).
SP_BACKWARD_REGATHERS = 2


def tp_collective_time(op: str, size_bytes: float, tp: int, link: Link) -> float:
    """One TP collective of `size_bytes`, a reduce-scatter as the runtime carries it there."""
    if op == "reduce_scatter":
        return scatter_time(size_bytes, tp, link)
    return collective_time(op, size_bytes, tp, link)


def _collectives_time(counts: dict[str, int], size_bytes: float, tp: int, link: Link) -> float:
    return sum(count * tp_collective_time(op, size_bytes, tp, link)
               for op, count in counts.items())


def tp_layer_time(activation_bytes: float, tp: int, sequence_parallel: bool, link: Link,
                  passes: int = 2, regather: bool = True,
                  backward_link: Link | None = None, mlp: str = "split") -> float:
    """Seconds of TP traffic one layer moves per microbatch: the forward collectives
    `passes - 1` times (2 with full recomputation, which reruns the forward) plus the
    backward's (with SP and `regather`, Megatron's re-gathers too), those on `backward_link`
    where given (CPU ranks: their calls wait after the backward's compute, plan/sync_wait.py);
    `mlp` as in `tp_collectives_per_layer` (unsplit, it has no input to re-gather)."""
    counts = tp_collectives_per_layer(sequence_parallel, mlp)
    back = backward_link or link
    regathers = (SP_BACKWARD_REGATHERS - (mlp != "split")) * collective_time(
        "all_gather", activation_bytes, tp, back) if sequence_parallel and regather else 0.0
    return ((passes - 1) * _collectives_time(counts["forward"], activation_bytes, tp, link)
            + _collectives_time(counts["backward"], activation_bytes, tp, back) + regathers)


def tp_layer_exposed_time(activation_bytes: float, tp: int, sequence_parallel: bool,
                          link: Link, gemm_windows_s: tuple[float, ...], overlap: bool = True,
                          contention: float = 0.0, regather: bool = True,
                          backward_link: Link | None = None, mlp: str = "split",
                          row_windows_s: tuple[float, ...] = ()) -> tuple[float, float]:
    """(forward, backward) seconds of TP communication one layer puts on the critical path per
    microbatch; a full recomputation pays the forward figure once more.

    Forward collectives block the next GEMM. In the backward, Megatron launches the
    input-gradient collective of each column-parallel linear (QKV, MLP-in) asynchronously and
    overlaps it with that linear's weight-gradient GEMM (Korthikanti et al. 2022 Sec. 6.2; their
    Table 4 backward of 11.9 ms is 2x the compute, not 2x + comm); with SP the re-gather of the
    stored input overlaps the input-gradient GEMM (Sec. 4.2.2), while the all-gathers of the
    row-parallel outputs' gradients stay exposed. `gemm_windows_s` holds one weight-gradient
    GEMM time per column-parallel linear; traffic beyond a window is exposed, and `contention`
    of the hidden part still lands on the step. `backward_link`, `mlp` as in `tp_layer_time`
    (a feed-forward half not split over tp gives only QKV's window; with SP a "whole" one's
    output gradient all-gather is the second exposed one, a "shards" one adds none).

    `row_windows_s` (one forward GEMM time per row-parallel linear: the attention output
    projection, MLP-out), given with SP: every TP collective is pipelined with the GEMM next
    to it, forward too (Megatron-Core's --tp-comm-overlap, NeMo's ub_tp_comm_overlap:
    Transformer Engine's userbuffers split the all-gather before a column-parallel GEMM and
    the reduce-scatter after a row-parallel one into chunks that overlap the GEMM's own
    chunks; Wang et al. 2023, ASPLOS, Sec. 3). The forward's all-gathers hide behind the
    column-parallel GEMMs (`gemm_windows_s`), its reduce-scatters behind the row-parallel
    ones, and the backward's output-gradient all-gathers behind the row-parallel dgrad GEMMs
    (as long as the forward's)."""
    if tp <= 1:
        return 0.0, 0.0
    counts = tp_collectives_per_layer(sequence_parallel, mlp)
    back = backward_link or link
    if overlap and sequence_parallel and row_windows_s:
        return _pipelined_tp_times(activation_bytes, tp, link, back, gemm_windows_s,
                                   row_windows_s, contention, regather, mlp)
    forward = _collectives_time(counts["forward"], activation_bytes, tp, link)
    if not overlap:
        return forward, tp_layer_time(activation_bytes, tp, sequence_parallel, link,
                                      regather=regather, backward_link=back,
                                      mlp=mlp) - forward
    if sequence_parallel:
        gather = collective_time("all_gather", activation_bytes, tp, back)
        # the conjugates of the forward reduce-scatters (a whole feed-forward half's scatter)
        exposed = (1 + (mlp != "shards")) * gather
        # per column-parallel linear: re-gather behind dgrad, reduce-scatter behind wgrad
        hideable = [gather] if regather else []
        hideable.append(scatter_time(activation_bytes, tp, back))
    else:
        exposed = 0.0
        hideable = [collective_time("all_reduce", activation_bytes, tp, back)]
    hidden = 0.0
    for window in gemm_windows_s:
        for comm in hideable:
            hidden += min(comm, window)
            exposed += max(0.0, comm - window)
    return forward, exposed + contention * hidden


def _pipelined_tp_times(activation_bytes: float, tp: int, link: Link, back: Link,
                        column_windows_s: tuple[float, ...], row_windows_s: tuple[float, ...],
                        contention: float, regather: bool, mlp: str) -> tuple[float, float]:
    """(forward, backward) exposed seconds of one SP layer's TP collectives each pipelined
    with its neighbouring GEMM (`tp_layer_exposed_time`'s row_windows_s). A feed-forward
    half not split over tp has no GEMM of its own beside its collectives: those block."""
    def paired(comm: float, window: float) -> float:
        return max(0.0, comm - window) + contention * min(comm, window)

    gather_f = collective_time("all_gather", activation_bytes, tp, link)
    scatter_f = scatter_time(activation_bytes, tp, link)
    gather_b = collective_time("all_gather", activation_bytes, tp, back)
    scatter_b = scatter_time(activation_bytes, tp, back)
    halves = 2 if mlp == "split" else 1
    forward = backward = 0.0
    for column, row in list(zip(column_windows_s, row_windows_s, strict=False))[:halves]:
        forward += paired(gather_f, column) + paired(scatter_f, row)
        # the output gradient's all-gather beside the row-parallel dgrad; the input
        # gradient's reduce-scatter (and Megatron's re-gather) beside the column-parallel GEMMs
        backward += paired(gather_b, row) + paired(scatter_b + regather * gather_b, column)
    if mlp == "whole":  # the whole experts' input gathered, its gradient gathered back
        forward += gather_f
        backward += gather_b
    return forward, backward
