"""`--layout auto`: the planner's pick for a run, defended in at most five lines.

    choice = choose(cfg, cluster, seq_len=128, global_batch=16, precision=FP32_ADAM)
    choice.layout          # the Layout that runs: the planner's own object, not a copy
    choice.defence(source) # <= 5 lines: the pick, the search, the cost, the ties, the memory

The search is `search.search` over every layout of the cluster's ranks; the pick is its
first (fastest, the simpler layout among times within 0.5%). Layouts predicted within the
model's validated error of the pick (`uncertainty.error_band`) are a tie the model cannot
break, and the defence says so. When no layout fits, `choose` fails in one line naming the
layout that comes closest in memory and what it would need. Pure Python, like all of plan/.
"""

from __future__ import annotations

from dataclasses import dataclass

from paraxis.plan.cost import DEFAULT_OVERLAP, STEP_PARTS, Estimate, Overlap, devices_to_hold
from paraxis.plan.experts import DEFAULT_IMBALANCE
from paraxis.plan.hardware import Cluster
from paraxis.plan.search import (
    Constraints,
    SearchResult,
    closest_to_fitting,
    search,
)
from paraxis.plan.uncertainty import error_band, ties
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import ModelConfig
from paraxis.spec.precision import Precision
from paraxis.spec.units import GB

MAX_DEFENCE_LINES = 5
OVERHEADS = STEP_PARTS[1:]  # beside compute


@dataclass(frozen=True)
class AutoChoice:
    """The planner's pick for one run, with the search it won."""

    cfg: ModelConfig
    cluster: Cluster
    best: Estimate
    result: SearchResult
    global_batch: int
    seq_len: int

    @property
    def layout(self) -> Layout:
        return self.best.layout

    def defence(self, source: str) -> list[str]:
        """At most five lines: what runs and where its prices come from, what was searched,
        where its step time goes, who ties with it, and its memory."""
        best, result = self.best, self.result
        band = error_band(self.cluster)
        ranks = self.cluster.world_size
        lines = [f"auto layout: {best.layout} on {ranks} rank{'s' if ranks > 1 else ''}, "
                 f"predicted {best.step_time_s:.3g} s per step, priced on {source}",
                 f"searched {result.considered} layouts of {self.cfg.name} for global batch "
                 f"{self.global_batch} x {self.seq_len} tokens: {len(result.ranked)} fit, "
                 f"{len(result.too_big)} too big for memory, {result.skipped} skipped as "
                 "slower"]
        parts = [f"compute {best.time['compute']:.3g} s"] + [
            f"{k.replace('_', ' ')} {best.time[k]:.3g} s" for k in OVERHEADS
            if best.time.get(k, 0.0) > 0.0005]
        lines.append("its step: " + ", ".join(parts))
        tied = ties(best, result.ranked, band)
        runner = next((e for e in result.ranked if e is not best), None)
        if tied:
            shown = ", ".join(f"{e.layout} {_slower(e, best)}" for e in tied[:2])
            lines.append(
                f"tie: {len(tied)} other layout{'s are' if len(tied) > 1 else ' is'} within "
                f"the model's ±{band.rms:.0%} {band.name} ({shown}); the model cannot rank "
                "them: the pick is its fastest (the simpler within 0.5%)")
        elif runner is not None:
            lines.append(f"next best: {runner.layout} {_slower(runner, best)}, outside the "
                         f"model's ±{band.rms:.0%} {band.name}")
        memory = best.memory
        lines.append(f"memory per rank {memory['total'] / GB:.2f} of "
                     f"{best.memory_limit_bytes / GB:.2f} GB (model states "
                     f"{(memory['params'] + memory['grads'] + memory['optimizer']) / GB:.2f}, "
                     f"activations {memory['activations'] / GB:.2f}, recompute="
                     f"{best.layout.recompute})")
        return lines[:MAX_DEFENCE_LINES]


def _slower(rival: Estimate, best: Estimate) -> str:
    return f"{rival.step_time_s / best.step_time_s - 1:+.1%}"


def choose(cfg: ModelConfig, cluster: Cluster, seq_len: int, global_batch: int,
           precision: Precision, constraints: Constraints | None = None,
           overlap: Overlap = DEFAULT_OVERLAP,
           expert_imbalance: float = DEFAULT_IMBALANCE) -> AutoChoice:
    """The fastest layout of the cluster's ranks that fits (module docstring), or a one-line
    ParaxisError naming the closest layout and what it would need; `constraints`: what the
    run rules out (document packing: no context parallelism; `plan --verify`'s flags)."""
    result = search(cfg, cluster, seq_len, global_batch, constraints or Constraints(),
                    precision, overlap, expert_imbalance)
    if not result.ranked:
        raise ParaxisError(no_fit_message(cfg, cluster, result))
    return AutoChoice(cfg, cluster, result.ranked[0], result, global_batch, seq_len)


def no_fit_message(cfg: ModelConfig, cluster: Cluster, result: SearchResult) -> str:
    """One line: no layout fits; the one closest in memory, what it needs, what would do."""
    ranks, limit = cluster.world_size, cluster.gpu.memory_bytes
    closest = closest_to_fitting(result)
    if closest is None:
        reason = result.rule_breakers[0].reason if result.rule_breakers else "none was priced"
        return (f"no layout of {ranks} ranks can run {cfg.name} ({reason}); change --nproc "
                "or the global batch")
    need = closest.memory["total"]
    states = closest.memory["params"] + closest.memory["grads"] + closest.memory["optimizer"]
    enough = devices_to_hold(closest, ranks)
    more = f" or about {enough} ranks" if enough else ""
    memory = closest.memory
    return (f"no layout of {ranks} ranks fits {cfg.name} in {limit / GB:.3g} GB per rank; "
            f"closest: {closest.layout} needs {need / GB:.3g} GB per rank (model states "
            f"{states / GB:.3g} GB, activations {memory['activations'] / GB:.3g} GB, buffers "
            f"{memory['buffers'] / GB:.3g} GB, the rank's process baseline "
            f"{memory['reserved'] / GB:.3g} GB); give it {need / GB:.3g} GB per rank "
            f"(--memory-gb){more}")
