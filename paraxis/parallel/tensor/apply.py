"""Turn a single-device model (or a pipeline stage of it) into its tensor-parallel shard.

The plan is data (torchtitan's `parallelize_module` plans are the model): a mapping from
submodule name patterns to how that submodule is split. `*` matches one name component
(`blocks.*.attn` matches `blocks.3.attn`, for a ModuleList or a ModuleDict of blocks).

    apply_tensor_parallel(model, groups, sequence_parallel=True)

transforms, in place, every submodule the plan names that the module holds, and skips the
rest. A pipeline stage is a part of the model (`Transformer(cfg, blocks=..., embed=...,
head=...)`) holding only some of the named modules. It runs on the meta device too (slicing
reads no values: `runtime.parallelize`). Parameter names do not change
(`blocks.0.attn.q.weight` is still there, now a slice), so checkpoints and optimizers see
the same names on every layout.

What the plan does per layer (Megatron-LM, Shoeybi et al. 2019, fig. 3): attention and MLP
each enter the TP region once and leave it once, so a layer costs 2 all-reduces forward and
2 backward; with sequence parallelism (Korthikanti et al. 2022, fig. 5) each all-reduce
becomes an all-gather before and a reduce-scatter after, and the norms between them run on
sequence shards.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist
from torch import nn

from paraxis.dist.groups import ParallelGroups
from paraxis.dist.params import is_tp_sharded
from paraxis.dist.watchdog import WATCH
from paraxis.parallel.tensor.comm import gather_for_replicated, scatter_to_sequence
from paraxis.parallel.tensor.cross_entropy import VocabParallelCrossEntropy
from paraxis.parallel.tensor.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    SequenceParallelNorm,
    SequenceShardedPositions,
    VocabParallelEmbedding,
    enter_tp_region,
    leave_tp_region,
)
from paraxis.parallel.tensor.partial import mark_partial_grad
from paraxis.spec.errors import ParaxisError
from paraxis.spec.expert_placement import experts_on_sequence_shards
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import ModelConfig


@dataclass(frozen=True)
class TPContext:
    group: dist.ProcessGroup | None
    size: int
    sequence_parallel: bool


class SplitStyle(Protocol):
    """How one submodule is split: returns its replacement (or the module itself)."""

    def apply(self, module: nn.Module, ctx: TPContext) -> nn.Module: ...


class Colwise:
    """Output features split across ranks; `enter_region` when no parent did it."""

    def __init__(self, enter_region: bool = False) -> None:
        self.enter_region = enter_region

    @staticmethod
    def split_dim(leaf: str) -> int | None:
        return ColumnParallelLinear.SPLIT_DIMS.get(leaf)

    def apply(self, module: nn.Module, ctx: TPContext) -> nn.Module:
        _check_divisible(module.weight.shape[0], ctx.size, f"{module.weight.shape[0]} output "
                         "features")
        return ColumnParallelLinear.from_linear(module, ctx.group, ctx.sequence_parallel,
                                                self.enter_region)


class Rowwise:
    """Input features split; partial outputs all-reduced (or reduce-scattered with SP), or
    left partial (`leave_region=False`) where the parent sums them once for several."""

    def __init__(self, leave_region: bool = True) -> None:
        self.leave_region = leave_region

    @staticmethod
    def split_dim(leaf: str) -> int | None:
        return RowParallelLinear.SPLIT_DIMS.get(leaf)

    def apply(self, module: nn.Module, ctx: TPContext) -> nn.Module:
        _check_divisible(module.weight.shape[1], ctx.size, f"{module.weight.shape[1]} input "
                         "features")
        if module.bias is not None and not self.leave_region:
            raise ParaxisError("a row-parallel linear whose partial outputs its parent sums "
                               "cannot take a bias (it would be added tp times); drop the bias")
        return RowParallelLinear.from_linear(module, ctx.group, ctx.sequence_parallel,
                                             self.leave_region)


class EnterRegion:
    """The module's input enters the TP region once, for all its column-parallel children
    (q, k, v share one all-reduce in backward; with SP, one all-gather forward)."""

    def apply(self, module: nn.Module, ctx: TPContext) -> nn.Module:
        return _around(module, lambda x: enter_tp_region(x, ctx.group, ctx.sequence_parallel))


class VocabParallel:
    """Embedding rows split by vocabulary; the sum over ranks is the lookup."""

    @staticmethod
    def split_dim(leaf: str) -> int | None:
        return VocabParallelEmbedding.SPLIT_DIMS.get(leaf)

    def apply(self, module: nn.Module, ctx: TPContext) -> nn.Module:
        _check_divisible(module.weight.shape[0], ctx.size,
                         f"vocab size {module.weight.shape[0]}",
                         "pad the vocabulary to a multiple of tp (paraxis does not pad)")
        return VocabParallelEmbedding.from_embedding(module, ctx.group, ctx.sequence_parallel)


class SequenceSharded:
    """A replicated module that runs on sequence shards with SP (norms, learned positions);
    unchanged without SP, where it sees the whole, replicated sequence."""

    def apply(self, module: nn.Module, ctx: TPContext) -> nn.Module:
        if not ctx.sequence_parallel:
            return module
        if isinstance(module, nn.Embedding):
            return SequenceShardedPositions(module, ctx.group)
        if isinstance(module, nn.LayerNorm | nn.RMSNorm):
            return SequenceParallelNorm(module, ctx.group)
        raise ParaxisError(f"cannot run {type(module).__name__} on sequence shards; the plan "
                           "supports LayerNorm, RMSNorm and position embeddings")


class WholeExperts:
    """A mixture of experts' block whose experts are whole on every tp rank (etp = 1).

    Without SP every rank holds the whole sequence and runs all of it: the ranks repeat
    each other's expert work. Under SP with dropless routing
    (`placement.experts_on_sequence_shards`) each rank routes and runs only its own sequence
    shard, as Megatron-Core does: no collective around the block and 1/tp of the expert work.
    The router's, experts' and shared experts' gradients then cover this rank's tokens: they
    are partial sums over tp, added once a step (`mark_partial_grad`); the routing counts
    are summed over the tp group too (`MoE.shard_group`), so every rank routes with one
    device's statistics; and the regulariser, whose mean probabilities are this rank's
    tokens', is injected at 1/tp (`regulariser_share`): its mean over the equal shards is
    one device's. Under a capacity factor the block's input is gathered (backward: this
    rank's chunk) and its output cut back to this rank's chunk (backward: all-gather), so
    every rank routes the whole sequence under one device's capacity."""

    def apply(self, module: nn.Module, ctx: TPContext) -> nn.Module:
        if not ctx.sequence_parallel:
            return module
        if experts_on_sequence_shards(ctx.size, True, 1, module.cfg.capacity_factor):
            for param in module.parameters():
                mark_partial_grad(param, ctx.group)
            module.shard_group = ctx.group
            module.regulariser_share = 1 / ctx.size
            return module
        return _around(module, lambda x: gather_for_replicated(x, ctx.group),
                       lambda y: scatter_to_sequence(y, ctx.group))


class ExpertsRegion:
    """A mixture of experts' block whose experts are split over tp (layout `etp` = tp;
    Megatron-Core's expert tensor parallelism): its input enters the TP region once (with SP
    gathered, so every rank routes the whole sequence as without TP) and its output leaves it
    once (summed over the ranks, reduce-scattered back to sequence shards with SP), as the
    dense MLP's do. Between the two each rank runs its slice of every expert, and of the
    shared experts, on the tokens routed there, so their outputs are partial sums, and so is
    each rank's gradient of the weights that combine them: the router's gradient is summed
    over tp once a step (`mark_partial_grad`), and the regulariser's gradient (aux and
    z-loss), whole on every rank, is injected at 1/tp on each (`regulariser_share`)."""

    def apply(self, module: nn.Module, ctx: TPContext) -> nn.Module:
        mark_partial_grad(module.router.weight, ctx.group)
        module.regulariser_share = 1 / ctx.size
        return _around(module, lambda x: enter_tp_region(x, ctx.group, ctx.sequence_parallel),
                       lambda y: leave_tp_region(y, ctx.group, ctx.sequence_parallel))


def _around(module: nn.Module, before: Callable[[torch.Tensor], torch.Tensor],
            after: Callable[[torch.Tensor], torch.Tensor] | None = None) -> nn.Module:
    """`module` with `before` applied to its first input and `after` to its output (hooks:
    the module's own forward is unchanged)."""
    module.register_forward_pre_hook(lambda _, args: (before(args[0]), *args[1:]))
    if after is not None:
        module.register_forward_hook(lambda _, args, output: after(output))
    return module


class VocabParallelLoss:
    """Cross-entropy on vocab-parallel logits (no full logits anywhere)."""

    def apply(self, module: nn.Module, ctx: TPContext) -> nn.Module:
        return VocabParallelCrossEntropy(ctx.group)


# The reference model's plan; `paraxis.model.transformer` names. Order matters only for the tie
# below.
PLAN: dict[str, SplitStyle] = {
    "tok_emb": VocabParallel(),
    "pos_emb": SequenceSharded(),
    "blocks.*.norm1": SequenceSharded(),
    "blocks.*.attn": EnterRegion(),
    "blocks.*.attn.q": Colwise(),  # heads split: rows of q are heads x head_dim
    "blocks.*.attn.k": Colwise(),  # grouped kv heads split the same way
    "blocks.*.attn.v": Colwise(),
    "blocks.*.attn.o": Rowwise(),
    "blocks.*.norm2": SequenceSharded(),
    "blocks.*.moe": WholeExperts(),  # router and experts replicated (no pattern below)
    "blocks.*.mlp": EnterRegion(),
    "blocks.*.mlp.up": Colwise(),
    "blocks.*.mlp.gate": Colwise(),
    "blocks.*.mlp.down": Rowwise(),
    "norm_f": SequenceSharded(),
    "lm_head": Colwise(enter_region=True),  # vocab-parallel logits
    "loss_fn": VocabParallelLoss(),
}


# With etp = tp: every expert and the shared experts split as the dense MLP is, inside one
# region around the block (`ExpertsRegion`); `tp_plan(split_experts=True)`.
EXPERTS_SPLIT: dict[str, SplitStyle] = {
    "blocks.*.moe": ExpertsRegion(),
    "blocks.*.moe.experts.*.up": Colwise(),
    "blocks.*.moe.experts.*.gate": Colwise(),
    "blocks.*.moe.experts.*.down": Rowwise(leave_region=False),
    "blocks.*.moe.shared.up": Colwise(),
    "blocks.*.moe.shared.gate": Colwise(),
    "blocks.*.moe.shared.down": Rowwise(leave_region=False),
}


def tp_plan(split_experts: bool = False) -> dict[str, SplitStyle]:
    """The plan: `PLAN`, with the experts split over tp where the layout's etp = tp."""
    return {**PLAN, **EXPERTS_SPLIT} if split_experts else PLAN


def tp_split_dim(name: str, plan: Mapping[str, SplitStyle] = PLAN) -> int | None:
    """The dim along which tensor parallelism splits parameter `name` (None: replicated),
    read off the plan, so offline tools (checkpoint conversion) shard as the runtime does."""
    module, _, leaf = name.rpartition(".")
    for text, style in plan.items():
        if _pattern(text).match(module):
            split = getattr(style, "split_dim", None)
            return split(leaf) if split is not None else None
    return None


def _pattern(text: str) -> re.Pattern[str]:
    return re.compile("^" + r"\.".join("[^.]+" if part == "*" else re.escape(part)
                                       for part in text.split(".")) + "$")


def _check_divisible(count: int, tp: int, what: str, fix: str | None = None) -> None:
    if count % tp:
        raise ParaxisError(f"{what} is not divisible by tp={tp}; "
                           f"{fix or 'choose a tp that divides it'}")


def find_config(model: nn.Module) -> ModelConfig | None:
    """The model's ModelConfig: on the Transformer, or on any Attention of a stage."""
    for module in model.modules():
        cfg = getattr(module, "cfg", None)
        if isinstance(cfg, ModelConfig):
            return cfg
    return None


def apply_tensor_parallel(model: nn.Module, groups: ParallelGroups | dist.ProcessGroup | None,
                          sequence_parallel: bool = False, split_experts: bool = False
                          ) -> nn.Module:
    """Split `model` in place for this rank's TP group and return it.

    `model` holds full single-device weights (every TP rank builds the same ones); each rank
    keeps its slice. `groups` is the runtime's ParallelGroups (its tp_group is used) or a
    process group. `split_experts`: the layout's etp = tp (`tp_plan`). With tp == 1 the model
    is returned unchanged.
    """
    group = groups.tp_group if isinstance(groups, ParallelGroups) else groups
    size = 1 if group is None else dist.get_world_size(group)
    if size == 1:
        return model
    cfg = find_config(model)
    if cfg is not None:  # one-line errors for shapes that do not split evenly
        Layout(tp=size, etp=size if split_experts else 1).validate(model=cfg)
    plan = tp_plan(split_experts)
    lm_head, tok_emb = getattr(model, "lm_head", None), getattr(model, "tok_emb", None)
    tied = lm_head is not None and tok_emb is not None and lm_head.weight is tok_emb.weight
    ctx = TPContext(group, size, sequence_parallel)
    compiled = [(_pattern(text), style) for text, style in plan.items()]
    for name, module in list(model.named_modules()):
        for pattern, style in compiled:
            if name and pattern.match(name):
                _replace(model, name, style.apply(module, ctx))
                break
    if tied:
        # GPT-2's head is the embedding transposed (Press & Wolf 2017): both shards are the
        # same vocab rows, so the head's shard is the embedding's shard, one Parameter.
        model.lm_head.weight = model.tok_emb.weight
    return model


def _replace(root: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    if getattr(parent, child) is not new:
        setattr(parent, child, new)


# ----------------------------------------------------------------- whole tensors back


def gather_full(tensor: torch.Tensor, param: torch.Tensor, group: dist.ProcessGroup | None
                ) -> torch.Tensor:
    """The full tensor from every TP rank's slice of `tensor` (a parameter or its grad),
    laid out as `param` is sharded; replicated ones come back as they are."""
    if group is None or not is_tp_sharded(param):
        return tensor.detach().clone()
    pieces = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    with WATCH.waiting("all_gather", group):
        dist.all_gather(pieces, tensor.detach().contiguous(), group=group)
    return torch.cat(pieces, dim=param.tp_shard_dim)


def full_state(model: nn.Module, group: dist.ProcessGroup | None, grads: bool = False
               ) -> dict[str, torch.Tensor]:
    """{name: full tensor} of every parameter (or its gradient), gathered over the TP group.
    Collective: every TP rank must call it."""
    out = {}
    for name, param in model.named_parameters():
        tensor = param.grad if grads else param
        if tensor is None:
            continue
        out[name] = gather_full(tensor, param, group)
    return out
