"""A mixture-of-experts feed-forward block: router, experts, load-balancing loss.

Each token's hidden state goes through a linear router to one logit per expert; a softmax
over all experts, the `top_k` largest kept and renormalised to sum to one (Mixtral, Jiang et
al. 2024, eq. 1; Hugging Face's MixtralSparseMoeBlock does exactly this) gives each token its
experts and their weights. The block's output is the weighted sum of the chosen experts'
outputs (SwiGLU MLPs), plus the shared experts' that every token uses (DeepSeek-MoE).

How tokens reach their experts is the one thing that changes with expert parallelism, so it is a
seam: the block sorts the (token, expert) assignments by expert and hands the sorted tokens with the
count per expert to `self.run_experts`, which returns their outputs in the same order. On one device
(`LocalExperts`) that is a loop over the experts; under expert parallelism
(`paraxis.parallel.experts.expert_parallel`) the tokens travel to the ranks holding their experts by
all-to-all and back.

Load balance (Switch Transformer, Fedus et al. 2022, eq. 4): aux = coef * E * sum_e f_e P_e,
with f_e the share of the batch's assignments routed to expert e and P_e the mean router
probability of e. f is counted over the tokens of all ranks that share a microbatch step
(`stats_group`: data x context parallel, whose tensor-parallel ranks see the same tokens;
and `shard_group`, the tp group, where each tp rank routes only its own sequence shard:
`tensor_parallel.apply.WholeExperts`), so every layout sees the statistics one device sees
for that microbatch. The statistics are per
microbatch step: with M microbatches, global microbatch m is the union of microbatch m of
every dp x cp rank (each rank's m-th slice of its rows), and one device reproduces a layout
by accumulating gradients over those same token sets (tests/test_moe_ep.py builds its
reference so); f is a count (no gradient), so each rank's P over its own tokens
gives exactly its share of the gradient. The aux loss is not added to the language-model
loss the model returns: its gradient is injected in backward at the block's output
(`AuxLossGradient`, as Megatron-Core's MoEAuxLossAutoScaler does), scaled like the main
loss (`set_aux_loss_scale`: 1/microbatches, times fp16's loss scale), so a pipeline stage's
aux loss needs no trip to the last stage; its value is kept for the metrics.

Aux-loss-free balancing (DeepSeek-AI 2024, DeepSeek-V3 Sec. 2.1.2; Megatron-LM's
--moe-router-enable-expert-bias, torchtitan's load_balance_coeff), with `expert_bias`: a
bias per expert is added to the router's probabilities to choose each token's
experts, and only to choose them: the weights stay the chosen experts' own probabilities.
After every applied step each bias moves by `expert_bias_rate` against its expert's load over that
step (`update_expert_bias`): down where the expert took more than the mean of the step's
(token, expert) assignments, up where it took fewer. The counts are those of the whole
global batch (the metrics' `expert_tokens`), the same on every rank holding the block, so
every layout moves the bias as one device does. The bias is fp32 training state, kept in a
buffer that checkpoints save (`model.single_device_buffers`); it has no gradient.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from paraxis.dist.watchdog import WATCH
from paraxis.spec.expert_placement import expert_capacity
from paraxis.spec.model_config import ModelConfig

# (the sorted rows, the rows per expert as an int64 tensor on their device) -> the outputs
ExpertsRunner = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class ExpertList(nn.ModuleList):
    """Experts registered under their global index: a rank holding experts 4-7 names them
    `experts.4` ... `experts.7`, as one device does (so initial weights and checkpoints are
    those of one device), while iteration and len() cover the local ones."""

    def __init__(self, experts: dict[int, nn.Module]) -> None:
        super().__init__()
        for index, expert in experts.items():
            self.add_module(str(index), expert)

    @property
    def indices(self) -> list[int]:
        return [int(name) for name in self._modules]


class LocalExperts:
    """Every expert on this rank: run each on its contiguous slice of the sorted tokens."""

    def __init__(self, experts: ExpertList) -> None:
        self.experts = experts

    def __call__(self, tokens: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        return self.run(tokens, counts.tolist())  # host sync: the split sizes

    def run(self, tokens: torch.Tensor, sizes: list[int]) -> torch.Tensor:
        pieces = tokens.split(sizes)
        return torch.cat([expert(piece) for expert, piece in zip(self.experts, pieces,
                                                                  strict=True)])


class AuxLossGradient(torch.autograd.Function):
    """Identity on the block's output; in backward it also starts the gradient of the
    router's regulariser (aux loss and z-loss, coefficients included; d = scale), so they
    train the router wherever this block runs."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, output: torch.Tensor,
                aux: torch.Tensor, scale: float,
                on_backward: Callable[[], None] | None = None) -> torch.Tensor:
        ctx.scale = scale
        ctx.aux_shape = aux.shape
        ctx.on_backward = on_backward
        return output.view_as(output)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, None, None]:
        aux_grad = torch.full(ctx.aux_shape, ctx.scale, dtype=torch.float32,
                              device=grad.device)
        if ctx.on_backward is not None:
            ctx.on_backward()
        return grad, aux_grad, None, None


class Combine(torch.autograd.Function):
    """Each token's expert outputs, weighted by its routing weights, summed back to it:
    zeros(T, h).index_add(0, token_of, outputs * weights). Written out, autograd would keep
    the outputs for the weights' gradient and the weighted outputs again for index_add's
    (which reads its source's shape): this keeps the outputs once, with the weights and the
    index, and computes the same gradients with the same kernels."""

    @staticmethod
    def forward(ctx: torch.autograd.function.FunctionCtx, outputs: torch.Tensor,
                weights: torch.Tensor, token_of: torch.Tensor, tokens: int) -> torch.Tensor:
        ctx.save_for_backward(outputs, weights, token_of)
        weighted = outputs * weights.unsqueeze(-1)
        return outputs.new_zeros(tokens, outputs.shape[-1]).index_add(0, token_of, weighted)

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor
                 ) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None]:
        outputs, weights, token_of = ctx.saved_tensors
        grad_weighted = grad.index_select(0, token_of)
        grad_outputs = grad_weighted * weights.unsqueeze(-1) if ctx.needs_input_grad[0] \
            else None
        grad_weights = (grad_weighted * outputs).sum(-1) if ctx.needs_input_grad[1] else None
        return grad_outputs, grad_weights, None, None


@dataclass
class StepStats:
    """One MoE block's figures over a step's training microbatches, counted as each
    microbatch's backward passes the block (once, even under full recompute)."""

    counts: torch.Tensor | None = None  # per-expert assignments, global, summed
    aux: list[torch.Tensor] = field(default_factory=list)  # aux loss, coef-free, per microbatch
    z: list[torch.Tensor] = field(default_factory=list)  # router z-loss, coef-free
    dropped: int = 0  # this rank's assignments over capacity


class MoE(nn.Module):
    """Router + `n_experts` SwiGLU experts (+ shared experts). `make_expert(width)` builds
    one expert MLP (the model's own MLP class, so experts are ordinary MLPs)."""

    def __init__(self, cfg: ModelConfig, make_expert: Callable[[int], nn.Module],
                 experts: range | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.router = nn.Linear(cfg.d_model, cfg.n_experts, bias=False)
        held = range(cfg.n_experts) if experts is None else experts
        self.experts = ExpertList({index: make_expert(cfg.d_ff_expert) for index in held})
        if cfg.n_shared_experts:
            # Shared experts all see every token: one MLP of their summed width is the same.
            self.shared = make_expert(cfg.n_shared_experts * cfg.d_ff_expert)
        self.run_experts: ExpertsRunner = LocalExperts(self.experts)
        self.stats_group: dist.ProcessGroup | None = None  # ranks sharing a microbatch step
        # the tp group where each tp rank routes only its own sequence shard (WholeExperts)
        self.shard_group: dist.ProcessGroup | None = None
        self.aux_scale = 1.0  # d(total loss)/d(aux loss) in backward (set_aux_loss_scale)
        # this rank's share of the regulariser's gradient: 1/tp where the tp ranks' router
        # gradients add up (tensor_parallel.apply: ExpertsRegion, WholeExperts on shards)
        self.regulariser_share = 1.0
        self.last_counts: torch.Tensor | None = None  # per-expert assignments, global
        self.last_aux: torch.Tensor | None = None  # the aux loss value (this rank's share)
        self.last_dropped = 0  # assignments over capacity (capacity_factor > 0)
        self.step = StepStats()  # this step's training microbatches (`take_step`)
        # the aux-loss-free routing bias, fp32 whatever the parameters' dtype (None: off)
        self.register_buffer("expert_bias", torch.zeros(cfg.n_experts, dtype=torch.float32)
                             if cfg.expert_bias else None)

    def route(self, tokens: torch.Tensor, logits: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(weights, experts) of shape (tokens, top_k), and every expert's probability (the
        scores normalised over the experts: what the balance loss averages)."""
        cfg = self.cfg
        logits = self.router(tokens) if logits is None else logits
        scores = (F.softmax(logits, dim=-1, dtype=torch.float32) if cfg.router_score == "softmax"
                  else torch.sigmoid(logits.float()))
        # the bias and the groups choose the experts; the weights are their own scores
        choice = scores if self.expert_bias is None else scores + self.expert_bias
        if cfg.route_groups:
            choice = self._within_groups(choice)
        chosen = choice.topk(cfg.top_k, dim=-1).indices
        weights = scores.gather(-1, chosen)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        probs = scores if cfg.router_score == "softmax" else scores / scores.sum(-1, keepdim=True)
        return weights, chosen, probs

    def _within_groups(self, choice: torch.Tensor) -> torch.Tensor:
        """`choice` with every expert outside each token's route_group_limit best groups
        set to -inf; a group's score is the sum of its best top_k / route_group_limit choice
        scores (DeepSeek-V3 Sec. 2.1.2, node-limited routing; Megatron's group_limited_topk)."""
        cfg = self.cfg
        tokens = choice.shape[0]
        by_group = choice.view(tokens, cfg.route_groups, -1)
        group_scores = by_group.topk(cfg.top_k // cfg.route_group_limit, dim=-1).values.sum(-1)
        kept = group_scores.topk(cfg.route_group_limit, dim=-1).indices
        allowed = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, kept, True)
        return by_group.masked_fill(~allowed.unsqueeze(-1), float("-inf")).view(tokens, -1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        logits = self.router(tokens)
        weights, chosen, probs = self.route(tokens, logits)
        local_counts = torch.bincount(chosen.flatten(), minlength=self.cfg.n_experts)
        counts = self._global(local_counts)
        self.last_counts = counts
        keep = self._within_capacity(chosen)
        out = self._dispatch(tokens, chosen[keep] if keep is not None else chosen,
                             weights.to(x.dtype), keep)
        if self.cfg.n_shared_experts:
            out = out + self.shared(tokens)
        aux = self._aux_loss(counts, probs, tokens.shape[0])
        self.last_aux = aux.detach()
        # ST-MoE's router z-loss (Zoph et al. 2022, eq. 5): the mean squared log-sum-exp of
        # the router logits over this rank's tokens, which keeps the logits small
        z = torch.logsumexp(logits.float(), dim=-1).pow(2).mean()
        regulariser = self.cfg.aux_loss_coef * aux + self.cfg.z_loss_coef * z
        if torch.is_grad_enabled() and regulariser.requires_grad:
            # counted when the microbatch's backward passes here: once per training
            # microbatch, even when full recompute runs the forward twice
            count = functools.partial(self._count_step, counts, self.last_aux,
                                      self.last_dropped, z.detach())
            out = AuxLossGradient.apply(out, regulariser,
                                        self.aux_scale * self.regulariser_share, count)
        return out.view(shape)

    def _count_step(self, counts: torch.Tensor, aux: torch.Tensor, dropped: int,
                    z: torch.Tensor) -> None:
        step = self.step
        step.counts = counts if step.counts is None else step.counts + counts
        step.aux.append(aux)
        step.z.append(z)
        step.dropped += dropped

    @torch.no_grad()
    def update_expert_bias(self, counts: torch.Tensor) -> None:
        """Move each expert's bias by the rate against its load: down where `counts` (the
        step's assignments per expert, global) is above their mean, up where below."""
        load = counts.to(device=self.expert_bias.device, dtype=torch.float32)
        self.expert_bias.add_(torch.sign(load.mean() - load), alpha=self.cfg.expert_bias_rate)

    def take_step(self) -> StepStats:
        """This step's figures (`StepStats`); resets them for the next step."""
        taken, self.step = self.step, StepStats()
        return taken

    def _dispatch(self, tokens: torch.Tensor, chosen: torch.Tensor, weights: torch.Tensor,
                  keep: torch.Tensor | None) -> torch.Tensor:
        """Sort the assignments by expert (stable: token order within an expert), run the
        experts, and add each output, weighted, back to its token."""
        k = self.cfg.top_k
        token_of = torch.arange(tokens.shape[0], device=tokens.device).repeat_interleave(k)
        flat_weights = weights.flatten()
        if keep is not None:
            keep = keep.flatten()
            token_of, flat_weights = token_of[keep], flat_weights[keep]
        flat_experts = chosen.flatten()
        order = torch.argsort(flat_experts, stable=True)
        token_of = token_of[order]
        counts = torch.bincount(flat_experts, minlength=self.cfg.n_experts)
        outputs = self.run_experts(tokens[token_of], counts)
        return Combine.apply(outputs, flat_weights[order], token_of, tokens.shape[0])

    def _within_capacity(self, chosen: torch.Tensor) -> torch.Tensor | None:
        """Under a capacity factor each expert takes at most `expert_capacity` (ceil(cf * T *
        k / E)) of this rank's T tokens' assignments in this microbatch, earlier tokens first
        (Switch Transformer); None: dropless."""
        cf = self.cfg.capacity_factor
        if cf == 0:
            self.last_dropped = 0
            return None
        tokens, k = chosen.shape
        capacity = expert_capacity(tokens, k, self.cfg.n_experts, cf)
        flat = chosen.flatten()
        onehot = F.one_hot(flat, self.cfg.n_experts)
        position = (onehot.cumsum(0) * onehot).sum(-1) - 1  # place in its expert's queue
        keep = (position < capacity).view(tokens, k)
        self.last_dropped = int((~keep).sum())
        return keep

    def _global(self, counts: torch.Tensor) -> torch.Tensor:
        """Per-expert assignment counts over every rank of this microbatch step."""
        for group in (self.stats_group, self.shard_group):
            if group is not None and dist.get_world_size(group) > 1:
                counts = counts.clone()
                with WATCH.waiting("all_reduce (routing counts)", group):
                    dist.all_reduce(counts, group=group)
        return counts

    def _aux_loss(self, counts: torch.Tensor, probs: torch.Tensor,
                  local_tokens: int) -> torch.Tensor:
        """coef-free aux = E * sum_e f_e * P_e with f from the global counts (a constant) and
        P over this rank's tokens: averaged over the ranks, the global batch's value."""
        experts = self.cfg.n_experts
        share = counts.float() / counts.sum().clamp(min=1)  # f_e
        mean_prob = probs.sum(0) / max(local_tokens, 1)  # P_e (this rank's tokens)
        return experts * (share.detach() * mean_prob).sum()


def moe_layers(model: nn.Module) -> list[MoE]:
    return [m for m in model.modules() if isinstance(m, MoE)]


def update_expert_biases(model: nn.Module) -> None:
    """After an applied step: every block with a routing bias moves it by its step's counts
    (before the metrics take them)."""
    for layer in moe_layers(model):
        if layer.expert_bias is not None and layer.step.counts is not None:
            layer.update_expert_bias(layer.step.counts)


def set_aux_loss_scale(layers: list[MoE], scale: float) -> None:
    """The factor the engine applies to a microbatch's loss before backward (1/microbatches
    times fp16's loss scale): the aux loss's injected gradient gets the same. `layers`:
    the model's `moe_layers`, found once (a walk over the modules every step costs a dense
    model's host as much as its clipping)."""
    for layer in layers:
        layer.aux_scale = scale


def aux_loss_value(model: nn.Module) -> float:
    """coef * sum of the last forward's aux losses over this model (part)'s MoE blocks."""
    layers = moe_layers(model)
    return sum(float(m.last_aux) * m.cfg.aux_loss_coef for m in layers if m.last_aux is not None)
