"""The planner's stable JSON document (schema "paraxis.plan/1", documented in docs/planner.md)."""

from __future__ import annotations

import dataclasses

from paraxis.plan.cost import Estimate, Overlap
from paraxis.plan.hardware import Cluster
from paraxis.plan.search import SearchResult
from paraxis.plan.uncertainty import error_band, step_range
from paraxis.spec.model_config import ModelConfig
from paraxis.spec.precision import Precision

SCHEMA = "paraxis.plan/1"


def plan_document(cfg: ModelConfig, cluster: Cluster, seq_len: int, global_batch: int,
                  precision: Precision, overlap: Overlap, layouts: list[Estimate],
                  explanation: list[str], result: SearchResult | None = None) -> dict:
    # the machine's fields (backward_segments is the planner's model, not the machine's)
    cluster_dict = {k: v for k, v in dataclasses.asdict(cluster).items()
                    if k not in ("gpu", "backward_segments")}
    band = error_band(cluster)
    doc: dict = {
        "schema": SCHEMA,
        "mode": "search" if result is not None else "evaluate",
        "model": {**cfg.to_dict(), "num_params": cfg.num_params(),
                  "num_active_params": cfg.num_active_params()},
        "hardware": {"gpu": dataclasses.asdict(cluster.gpu),
                     "cluster": {**cluster_dict, "world_size": cluster.world_size}},
        "seq_len": seq_len,
        "global_batch": global_batch,
        "precision": dataclasses.asdict(precision),
        "overlap": dataclasses.asdict(overlap),
        "layouts": [{**e.to_dict(), "step_time_range_s": list(step_range(e, band))}
                    for e in layouts],
        "uncertainty": {"relative_error_rms": band.rms, "largest_relative_error": band.largest,
                        "validated_runs": band.runs, "source": band.source,
                        "fitted": band.fitted},
        "explanation": explanation,
    }
    if result is not None:
        doc["search"] = {
            "considered": result.considered,
            "fitting": len(result.ranked),
            "rejected_rules": len(result.rule_breakers),
            "rejected_memory": len(result.too_big),
            "skipped_slower": result.skipped,
            "rejected_examples": [
                {"layout": str(r.layout), "reason": r.reason}
                for r in (result.too_big[:3] + _distinct(result.rule_breakers, 3))],
        }
    return doc


def _distinct(rejections: list, count: int) -> list:
    seen, out = set(), []
    for rejection in rejections:
        if rejection.reason not in seen:
            seen.add(rejection.reason)
            out.append(rejection)
        if len(out) == count:
            break
    return out
