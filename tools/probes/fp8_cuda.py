"""FP8 GEMMs on a CUDA GPU against the CPU's emulation of the same casts and scales.

`paraxis.kernels.fp8.scaled_mm` runs `torch._scaled_mm` on compute capability 8.9 and up
and an emulation elsewhere (the CPU tests' reference). The suite's process hides the GPUs
(tests/conftest.py), so this probe is how the CUDA path gets checked: for each recipe and
shape (odd token counts too: the contraction dim is padded), the forward and both backward
GEMMs of `fp8_linear` on the GPU beside the same inputs on the CPU. Prints one line per
case and exits 1 when any relative difference passes 2e-2 (bf16 output rounding is 4e-3).

    python -m tools.probes.fp8_cuda
"""

from __future__ import annotations

import sys

import torch

from paraxis.kernels.fp8 import Fp8Gemm, fp8_linear, runs_on_tensor_cores

SHAPES = ((256, 512, 768), (1000, 768, 3072), (8192, 4096, 1024))  # tokens, in, out
LIMIT = 2e-2


def run_case(recipe: str, tokens: int, width: int, out: int, device: torch.device) -> float:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, width, generator=generator).to(torch.bfloat16)
    w = (torch.randn(out, width, generator=generator) / width ** 0.5).to(torch.bfloat16)
    g = torch.randn(tokens, out, generator=generator).to(torch.bfloat16)
    results = []
    for where in (device, torch.device("cpu")):
        xs, ws = (t.to(where, copy=True).requires_grad_() for t in (x, w))
        y = fp8_linear(xs, ws, None, Fp8Gemm(recipe))
        y.backward(g.to(where))
        results.append([t.detach().float().cpu() for t in (y, xs.grad, ws.grad)])
    return max(float((a - b).norm() / b.norm()) for a, b in zip(*results, strict=True))


def main() -> int:
    if not torch.cuda.is_available():
        print("needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    device = torch.device("cuda", 0)
    print(f"{torch.cuda.get_device_name(device)}, capability "
          f"{torch.cuda.get_device_capability(device)}, _scaled_mm: "
          f"{runs_on_tensor_cores(device)}, torch {torch.__version__}")
    worst = 0.0
    for recipe in ("tensorwise", "rowwise"):
        for shape in SHAPES:
            difference = run_case(recipe, *shape, device)
            worst = max(worst, difference)
            print(f"{recipe:10} tokens x in x out {shape}: GPU against CPU emulation, largest "
                  f"relative difference of y, dL/dx, dL/dW {difference:.2e}")
    return 0 if worst <= LIMIT else 1


if __name__ == "__main__":
    sys.exit(main())
