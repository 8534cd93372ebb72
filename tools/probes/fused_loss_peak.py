"""What the fused LM head and loss (`--fused-loss`, `linear_cross_entropy`) holds at its peak,
eager and compiled, on CPU: the bytes allocated during one forward and backward and alive at
once (`torch.profiler`'s memory events, `peak_memory.alive_at_peak`), in MiB and in chunks of
logits, beside the logits it never makes whole.

    python -m tools.probes.fused_loss_peak [--tokens 8192 --vocab 50257 --width 256]
    python -m tools.probes.fused_loss_peak --tokens 500 --vocab 2048 --width 32 --chunk-rows 100

(the second: tests/test_fused_loss.py's case, 5 chunks)
"""

from __future__ import annotations

import argparse

import torch

import paraxis.parallel.tensor.cross_entropy as kernel
from paraxis.parallel.tensor.cross_entropy import linear_cross_entropy
from tools.probes.peak_memory import alive_at_peak, cpu_events

MIB = 2**20


def inputs(tokens: int, vocab: int, width: int) -> tuple[torch.Tensor, torch.Tensor,
                                                         torch.Tensor]:
    """Activations, head weight and targets, seeded."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, width, generator=generator, requires_grad=True)
    w = (torch.randn(vocab, width, generator=generator) / width**0.5).requires_grad_()
    return x, w, torch.randint(0, vocab, (tokens,), generator=generator)


def peak_and_grads(x: torch.Tensor, w: torch.Tensor, targets: torch.Tensor, compiled: bool
                   ) -> tuple[int, tuple[torch.Tensor, torch.Tensor]]:
    """The peak bytes of one forward and backward (compiled before it is counted), and the
    gradients of x and w it left; x's and w's `.grad` are cleared again."""
    torch._dynamo.reset()
    loss = torch.compile(linear_cross_entropy, fullgraph=True) if compiled \
        else linear_cross_entropy
    loss(x, w, targets).backward()  # compiled here, outside the count
    x.grad = w.grad = None
    peak, _, _ = alive_at_peak(cpu_events(lambda: loss(x, w, targets).backward()))
    grads = x.grad, w.grad
    x.grad = w.grad = None
    return peak, grads


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--chunk-rows", type=int, default=0,
                        help="tokens a chunk (default: spec.kernels.chunk_rows of the vocab)")
    args = parser.parse_args(argv)
    if args.chunk_rows:
        kernel.chunk_rows = lambda width: args.chunk_rows
    rows = min(args.tokens, kernel.chunk_rows(args.vocab))
    chunk = rows * args.vocab * 4
    logits = args.tokens * args.vocab * 4
    print(f"{args.tokens} tokens x {args.vocab} logits (fp32 {logits / MIB:,.0f} MiB), width "
          f"{args.width}: chunks of {rows} tokens ({chunk / MIB:,.0f} MiB)")
    for compiled in (False, True):
        peak, _ = peak_and_grads(*inputs(args.tokens, args.vocab, args.width), compiled)
        print(f"  {'compiled' if compiled else 'eager'}: peak {peak / MIB:,.0f} MiB, "
              f"{peak / chunk:.1f} chunks")


if __name__ == "__main__":
    main()
