"""paraxis tensor parallelism next to PyTorch's DTensor TP (`parallelize_module`), tp=2.

Same model (Llama style, untied head, grouped kv heads), same weights, same batch, gloo.
The peer uses the torchtitan plan: ColwiseParallel for q/k/v/gate/up, RowwiseParallel for
o/down, a vocab-parallel embedding (RowwiseParallel on the table) and a vocab-parallel head
with `loss_parallel` so it never gathers the logits either. Both steps are forward, backward
and fused AdamW (the peer: one optimizer for its DTensor shards, one for its plain
tensors, since one fused call takes only one kind); neither clips gradients,
since the peer has no global norm over mixed DTensor/Tensor gradients to match.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from bench.common import Row, compare, engine_step, rank_device, token_batch
from paraxis.dist.groups import build_groups
from paraxis.engine.data_parallel import DataParallelEngine
from paraxis.model.transformer import build_model
from paraxis.parallel.tensor import apply_tensor_parallel
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import PRESETS

MODEL = PRESETS["small-llama"].replace(n_layers=4)  # hidden 256, 8 heads / 4 kv heads
TP = 2


def _paraxis(batch: int, seq: int) -> Callable[[], None]:
    layout = Layout(tp=TP)
    groups = build_groups(layout)
    model = apply_tensor_parallel(build_model(MODEL, device=rank_device()), groups)
    engine = DataParallelEngine(model, layout, groups)  # dp=1: the engine build_engine makes
    x, y = token_batch(MODEL.vocab_size, batch, seq)
    return engine_step(engine, x, y)


class _TorchCrossEntropy(torch.nn.Module):
    """The peer's loss: F.cross_entropy, which `loss_parallel` runs on vocab-sharded DTensor
    logits (paraxis's own kernel takes plain tensors)."""

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float().flatten(0, -2), targets.flatten())


def _dtensor(batch: int, seq: int) -> Callable[[], None]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        loss_parallel,
        parallelize_module,
    )

    mesh = init_device_mesh(rank_device().type, (dist.get_world_size(),))
    model = build_model(MODEL, device=rank_device())
    plan = {"tok_emb": RowwiseParallel(input_layouts=Replicate()),
            "lm_head": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)}
    for i in range(MODEL.n_layers):
        for name in ("attn.q", "attn.k", "attn.v", "mlp.gate", "mlp.up"):
            plan[f"blocks.{i}.{name}"] = ColwiseParallel()
        for name in ("attn.o", "mlp.down"):
            plan[f"blocks.{i}.{name}"] = RowwiseParallel()
    parallelize_module(model, mesh, plan)
    model.loss_fn = _TorchCrossEntropy()  # loss_parallel's: F.cross_entropy on DTensors
    # fused AdamW, one per kind of parameter: a fused call cannot mix DTensor shards with
    # the plain tensors the plan leaves replicated (the norms)
    kinds = ([p for p in model.parameters() if isinstance(p, DTensor)],
             [p for p in model.parameters() if not isinstance(p, DTensor)])
    optimizers = [torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1, fused=True)
                  for params in kinds if params]
    x, y = token_batch(MODEL.vocab_size, batch, seq)

    def step() -> None:
        with loss_parallel():  # cross-entropy on vocab-sharded logits, no gather
            loss = model(x, y)
            loss.backward()
        for optimizer in optimizers:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)

    return step


def rows(quick: bool = False) -> list[Row]:
    batch, seq, steps = (2, 32, 2) if quick else (8, 256, 8)
    return [compare(f"tensor parallel tp={TP} ({MODEL.name}, 4 layers)", TP, batch * seq,
                    ("paraxis apply_tensor_parallel", lambda: _paraxis(batch, seq)),
                    ("DTensor parallelize_module", lambda: _dtensor(batch, seq)),
                    steps=steps, repeats=1 if quick else 4)]


if __name__ == "__main__":
    for row in rows(quick=True):
        print(row.to_dict())
