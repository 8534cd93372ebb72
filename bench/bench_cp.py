"""paraxis context-parallel attention next to PyTorch's ring attention template, gloo.

PyTorch's public `context_parallel` does not run on the CPU: it reaches attention through
DTensor's sharding rules, which know the CUDA flash, efficient and cuDNN ops but have no
strategy for the CPU flash op (`_scaled_dot_product_flash_attention_for_cpu`). Under it lies
`_templated_ring_attention` (and its `_backward`), a private API that takes the attention op
as an argument; driven by the CPU flash op it runs on gloo, and that is the peer here, wrapped
in an autograd function as DTensor's dispatch would call its two halves. Being private, it
may change or vanish in any PyTorch release.

Same work on both sides: causal attention, forward and backward, of one fixed random q, k, v
(and output gradient) split by the zig-zag balance, rank r holding chunks r and 2*cp-1-r of
2*cp (`paraxis.parallel.context.chunks.local_part`; PyTorch's template assumes the same
split, its `_HeadTailLoadBalancer`, which `check` confirms index by index). Pairs:

- paraxis "ring" (K/V passed one hop per step by isend/irecv, behind the compute) with the
  template rotating K/V by all-to-all, one permutation a step (`set_rotate_method("alltoall")`);
- paraxis "all_gather" (K/V gathered once per layer, again in backward) with the template's
  default, which gathers K/V once in forward and once in backward (`"allgather"`).

Both run the same flash kernel on the same blocks (for the diagonal step the whole local
sequence causal, for the others one rectangle below the diagonal) and merge them by
log-sum-exp; the template rotates dK/dV by all-to-all in backward under either setting.
The rows run on the CPU (gloo) even where GPUs are at hand: the peer is the CPU op's.
Before timing, `check` runs all four on the bench's inputs and compares each rank's output
and q, k, v gradients with unsharded `F.scaled_dot_product_attention`; the row's name
carries the largest difference.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.autograd.function import FunctionCtx

# Imported here, once: the ranks are forked from this process and inherit it.
from torch.distributed.tensor.experimental._context_parallel import _attention as torch_cp
from torch.distributed.tensor.experimental._context_parallel._load_balancer import (
    _HeadTailLoadBalancer,
)

from bench.common import Row, compare
from paraxis.dist.testing import run_distributed
from paraxis.parallel.context.attention import context_parallel_attention
from paraxis.parallel.context.chunks import local_part, positions

SEQ_DIM = 2  # q, k, v are (batch, heads, seq, head_dim)
HEAD_DIM = 64
PEER = "private API (torch.distributed.tensor.experimental._attention._templated_ring_attention"
PAIRS = {"ring": "alltoall", "all_gather": "allgather"}  # paraxis variant -> template rotation
TOLERANCE = 1e-4  # fp32, O(1) values: the largest difference seen was ~5e-6


class _TemplatedRing(torch.autograd.Function):
    """PyTorch's template, forward and backward, on the CPU flash op: what its DTensor
    dispatch (`_scaled_dot_product_ring_flash_attention` and its backward) does for the CUDA
    op, with the CPU op's arguments."""

    @staticmethod
    def forward(ctx: FunctionCtx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                group: dist.ProcessGroup, scale: float) -> torch.Tensor:
        out, lse = torch_cp._templated_ring_attention(
            group, SEQ_DIM, torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
            q, k, v, is_causal=True, dropout_p=0.0, scale=scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.scale = group, scale
        return out

    @staticmethod
    def backward(ctx: FunctionCtx, grad_out: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None, None]:
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = torch_cp._templated_ring_attention_backward(
            ctx.group, SEQ_DIM,
            torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
            grad_out=grad_out.contiguous(), grad_out_name="grad_out", query=q, key=k,
            value=v, out=out, logsumexp=lse, is_causal=True, dropout_p=0.0, scale=ctx.scale)
        return dq, dk, dv, None, None


def _attention(side: str) -> Callable[..., torch.Tensor]:
    """(q, k, v) -> this rank's output: "paraxis ring", "paraxis all_gather", or the
    template with rotation "alltoall" / "allgather"."""
    if side.startswith("paraxis "):
        variant = side.removeprefix("paraxis ")
        return lambda q, k, v: context_parallel_attention(q, k, v, None, variant)

    def templated(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        torch_cp.set_rotate_method(side)  # a module global, read when the call starts
        return _TemplatedRing.apply(q, k, v, dist.group.WORLD, HEAD_DIM ** -0.5)

    return templated


def _whole(seq: int, heads: int, kv_heads: int) -> list[torch.Tensor]:
    """q, k, v and the output gradient of the whole sequence, the same on every rank."""
    generator = torch.Generator().manual_seed(0)
    shapes = [(1, heads), (1, kv_heads), (1, kv_heads), (1, heads)]
    return [torch.randn(*shape, seq, HEAD_DIM, generator=generator) for shape in shapes]


def _local(whole: list[torch.Tensor]) -> list[torch.Tensor]:
    rank, cp = dist.get_rank(), dist.get_world_size()
    return [local_part(x, rank, cp, dim=SEQ_DIM).contiguous() for x in whole]


def _run(side: str, local: list[torch.Tensor]) -> list[torch.Tensor]:
    """One forward and backward: the output and the q, k, v gradients."""
    q, k, v = (x.detach().requires_grad_() for x in local[:3])
    out = _attention(side)(q, k, v)
    out.backward(local[3])
    return [out.detach(), q.grad, k.grad, v.grad]


def _setup(side: str, seq: int, heads: int, kv_heads: int) -> Callable[[], None]:
    local = _local(_whole(seq, heads, kv_heads))

    def step() -> None:
        _run(side, local)

    return step


SIDES = ("paraxis ring", "alltoall", "paraxis all_gather", "allgather")


def _errors_on_a_rank(cp: int, seq: int, heads: int, kv_heads: int,
                      sides: tuple[str, ...]) -> dict[str, float]:
    rank = dist.get_rank()
    order = _HeadTailLoadBalancer(seq, cp, "cpu")._generate_indices()[0]
    mine = order[rank * seq // cp:(rank + 1) * seq // cp]
    if not torch.equal(mine, positions(seq, rank, cp)):
        raise AssertionError(f"rank {rank}: torch's head-tail split holds {mine.tolist()}")
    whole = _whole(seq, heads, kv_heads)
    q, k, v = (x.clone().requires_grad_() for x in whole[:3])
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    out.backward(whole[3])
    want = _local([out.detach(), q.grad, k.grad, v.grad])
    local = _local(whole)
    return {side: max((got - w).abs().max().item()
                      for got, w in zip(_run(side, local), want, strict=True))
            for side in sides}


def check(cp: int, seq: int, heads: int, kv_heads: int,
          sides: tuple[str, ...] = SIDES) -> dict[str, float]:
    """Largest absolute difference, over ranks, output and q, k, v gradients, of each side
    from unsharded causal attention; raises if PyTorch's head-tail split is not paraxis's."""
    per_rank = run_distributed(_errors_on_a_rank, cp, (cp, seq, heads, kv_heads, sides),
                               timeout_s=900)
    return {side: max(r[side] for r in per_rank) for side in per_rank[0]}


def _setting(quick: bool) -> dict:
    """Sizes: (cp, kv_heads) pairs, 8 query heads; one full step is ~0.6 s on a quiet core."""
    if quick:
        return {"layouts": ((2, 4),), "seq": 256, "heads": 4, "steps": 2, "repeats": 1}
    return {"layouts": ((2, 8), (2, 2), (4, 8)), "seq": 4096, "heads": 8, "steps": 6,
            "repeats": 3}


def rows(quick: bool = False) -> list[Row]:
    s = _setting(quick)
    seq, heads, out = s["seq"], s["heads"], []
    for cp, kv_heads in s["layouts"]:
        errors = check(cp, seq, heads, kv_heads)
        worst = max(errors.values())
        if not worst <= TOLERANCE:
            raise AssertionError(f"cp={cp}, kv_heads {kv_heads}: a side differs from "
                                 f"unsharded attention by {errors}")
        for variant, rotation in PAIRS.items():
            work = (f"causal attention fwd+bwd cp={cp} {variant} ({heads} heads, {kv_heads} "
                    f"kv, head_dim {HEAD_DIM}, seq {seq}; outputs and grads within "
                    f"{worst:.0e} of unsharded)")
            out.append(compare(
                work, cp, seq,
                (f"paraxis {variant}",
                 lambda v=variant, h=kv_heads: _setup(f"paraxis {v}", seq, heads, h)),
                (f"{PEER}, rotate {rotation})",
                 lambda r=rotation, h=kv_heads: _setup(r, seq, heads, h)),
                steps=s["steps"], repeats=s["repeats"], device="cpu"))
    return out


if __name__ == "__main__":
    for row in rows(quick=True):
        print(row.to_dict())
