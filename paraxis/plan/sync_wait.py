"""What a synchronising call waits for on CPU ranks that share cores, by the compute before it.

Ranks that outnumber the cores drift apart while they compute, and each collective waits for
the last member of its group (docs/planner.md). How far they
drift grows with the compute between two calls: `paraxis calibrate` times the wait after
GEMM segments of a few lengths (calibrate/collectives.sync_wait_curve), and the planner
reads the wait at the segment a call really follows (`at_segment`): half a layer's forward
GEMMs per microbatch on one TP rank before a forward TP call, a pipeline chunk's forward
before a stage's activation send, and twice those before the backward's calls
(`after_backward`: a backward computes the input's and the weights' gradients, twice the
forward's GEMMs). A 256-token microbatch split over TP = 4 computes about half a millisecond
between two calls, where the calibration's own segment (half a layer at 2048 tokens) is 15
ms: in groups of 4 among 8 ranks sharing 2 cores the first waits about 1.3 ms, the second 7
(bench/results/benchmarks-segment).

Calls that follow a whole backward (the gradient sync, the step's own small calls) and
ZeRO-3's gathers pay the wait at the calibration's segment (`Cluster.sync_wait_s`), the
longest it times. Simplifications, each a call site read at the forward's half layer: a
context-parallel ring hop, an MoE block's all-to-alls (forward and backward) and the LM
head's loss calls. GPUs (a cluster without `cores_per_node`) wait for nothing here.
"""

from __future__ import annotations

import bisect
import dataclasses
import math

from paraxis.plan.compute import layer_forward_flops_per_token
from paraxis.plan.hardware import Cluster
from paraxis.spec.model_config import ModelConfig


def nearest_count(keys: list[str], want: int) -> str:
    """The measured count closest to `want` on a log scale (ties: the larger, more
    contended)."""
    return min(keys, key=lambda k: (abs(math.log(int(k) / want)), -int(k)))


def nearest_entry(table: dict, cluster: Cluster, group_size: int) -> object | None:
    """A CPU table's entry measured per [ranks on node][group size], nearest to both counts;
    None where there is none (GPUs)."""
    if not table or group_size < 2 or not cluster.cores_per_node:
        return None
    by_group = table[nearest_count(list(table), cluster.gpus_per_node)]
    return by_group[nearest_count(list(by_group), group_size)] if by_group else None


def nearest_measured(table: dict, cluster: Cluster, group_size: int) -> float | None:
    """A CPU figure measured per [ranks on node][group size] (`Cluster.sync_wait_s`,
    `Cluster.scalar_call_s`), nearest to both counts; None where there is none (GPUs)."""
    entry = nearest_entry(table, cluster, group_size)
    return None if entry is None else float(entry)


def wait_at(curve: list[list[float]], segment_s: float) -> float:
    """The wait after `segment_s` of compute, read off measured [segment_s, wait_s] points:
    straight between two points, and the nearest point's beyond the ends (no extrapolation
    past what was timed)."""
    points = sorted((float(c), float(w)) for c, w in curve)
    segments = [c for c, _ in points]
    i = bisect.bisect_left(segments, segment_s)
    if i == 0:
        return points[0][1]
    if i == len(points):
        return points[-1][1]
    (c0, w0), (c1, w1) = points[i - 1], points[i]
    return w0 + (w1 - w0) * (segment_s - c0) / (c1 - c0)


def sync_wait(cluster: Cluster, group_size: int) -> float:
    """Seconds a synchronising call over `group_size` ranks waits in a step on CPU ranks
    beyond its idle time: read at `cluster.sync_segment_s` of compute before it where the
    calibration timed a curve (`at_segment` sets it), else the figure at the calibration's
    own segment; 0 where not measured, and on devices of their own (GPUs)."""
    curve = nearest_entry(cluster.sync_wait_curve_s, cluster, group_size)
    if curve and cluster.sync_segment_s > 0:
        return wait_at(curve, cluster.sync_segment_s)
    return nearest_measured(cluster.sync_wait_s, cluster, group_size) or 0.0


def sync_segment_s(cfg: ModelConfig, tokens: float, flops_per_s: float) -> float:
    """Half a layer's forward GEMMs on `tokens` at `flops_per_s`: the compute between a TP
    layer's two calls in a pass (of one TP rank: its tokens x the 1/tp of the weights it
    holds are the whole layer's on tokens / tp). The segment `paraxis calibrate` times the
    wait after, and the one a TP call is priced after."""
    return layer_forward_flops_per_token(cfg, 1, 0)[0] * tokens / 2 / flops_per_s




def at_segment(cluster: Cluster, segment_s: float) -> Cluster:
    """`cluster` with its calls priced after `segment_s` of compute (one rank alone), where it
    has a calibrated curve; else `cluster` itself (GPUs, older profiles)."""
    if not cluster.sync_wait_curve_s or not cluster.cores_per_node:
        return cluster
    return dataclasses.replace(cluster, sync_segment_s=segment_s)


def after_backward(cluster: Cluster) -> Cluster:
    """`cluster`, priced at the forward's segment (`at_segment`), with its calls priced after
    the backward of that segment instead (`cluster.backward_segments` x as long); else `cluster`
    itself
    (GPUs, profiles without a curve, a cluster at the flat figure)."""
    if cluster.sync_segment_s <= 0:
        return cluster
    return at_segment(cluster, cluster.backward_segments * cluster.sync_segment_s)
