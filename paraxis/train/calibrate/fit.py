"""Fit a collective's latency and bandwidth from timed message sizes (pure Python, no torch).

The planner prices a collective over n ranks as (paraxis/plan/comm.py)

    time = steps(op, n) * alpha + factor(op, n) * bytes / bandwidth

with the ring's step count and byte factor (Patarasuk & Yuan 2009; Thakur et al. 2005). We
fit exactly that line, t = c0 + c1 * factor * bytes, and report alpha = c0 / steps and
bandwidth = 1 / c1, so a fitted bandwidth means what the planner's bandwidth means (a ring's
bus bandwidth, per rank, one direction) and the planner reproduces the measured times.
"""

from __future__ import annotations

from dataclasses import dataclass

from paraxis.plan.comm import latency_steps, op_time, ring_factor
from paraxis.spec.errors import ParaxisError


@dataclass(frozen=True)
class Fit:
    op: str
    ranks: int
    alpha_s: float  # latency per ring step
    bandwidth_Bps: float  # bytes/s per rank, one direction, in the planner's ring sense
    max_rel_error: float  # worst |predicted - measured| / measured over the fitted points

    def predict(self, size_bytes: float) -> float:
        return op_time(self.op, size_bytes, self.ranks, self.bandwidth_Bps, self.alpha_s)

    def to_dict(self) -> dict[str, float]:
        return {"alpha_s": self.alpha_s, "bandwidth_Bps": self.bandwidth_Bps,
                "max_rel_error": self.max_rel_error}


def fit_alpha_beta(op: str, ranks: int, sizes_bytes: list[float],
                   times_s: list[float]) -> Fit:
    """Least squares of time = alpha_total + factor * bytes / bandwidth over the points.

    Weighted by 1 / time^2, i.e. least squares on the relative error: the sizes span orders
    of magnitude, and plain least squares would let the largest message decide alpha too.
    Noise that would make the intercept negative is clipped to alpha = 0 (refit through
    the origin): a collective never takes less than no time. Times that do not grow with
    the size (latency-bound throughout, as gloo between ranks that outnumber the cores,
    where each call waits for a rank to be scheduled) keep their latency: the bandwidth is
    then only bounded below, by the per-byte time the times' scatter could hide at the
    largest size, and alpha is fitted with that slope (refitting through the origin there
    would drop the latency and price a small all-reduce many times too cheap).
    """
    if ranks < 2:
        raise ParaxisError(f"a {op} fit needs at least 2 ranks, got {ranks}")
    if len(sizes_bytes) != len(times_s) or len(set(sizes_bytes)) < 2:
        raise ParaxisError(f"a {op} fit needs times for at least two different message "
                           f"sizes (got sizes {sizes_bytes})")
    if min(times_s) <= 0:
        raise ParaxisError(f"{op} times must be positive, got {times_s}")
    factor = ring_factor(op, ranks)
    xs = [factor * s for s in sizes_bytes]
    ws = [1.0 / t**2 for t in times_s]
    sw = sum(ws)
    sx = sum(w * x for w, x in zip(ws, xs, strict=True))
    sy = sum(w * t for w, t in zip(ws, times_s, strict=True))
    sxx = sum(w * x * x for w, x in zip(ws, xs, strict=True))
    sxy = sum(w * x * t for w, x, t in zip(ws, xs, times_s, strict=True))
    det = sw * sxx - sx * sx
    slope = (sw * sxy - sx * sy) / det
    intercept = (sy - slope * sx) / sw
    if slope <= 0:
        # Flat: the (weighted) mean time is the latency; the per-byte part is at most what the
        # times' scatter could hide at the largest size (relative spread x mean there).
        mean = sy / sw
        spread = (sum(w * (t - mean) ** 2 for w, t in zip(ws, times_s, strict=True)) / sw) ** 0.5
        slope = max(spread, 1e-3 * mean) / max(xs)  # 1e-3: exactly flat points (no scatter)
        intercept = (sy - slope * sx) / sw  # weighted least squares, slope fixed
    if intercept < 0:
        intercept, slope = 0.0, sxy / sxx
    if slope <= 0:
        raise ParaxisError(f"{op} times do not grow with message size ({times_s}); measure "
                           "larger messages")
    fit = Fit(op, ranks, intercept / latency_steps(op, ranks), 1.0 / slope, 0.0)
    worst = max(abs(fit.predict(s) - t) / t for s, t in zip(sizes_bytes, times_s, strict=True))
    return Fit(op, ranks, fit.alpha_s, fit.bandwidth_Bps, worst)
