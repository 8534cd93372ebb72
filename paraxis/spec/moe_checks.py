"""The mixture-of-experts fields of a `ModelConfig`, checked and described: pure Python, as
the config."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from paraxis.spec.errors import ParaxisError

if TYPE_CHECKING:
    from paraxis.spec.model_config import ModelConfig


def check_experts(cfg: ModelConfig) -> None:
    """The mixture-of-experts fields of `cfg`, checked (one line naming the fix each)."""
    if not (cfg.expert_bias_rate >= 0 and math.isfinite(cfg.expert_bias_rate)):
        raise ParaxisError(f"expert_bias_rate must be >= 0 and finite, got "
                           f"{cfg.expert_bias_rate!r}; DeepSeek-V3 used 0.001")
    if cfg.router_score not in ("softmax", "sigmoid"):
        raise ParaxisError(f"router_score {cfg.router_score!r} is unknown; use softmax or "
                           "sigmoid")
    if not isinstance(cfg.expert_bias, bool):
        raise ParaxisError(f"expert_bias must be true or false, got {cfg.expert_bias!r}")
    if cfg.n_experts == 0:
        if (cfg.expert_bias or cfg.route_groups or cfg.route_group_limit
                or cfg.router_score != "softmax"):
            raise ParaxisError("expert_bias, route_groups, route_group_limit and router_score "
                               "need a mixture of experts (n_experts > 0); drop them or set "
                               "n_experts")
        if cfg.top_k or cfg.n_shared_experts or cfg.d_ff_expert:
            raise ParaxisError("top_k, d_ff_expert and n_shared_experts need n_experts > 0; "
                               "set n_experts for a mixture of experts or drop them")
        return
    if cfg.style != "llama":
        raise ParaxisError("mixtures of experts are llama-style (SwiGLU experts); set style "
                           "llama or n_experts 0")
    for field in ("n_experts", "top_k", "d_ff_expert"):
        value = getattr(cfg, field)
        if not isinstance(value, int) or value < 1:
            raise ParaxisError(f"model {field}={value!r} must be a positive integer for a "
                               "mixture of experts")
    if cfg.top_k > cfg.n_experts:
        raise ParaxisError(f"top_k {cfg.top_k} exceeds n_experts {cfg.n_experts}; route "
                           "each token to at most n_experts experts")
    if not 0 <= cfg.first_dense_layers <= cfg.n_layers:
        raise ParaxisError(f"first_dense_layers {cfg.first_dense_layers} must be within "
                           f"0..n_layers ({cfg.n_layers})")
    if min(cfg.n_shared_experts, cfg.capacity_factor, cfg.aux_loss_coef,
           cfg.z_loss_coef) < 0:
        raise ParaxisError("n_shared_experts, capacity_factor, aux_loss_coef and "
                           "z_loss_coef must be >= 0")
    _check_groups(cfg)


def _check_groups(cfg: ModelConfig) -> None:
    groups, limit = cfg.route_groups, cfg.route_group_limit
    if not groups and not limit:
        return
    if not (isinstance(groups, int) and isinstance(limit, int) and 1 <= limit <= groups
            and cfg.n_experts % groups == 0):
        raise ParaxisError(f"route_groups {groups!r} must divide n_experts "
                           f"({cfg.n_experts}) and route_group_limit {limit!r} be within "
                           f"1..route_groups; e.g. route_groups 8, route_group_limit 4 "
                           "(DeepSeek-V3)")
    if cfg.top_k % limit or cfg.top_k // limit > cfg.n_experts // groups:
        raise ParaxisError(f"top_k {cfg.top_k} must be a multiple of route_group_limit "
                           f"{limit}, and top_k / route_group_limit at most a group's "
                           f"{cfg.n_experts // groups} experts (each kept group is scored "
                           "by its best top_k / route_group_limit experts)")


def routing_text(cfg: ModelConfig) -> str:
    """How a token picks its experts, in words: the scores, top-k, the groups, the bias."""
    how = f"top {cfg.top_k} of {cfg.n_experts} by {cfg.router_score} scores"
    if cfg.route_groups:
        how += (f", within the best {cfg.route_group_limit} of {cfg.route_groups} expert "
                "groups")
    if cfg.expert_bias:
        how += (f", chosen with the aux-loss-free routing bias (rate "
                f"{cfg.expert_bias_rate:g})")
    return how
