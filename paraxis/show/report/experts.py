"""The report's mixture-of-experts section: what the all-to-all carries under the plan's
expert parallelism, and, for a run, how evenly its experts were loaded step by step.

The all-to-all is drawn from `paraxis.spec.expert_placement` (the function the runtime counts its
traffic with and the planner prices) at perfect balance, next to the planner's seconds for
it; the run's per-expert token counts come from its metrics (`expert_tokens`, one list per
MoE block, counted over the global batch). The routing of single tokens needs the model
itself: drawn from the run's newest checkpoint when its folder holds one, else from the
model's initial weights for a model small enough to build here (`paraxis experts` draws it
for any checkpoint).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from paraxis.files.checkpoint_manifest import complete_checkpoints
from paraxis.plan.experts import experts_over_tp, routing_share
from paraxis.show.report.plan import Plan
from paraxis.show.report.text import duration
from paraxis.show.viz.html import figure
from paraxis.show.viz.moe import plot_all_to_all, plot_expert_load, plot_routing
from paraxis.show.viz.style import figure_data_uri
from paraxis.spec.expert_placement import ALL_TO_ALLS_PER_BLOCK, uniform_send_matrix
from paraxis.spec.model_config import routing_text

if TYPE_CHECKING:
    from paraxis.show.report.measured import MeasuredRun

Section = tuple[str, str, str]  # (anchor, heading, HTML body)


def experts_section(plan: Plan, run: MeasuredRun | None) -> Section:
    cfg, layout, e = plan.cfg, plan.layout, plan.estimate
    parts = [f"<p>{cfg.name}: {cfg.n_experts} experts per MoE block, each token routed to "
             f"{cfg.top_k} ({routing_text(cfg)}); {cfg.num_params() / 1e6:,.1f} M parameters "
             "in all, "
             f"{cfg.num_active_params() / 1e6:,.1f} M used per token (what the FLOPs follow). "
             f"ep = {layout.ep}: each rank holds {cfg.n_experts // layout.ep} "
             f"expert{'s' if cfg.n_experts // layout.ep > 1 else ''} of every "
             f"MoE block. {experts_over_tp(cfg, layout)}</p>"]
    if layout.ep > 1:
        # one rank's microbatch (its sequence shard's where each tp rank routes its own)
        tokens = e.micro_batch * plan.seq_len // layout.cp // routing_share(cfg, layout)
        per_rank = uniform_send_matrix(tokens, cfg.top_k, cfg.n_experts, layout.ep,
                                       cfg.capacity_factor)[0][0]
        per_expert = round(per_rank * layout.ep / cfg.n_experts)
        counts = [[per_expert] * cfg.n_experts for _ in range(layout.ep)]
        priced = e.time.get("ep_total", 0.0)
        parts.append(figure(
            figure_data_uri(plot_all_to_all(counts, layout.ep, cfg.d_model,
                                            int(plan.inputs.precision_rule().activation_bytes))),
            "dispatch all-to-all",
            f"One MoE block's dispatch for one microbatch of {tokens:,} tokens per rank at "
            f"perfect balance (the planner multiplies by its imbalance factor); "
            f"{ALL_TO_ALLS_PER_BLOCK} such all-to-alls per block and microbatch "
            f"(dispatch, combine, and both again in backward): {duration(priced)} a step "
            "in the plan."))
    parts.append(_routing(plan, run))
    step_counts = [r["expert_tokens"] for r in run.records if r.get("expert_tokens")] \
        if run is not None else []
    if step_counts:
        parts.append(figure(
            figure_data_uri(plot_expert_load(step_counts)), "expert load of the run",
            "Tokens each expert received on every step of the run (all MoE blocks), and "
            "each step's busiest expert over the mean: under expert parallelism the step "
            "waits for the rank holding the busiest experts."))
    return ("experts", "Mixture of experts", "".join(parts))


ROUTED_MODEL_LIMIT = 1e9  # parameters: larger models are not built to draw their routing


def _routing(plan: Plan, run: MeasuredRun | None) -> str:
    from paraxis.model.routing import route_batch  # lazy: torch, only to route a MoE model's tokens

    cfg = plan.cfg
    found = [] if run is None else [d for root in (run.folder, run.folder / "checkpoints")
                                    for _, d in complete_checkpoints(root)]
    if found:
        source, what = str(found[-1]), f"the run's checkpoint {found[-1].name}"
    elif cfg.num_params() <= ROUTED_MODEL_LIMIT:
        source, what = plan.inputs.model or cfg.name, "the model's initial weights (seed 0)"
    else:
        return ("<p>Routing of single tokens: `paraxis experts --model CHECKPOINT --out DIR` "
                "draws it for a trained model (this one is too large to build here).</p>")
    _, routes = route_batch(source, batch=1, seq_len=min(plan.seq_len, 24))
    block = min(routes)
    chosen, weights = routes[block]
    return figure(figure_data_uri(plot_routing(chosen, weights, cfg.n_experts, plan.layout.ep)),
                  "routing", f"Block {block}'s routing of the first tokens of the embedded "
                  f"text, by {what}: each token's top {cfg.top_k} experts and their weights, "
                  "and the tokens each expert received.")
