"""GEMM and attention efficiency by shape on this GPU, beside the planner's model of them.

    python -m tools.probes.gpu_shapes [--out DIR]  # on a CUDA machine: bf16, full sizes
    python -m tools.probes.gpu_shapes --quick      # anywhere: tiny sizes, so the code cannot rot

The planner prices a GEMM at a fraction of the GPU's bf16 peak that
grows with the GEMM's narrower side (`plan.rates.gemm_efficiency`: two parameters fitted on
A100 training runs, carried to H100/H200 by their measured matmul ceilings) and the attention
core at FlashAttention-2's published rate by sequence length and head dim
(`plan.attention_rates.kernel_flops`, fitted on the FA2 paper's charts). Neither was ever
checked on a GPU of ours: this measures both on the GPU at hand and prints each measurement
beside the planner's figure for the same shape.

- GEMMs: M = 8192 rows (tokens) by narrower side w against 4w, both orders (the MLP's up
  and down projections), bf16, w from 512 to 16384. FLOPs 2 M K N.
- Attention: the FA2 paper's setup (16k tokens a batch, hidden 2048: 32 heads of 64 or 16 of
  128), causal and not, forward and backward of `scaled_dot_product_attention` on bf16 with
  the flash backend forced; FLOPs in the flash kernel's own count (`kernels.FLASH`:
  4 s^2 d per head and sequence forward, halved under a causal mask, backward 2.5x).

Each time is the fastest of a few repeats after a warm-up (`calibrate.kernels.best_time`),
each repeat enough back-to-back calls to last about 2 ms.
With `--out DIR` the tables go to DIR/gpu-shapes.md and the figures to DIR/gpu-shapes.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from paraxis.plan.attention_rates import kernel_flops
from paraxis.plan.hardware import GPU, build_cluster
from paraxis.plan.rates import gemm_efficiency
from paraxis.spec.kernels import FLASH
from paraxis.train.calibrate.kernels import best_time
from paraxis.train.run_hardware import gpu_for_device_name

FULL = {"rows": 8192, "widths": (512, 1024, 2048, 4096, 8192, 16384), "tokens": 16384,
        "hidden": 2048, "seq_lens": (512, 1024, 2048, 4096, 8192, 16384),
        "head_dims": (64, 128), "repeats": 10}
QUICK = {"rows": 64, "widths": (16, 32), "tokens": 128, "hidden": 32, "seq_lens": (32, 64),
         "head_dims": (16,), "repeats": 2}
TIMED_S = 2e-3  # about how long one timing of back-to-back calls lasts


@dataclass(frozen=True)
class Gemm:
    m: int
    k: int
    n: int
    seconds: float
    flops_per_s: float
    planner_flops_per_s: float | None  # the planner's rate for this shape on this GPU

    @property
    def width(self) -> int:
        return min(self.k, self.n)


@dataclass(frozen=True)
class Attention:
    seq_len: int
    head_dim: int
    heads: int
    batch: int
    causal: bool
    seconds: float  # forward and backward
    flops_per_s: float
    planner_flops_per_s: float | None


def seconds_per_call(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """The fastest of `repeats` timings, each of enough back-to-back calls to last about
    2 ms (a 30 us GEMM timed alone would mostly measure the launch and the synchronisation),
    divided by the calls."""
    once = best_time(fn, device, repeats=1, warmup=1)
    calls = max(1, min(1000, int(TIMED_S / max(once, 1e-9))))

    def batch() -> None:
        for _ in range(calls):
            fn()

    return best_time(batch, device, repeats=repeats, warmup=1) / calls


def gemm_flops(m: int, k: int, n: int) -> float:
    return 2.0 * m * k * n


def attention_flops(batch: int, heads: int, seq_len: int, head_dim: int, causal: bool) -> float:
    """Forward and backward FLOPs of the flash kernel (its own count, kernels.FLASH)."""
    forward = 4.0 * seq_len**2 * head_dim * heads * batch
    if causal:
        forward *= FLASH.causal_fraction
    return forward * (1 + FLASH.backward_ratio)


def measure_gemms(device: torch.device, dtype: torch.dtype, setting: dict,
                  gpu: GPU | None) -> list[Gemm]:
    cluster = build_cluster(gpu.name, 1, 1) if gpu else None
    rows, out = setting["rows"], []
    for width in setting["widths"]:
        for k, n in ((width, 4 * width), (4 * width, width)):
            a = torch.randn(rows, k, device=device, dtype=dtype)
            b = torch.randn(k, n, device=device, dtype=dtype)
            seconds = seconds_per_call(lambda a=a, b=b: a @ b, device, setting["repeats"])
            planned = gpu.peak_flops * gemm_efficiency(cluster, width) if gpu else None
            out.append(Gemm(rows, k, n, seconds, gemm_flops(rows, k, n) / seconds, planned))
    return out


def measure_attention(device: torch.device, dtype: torch.dtype, setting: dict,
                      gpu: GPU | None) -> list[Attention]:
    out = []
    for head_dim in setting["head_dims"]:
        heads = setting["hidden"] // head_dim
        for seq_len in setting["seq_lens"]:
            batch = max(1, setting["tokens"] // seq_len)
            for causal in (False, True):
                q, k, v = (torch.randn(batch, heads, seq_len, head_dim, device=device,
                                       dtype=dtype, requires_grad=True) for _ in range(3))
                grad = torch.randn(batch, heads, seq_len, head_dim, device=device, dtype=dtype)

                def step(q=q, k=k, v=v, grad=grad, causal=causal) -> None:
                    with _flash_only(device):
                        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    torch.autograd.grad(out, (q, k, v), grad)

                seconds = seconds_per_call(step, device, setting["repeats"])
                flops = attention_flops(batch, heads, seq_len, head_dim, causal)
                planned = (kernel_flops(gpu.name, gpu.peak_flops, "fa2", seq_len, head_dim,
                                        causal) if gpu else None)
                out.append(Attention(seq_len, head_dim, heads, batch, causal, seconds,
                                     flops / seconds, planned))
    return out


def _flash_only(device: torch.device):
    """The flash backend forced on CUDA (what the planner prices as FA2); on a CPU, SDPA's
    own choice (its flash kernel for these inputs)."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel(SDPBackend.FLASH_ATTENTION)


def run(quick: bool) -> dict:
    """Both sweeps on this machine's GPU (bf16), or with `quick` at tiny sizes on whatever
    device there is (fp32 on a CPU: a test that the code runs, not a figure to keep)."""
    cuda = torch.cuda.is_available()
    if not cuda and not quick:
        return {"skipped": "no CUDA device on this machine (torch.cuda.is_available() is "
                           "False); run `python -m tools.probes.gpu_shapes` on a GPU machine"}
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    gpu = gpu_for_device_name(name) if cuda else None
    setting = QUICK if quick else FULL
    return {"device": name, "preset": gpu.name if gpu else None,
            "peak_flops": gpu.peak_flops if gpu else None, "dtype": str(dtype),
            "torch": torch.__version__,
            "gemms": [asdict(g) for g in measure_gemms(device, dtype, setting, gpu)],
            "attention": [asdict(a) for a in measure_attention(device, dtype, setting, gpu)]}


def _tflops(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e12:.1f}"


def _share(value: float | None, peak: float | None) -> str:
    return "-" if value is None or not peak else f"{value / peak:.2f}"


def _ratio(measured: float, planned: float | None) -> str:
    return "-" if not planned else f"{measured / planned - 1:+.0%}"


def render(result: dict) -> str:
    if "skipped" in result:
        return f"GEMM and attention by shape: skipped ({result['skipped']})\n"
    peak = result["peak_flops"]
    lines = [f"# GEMM and attention efficiency by shape: {result['device']}", "",
             f"`python -m tools.probes.gpu_shapes` ({result['dtype']}, torch {result['torch']}); "
             f"planner preset {result['preset'] or 'none'}"
             + (f", bf16 peak {peak / 1e12:.0f} TFLOP/s." if peak else "."),
             "Measured against the planner: + means the GPU ran faster than priced.", "",
             "## GEMMs (M x K x N)", "",
             "| M x K x N | narrower side | measured TFLOP/s | of peak | planner TFLOP/s "
             "| of peak | measured vs planner |", "|---|---|---|---|---|---|---|"]
    for g in result["gemms"]:
        measured, planned = g["flops_per_s"], g["planner_flops_per_s"]
        lines.append(f"| {g['m']} x {g['k']} x {g['n']} | {min(g['k'], g['n'])} "
                     f"| {_tflops(measured)} | {_share(measured, peak)} | {_tflops(planned)} "
                     f"| {_share(planned, peak)} | {_ratio(measured, planned)} |")
    lines += ["", "## Attention core, forward + backward (flash kernel's FLOP count)", "",
              "| seq | head dim | heads x batch | causal | measured TFLOP/s | of peak "
              "| planner (FA2) TFLOP/s | measured vs planner |",
              "|---|---|---|---|---|---|---|---|"]
    for a in result["attention"]:
        measured, planned = a["flops_per_s"], a["planner_flops_per_s"]
        lines.append(f"| {a['seq_len']} | {a['head_dim']} | {a['heads']} x {a['batch']} "
                     f"| {'yes' if a['causal'] else 'no'} | {_tflops(measured)} "
                     f"| {_share(measured, peak)} | {_tflops(planned)} "
                     f"| {_ratio(measured, planned)} |")
    rows = [(g["flops_per_s"], g["planner_flops_per_s"]) for g in result["gemms"]]
    rows += [(a["flops_per_s"], a["planner_flops_per_s"]) for a in result["attention"]]
    errors = [math.log(m / p) for m, p in rows if p]
    if errors:
        spread = math.exp(math.sqrt(sum(e * e for e in errors) / len(errors))) - 1
        lines += ["", f"{len(errors)} shapes against the planner: rms of log(measured / "
                      f"planner) = {spread:.0%}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, any device")
    parser.add_argument("--out", type=Path, help="write gpu-shapes.md and .json here")
    args = parser.parse_args(argv)
    result = run(args.quick)
    text = render(result)
    print(text, end="")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu-shapes.md").write_text(text)
        (args.out / "gpu-shapes.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
