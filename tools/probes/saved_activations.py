"""What the compiled forward keeps for the backward: paraxis's one-device engine (bf16)
beside bench/reference.py's compiled loop under bf16 autocast, tensor by tensor.

    python -m tools.probes.saved_activations [--width 256] [--layers 2] [--tokens 256]

On CPU, the Llama 3 8B preset cut to `--layers` layers and `--width` (heads and the MLP
scaled with it), a batch of 2 x `--tokens`: every tensor packed by
`torch.autograd.graph.saved_tensors_hooks` during one forward, after two warm-up steps
(the compiled graph's own saves included), by dtype and shape, with its MiB and the total.
"""

from __future__ import annotations

import argparse
import collections
import math

import torch

from bench import gpu
from bench.common import token_batch
from bench.reference import Reference
from paraxis.dist.groups import build_groups
from paraxis.parallelize import build_engine
from paraxis.spec.layout import Layout
from paraxis.spec.runtime_options import RuntimeOptions


def saved(forward, runs: int = 2) -> collections.Counter:
    """(dtype, shape) -> count of the tensors one `forward()` saves for its backward."""
    for _ in range(runs):
        forward().backward()
    kept: collections.Counter = collections.Counter()

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        kept[(tensor.dtype, tuple(tensor.shape))] += 1
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        forward()
    return kept


def report(side: str, kept: collections.Counter) -> None:
    total = 0
    print(f"\n{side}")
    for (dtype, shape), count in sorted(kept.items(), key=lambda item: -item[1]):
        size = math.prod(shape) * torch.empty((), dtype=dtype).element_size() * count
        total += size
        print(f"  {count:4d} x {str(dtype):15s} {shape}  {size / 2**20:.2f} MiB")
    print(f"{side}: {total / 2**20:.2f} MiB saved")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=256)
    args = parser.parse_args()
    if args.width < 32 or args.width % 32 or args.layers < 1 or args.tokens < 8:
        parser.error("give --width a multiple of 32, --layers >= 1 and --tokens >= 8")
    cfg = gpu.model(f"llama3-8b/{args.layers}").replace(
        d_model=args.width, n_heads=args.width // 32, n_kv_heads=max(1, args.width // 128),
        d_ff=args.width * 7 // 2, vocab_size=8000, max_seq_len=args.tokens)
    x, y = token_batch(cfg.vocab_size, 2, args.tokens, torch.device("cpu"))
    engine = build_engine(cfg, Layout(), build_groups(Layout()), torch.device("cpu"), seed=0,
                          options=RuntimeOptions(precision="bf16", compile=True))
    report("paraxis --compile (bf16)", saved(lambda: engine.loss(x, y)))
    reference = torch.compile(Reference(cfg))

    def autocast_forward() -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return reference(x, y)

    report("reference (bf16 autocast)", saved(autocast_forward))


if __name__ == "__main__":
    main()
