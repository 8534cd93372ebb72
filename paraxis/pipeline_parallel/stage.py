"""One pipeline stage's share of the model, under the single-device parameter names.

A `StageModule` has the attribute names of `paraxis.model.Transformer` but only the parts its
virtual stage owns: `blocks` (a subset, keyed by global block index, so parameters are named
`blocks.5.attn.q.weight` exactly as on one device), `tok_emb`/`pos_emb` on the first virtual
stage, `norm_f`/`lm_head`/`loss_fn` on the last. Because `init_parameter` draws a weight
from its global name alone, every stage starts from the single-device weights, and tensor
parallelism can be applied to a stage module as to the whole model.

GPT-2 ties the LM head to the token embedding. With pp > 1 they sit on different stages, so
the last stage holds its own copy (initialised from the name `tok_emb.weight`) marked
`pp_duplicate`; `TiedEmbedding` sums the two gradients after backward so both copies take
the same optimizer step and stay equal (Megatron's embedding group, Shoeybi et al. 2019).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from paraxis.model import Block, CrossEntropy, Transformer, init_parameter, make_norm
from paraxis.model_config import ModelConfig
from paraxis.pipeline_parallel.partition import Partition
from paraxis.runtime.distributed import collective_timeout
from paraxis.runtime.watchdog import WATCH, name_group


class StageBlocks(nn.ModuleList):
    """A ModuleList whose entries are registered under their global block index: iteration
    and len() behave like a list, parameter names match the full model."""

    def __init__(self, blocks: dict[int, nn.Module]) -> None:
        super().__init__()
        for index, block in blocks.items():
            self.add_module(str(index), block)

    def __getitem__(self, index):  # noqa: ANN001, ANN204 - position in this stage
        return list(self._modules.values())[index]

    def global_indices(self) -> list[int]:
        return [int(key) for key in self._modules]


class StageModule(nn.Module):
    def __init__(self, cfg: ModelConfig, block_indices: range, first: bool, last: bool
                 ) -> None:
        super().__init__()
        self.cfg = cfg
        self.is_first = first
        self.is_last = last
        if first:
            self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
            if cfg.learned_positions:
                self.pos_emb = nn.Embedding(cfg.max_seq_len, cfg.d_model)
        self.blocks = StageBlocks({i: Block(cfg) for i in block_indices})
        if last:
            self.norm_f = make_norm(cfg)
            self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
            if cfg.tied_embeddings and first:
                self.lm_head.weight = self.tok_emb.weight  # one stage holds both ends
            self.loss_fn = CrossEntropy()

    embed = Transformer.embed
    logits = Transformer.logits
    set_recompute = Transformer.set_recompute

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids (first stage) or the residual stream in; the residual stream or, on the
        last stage, the logits out."""
        if self.is_first:
            x = self.embed(x)
        for block in self.blocks:
            x = block(x)
        return self.logits(x) if self.is_last else x

    def tied_head_copy(self) -> nn.Parameter | None:
        """The last stage's copy of the tied embedding, if this stage holds one."""
        if self.is_last and not self.is_first and self.cfg.tied_embeddings:
            return self.lm_head.weight
        return None


def build_stage_modules(cfg: ModelConfig, partition: Partition, stage: int, seed: int = 0,
                        device: str | torch.device = "cpu",
                        dtype: torch.dtype = torch.float32) -> list[StageModule]:
    """This stage's chunks (one module per virtual stage it owns), initialised as the
    single-device model would be."""
    chunks = []
    for chunk in range(partition.virtual):
        module = StageModule(cfg, partition.blocks_of(stage, chunk),
                             partition.has_embedding(stage, chunk),
                             partition.has_head(stage, chunk))
        for name, param in module.named_parameters():
            init_parameter(name, param, cfg, seed)
        copy = module.tied_head_copy()
        if copy is not None:
            init_parameter("tok_emb.weight", copy, cfg, seed)
            copy.pp_duplicate = True  # counted once in the grad norm (runtime/params.py)
        chunks.append(module.to(device=device, dtype=dtype))
    return chunks


class TiedEmbedding:
    """Sums the tied embedding's gradient between the first and last stage of each pipeline.

    Every rank must construct it (group creation is collective); ranks that hold neither copy
    get `param=None` and do nothing in `all_reduce_grad`.
    """

    def __init__(self, cfg: ModelConfig, groups, chunks: list[StageModule]) -> None:  # noqa: ANN001
        self.group = None
        self.param: nn.Parameter | None = None
        layout = groups.layout
        if not cfg.tied_embeddings or layout.pp == 1:
            return
        for ranks in layout.groups("pp"):
            # new_group is collective over the world: every rank creates every pair in order
            group = dist.new_group([ranks[0], ranks[-1]], timeout=collective_timeout())
            name_group(group, "tied-embedding")
            if groups.rank in (ranks[0], ranks[-1]):
                self.group = group
        for module in chunks:
            if module.is_first:
                self.param = module.tok_emb.weight
            elif module.tied_head_copy() is not None:
                self.param = module.tied_head_copy()

    def all_reduce_grad(self) -> None:
        if self.param is None or self.group is None:
            return
        if self.param.grad is None:
            self.param.grad = torch.zeros_like(self.param)
        with WATCH.waiting("all_reduce", self.group):
            dist.all_reduce(self.param.grad, group=self.group)
