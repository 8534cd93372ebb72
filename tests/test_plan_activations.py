"""The planner's activation count of one layer against what paraxis's block keeps for its
backward, tensor by tensor, eager and compiled."""

from __future__ import annotations

import pytest
import torch

from paraxis.model.transformer import Block
from paraxis.plan.activations import layer_activation_bytes
from paraxis.spec.model_config import PRESETS

BATCH, SEQ = 2, 64


def kept_bytes(block: torch.nn.Module, run, x: torch.Tensor) -> int:
    """Bytes of the storages one forward of `run` saves for its backward, the block's
    parameters aside (views of one storage counted once)."""
    params = {p.untyped_storage().data_ptr() for p in block.parameters()}
    kept: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            kept[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        run(x)
    return sum(kept.values())


# Llama's eager block is left out here: on CPU, torch's RMSNorm is a composite of fp32 ops
# that keeps three fp32 tensors per norm (CUDA runs one fused kernel that keeps the input
# and the reciprocal RMS, as the compiled block does everywhere).
@pytest.mark.parametrize("name, compiled", [("tiny", False), ("tiny", True),
                                            ("tiny-llama", True)])
def test_a_block_keeps_what_the_planner_counts(name, compiled):
    """bf16, the flash kernel, no recompute: the attention kernel's output is the output
    projection's input (a view, no copy) and, with rotary positions, the rotated q and k
    are kept beside the q/k/v projection that v keeps alive; within the norms' statistics."""
    torch.manual_seed(0)
    cfg = PRESETS[name]
    block = Block(cfg).to(torch.bfloat16)
    # inductor's partitioner and decompositions, without its code generation
    run = torch.compile(block, backend="aot_eager_decomp_partition") if compiled else block
    x = torch.randn(BATCH, SEQ, cfg.d_model, dtype=torch.bfloat16, requires_grad=True)
    for _ in range(2):  # compiled: the graphs made before the count
        run(x).float().square().mean().backward()
    want = layer_activation_bytes(cfg, SEQ, BATCH, dropout=False)
    assert kept_bytes(block, run, x) == pytest.approx(want, rel=0.01)
