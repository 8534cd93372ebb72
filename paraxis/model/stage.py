"""One pipeline stage's share of the model: ordinary `Transformer` parts.

A stage owns one part per virtual stage (chunk): the blocks `partition.blocks_of(stage,
chunk)`, the embedding on the first virtual stage and the head on the last. Each part is a
`paraxis.model.transformer.Transformer` built with just those pieces, so its parameters carry their
single-device names (`blocks.5.attn.q.weight`), tensor parallelism applies to it as to the
whole model, and `init_parameter` gives it exactly the single-device weights.
"""

from __future__ import annotations

import torch

from paraxis.model.transformer import Transformer
from paraxis.spec.model_config import ModelConfig
from paraxis.spec.partition import Partition


def stage_parts(cfg: ModelConfig, partition: Partition, stage: int,
                device: str | torch.device = "meta") -> list[Transformer]:
    """This stage's parts, one per chunk, with no values yet on the meta device (the
    runtime fills them by name: `runtime.parallelize.materialize`)."""
    with torch.device(device):
        return [Transformer(cfg, blocks=partition.blocks_of(stage, chunk),
                            embed=partition.has_embedding(stage, chunk),
                            head=partition.has_head(stage, chunk))
                for chunk in range(partition.virtual)]
