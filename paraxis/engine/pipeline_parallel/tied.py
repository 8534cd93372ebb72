"""The tied embedding across pipeline stages.

GPT-2 ties the LM head to the token embedding. With pp > 1 they sit on different stages, so
the last stage holds its own copy (`Transformer(..., embed=False, head=True)` marks it
`pp_duplicate`, initialised from the name `tok_emb.weight`); `TiedEmbedding` sums the two
gradients after backward so both copies take the same optimizer step and stay equal
(Megatron's embedding group, Shoeybi et al. 2019). In zb-v's V both ends of the model sit
on stage 0, in two of its chunks: the two copies are then summed on the rank itself.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn

from paraxis.dist.groups import ParallelGroups, new_groups
from paraxis.dist.watchdog import WATCH
from paraxis.model.transformer import Transformer


class TiedEmbedding:
    """Sums the tied embedding's gradient between the first and last stage of each pipeline.

    Every rank must construct it (group creation is collective); ranks that hold neither copy
    get `param=None` and do nothing in `all_reduce_grad`. Construct it after tensor
    parallelism has replaced the embedding and head modules.
    """

    def __init__(self, groups: ParallelGroups, parts: list[Transformer]) -> None:
        self.group: dist.ProcessGroup | None = None
        self.param: nn.Parameter | None = None
        self.local_pair: tuple[nn.Parameter, nn.Parameter] | None = None
        layout = groups.layout
        if not parts[0].cfg.tied_embeddings or layout.pp == 1:
            return
        copies = [part.tok_emb.weight if part.has_embedding else part.lm_head.weight
                  for part in parts if part.has_embedding or part.has_head]
        if layout.placement == "v":  # embedding and head both on stage 0: no group needed
            if len(copies) == 2:
                self.param, self.local_pair = copies[0], (copies[0], copies[1])
            return
        self.group = new_groups([[ranks[0], ranks[-1]] for ranks in layout.groups("pp")],
                                "tied-embedding")
        if copies:
            self.param = copies[0]  # the embedding, or the head's pp_duplicate copy

    def sum_grads(self, grad_of: Callable[[nn.Parameter], torch.Tensor]) -> None:
        """Sum the copies' gradients, read where the data-parallel engine keeps them
        (`grad_of`: fp32 gradients of bf16 parameters live in its flat buffers)."""
        if self.local_pair is not None:
            first, second = (grad_of(p) for p in self.local_pair)
            first.add_(second)
            second.copy_(first)
        elif self.param is not None and self.group is not None:
            self.all_reduce_grad(grad_of(self.param))

    def all_reduce_grad(self, grad: torch.Tensor | None = None) -> None:
        """Sum `grad` (default: the parameter's .grad) with the partner stage's copy."""
        if self.param is None or self.group is None:
            return
        if grad is None:
            if self.param.grad is None:
                self.param.grad = torch.zeros_like(self.param)
            grad = self.param.grad
        with WATCH.waiting("all_reduce", self.group):
            dist.all_reduce(grad, group=self.group)
