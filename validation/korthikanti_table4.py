"""Korthikanti et al. 2022 Table 4: one layer of the 22B model (Table 3 shape, tp = 8,
microbatch 4, seq 2048), forward and backward milliseconds per configuration. Fitted data
(the same paper as the fitted rows of validation/validate_planner.py)."""

from __future__ import annotations

from paraxis.plan.cost import Overlap
from paraxis.plan.hardware import build_cluster
from paraxis.plan.layer_cost import layer_times
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import ModelConfig

TABLE_4 = [  # (sequence parallel, recompute, forward ms, backward ms)
    (False, "none", 7.7, 11.9),
    (True, "none", 7.2, 11.8),
    (False, "full", 7.7, 19.5),
    (False, "selective", 7.7, 13.2),
    (True, "selective", 7.2, 13.1),
]


def layer_ms(sequence_parallel: bool, recompute: str, overlap: Overlap) -> tuple[float, float]:
    """The planner's (forward, backward) milliseconds of that layer, TP communication in."""
    cfg = ModelConfig("gpt-22b", "gpt2", 51200, 48, 6144, 64, 64, 4 * 6144, 2048)
    layout = Layout(dp=1, tp=8, recompute=recompute, sequence_parallel=sequence_parallel)
    cluster = build_cluster("a100-80gb", 8, 8, {"attention_kernel": "math"})  # Megatron 2022's
    t = layer_times(cfg, layout, cluster, 2048, 4, overlap)
    return 1e3 * (t["forward"] + t["tp_forward"]), 1e3 * (t["backward"] + t["tp_backward"])


def table_4_errors(overlap: Overlap) -> list[float]:
    """Predicted / published - 1 of every forward and backward time of the table."""
    return [ms / published - 1 for sp, recompute, *published_ms in TABLE_4
            for ms, published in zip(layer_ms(sp, recompute, overlap), published_ms,
                                     strict=True)]
