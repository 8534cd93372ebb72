"""What `paraxis calibrate` times on one rank: GEMMs, the attention core and the eager
elementwise kernels of a layer, and how many cores our ranks get on a shared CPU.

Every figure is an achieved rate at the shapes a training step uses, never a datasheet peak:
the planner prices a step with them at an efficiency of 1.0. Kernel times are the best of a
few repeats after a warm-up, in the dtype the runtime computes in (fp32 on CPU, bf16 on GPU).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from paraxis.kernels.activation import swiglu
from paraxis.model.transformer import Block, make_norm, rotary
from paraxis.plan.compute import layer_forward_traffic_per_token_eager
from paraxis.spec.model_config import ModelConfig


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_time(fn: Callable[[], object], device: torch.device, repeats: int = 5,
              warmup: int = 2) -> float:
    """Fastest of `repeats` calls of `fn`, in seconds (the device synchronised around each).

    The fastest, not the median: a kernel's rate is what it achieves when nothing else runs,
    and on a shared machine slower repeats mostly measure the neighbours (cache, a VM's
    stolen time). On a CPU the clock is this thread's CPU time: a rank computes with one
    thread, and a core's rate is wanted, not how often other processes took the core away
    (the planner models the sharing between our own ranks itself, plan/cost.py).
    """
    clock = time.thread_time if device.type == "cpu" else time.perf_counter
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync(device)
        started = clock()
        fn()
        sync(device)
        times.append(clock() - started)
    return min(times)


def gemm_shapes(cfg: ModelConfig, tokens: int) -> list[tuple[int, int, int]]:
    """(M, K, N) of one layer's GEMMs and the LM head at `tokens` rows: the forward X W of
    each weight (q, k, v, o, the MLP's, the head) and its two backward products
    (dX = dY W^T, dW = X^T dY)."""
    d, kv, ff = cfg.d_model, cfg.kv_dim, cfg.d_ff
    weights = [(d, d), (d, kv), (d, kv), (d, d), (d, ff), (ff, d), (d, cfg.vocab_size)]
    if cfg.style == "llama":
        weights.append((d, ff))  # SwiGLU's gate
    shapes = []
    for k, n in weights:
        shapes += [(tokens, k, n), (tokens, n, k), (k, tokens, n)]
    return shapes


def matmul_rate(shapes: list[tuple[int, int, int]], device: torch.device,
                dtype: torch.dtype, repeats: int = 5) -> dict:
    """Achieved FLOP/s over `shapes`: total FLOPs / total median time (a time-weighted mean,
    as a training step weighs them), and the rate of each shape."""
    total_flops = total_s = 0.0
    per_shape = []
    for m, k, n in shapes:
        a = torch.randn(m, k, device=device, dtype=dtype)
        b = torch.randn(k, n, device=device, dtype=dtype)
        seconds = best_time(lambda a=a, b=b: a @ b, device, repeats)
        flops = 2.0 * m * k * n  # one multiply-add per (m, k, n)
        total_flops, total_s = total_flops + flops, total_s + seconds
        per_shape.append({"shape": [m, k, n], "flops_per_s": flops / seconds})
    return {"flops_per_s": total_flops / total_s, "shapes": per_shape}


def attention_rate(batch: int, heads: int, seq_len: int, head_dim: int, device: torch.device,
                   dtype: torch.dtype, repeats: int = 3) -> float:
    """Achieved FLOP/s of the causal attention core (SDPA), forward + backward, counted as the
    planner counts it: 4 s h FLOPs per token forward (Narayanan et al. 2021 App.), 3x that
    with the backward, so planner FLOPs / this rate is the measured time."""
    shape = (batch, heads, seq_len, head_dim)
    q, k, v = (torch.randn(shape, device=device, dtype=dtype, requires_grad=True)
               for _ in range(3))
    grad = torch.ones(shape, device=device, dtype=dtype)

    def step() -> None:
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad)

    seconds = best_time(step, device, repeats)
    return 3 * 4.0 * seq_len * heads * head_dim * batch * seq_len / seconds


def elementwise_bandwidth(cfg: ModelConfig, batch: int, seq_len: int, device: torch.device,
                          dtype: torch.dtype, repeats: int = 5) -> float:
    """Achieved bytes/s of a layer's eager elementwise kernels, forward + backward, counted as
    the planner counts them (`layer_forward_traffic_per_token_eager`, 3x with the backward).

    Runs exactly the non-GEMM ops of a paraxis.model.transformer block at training shapes: the norms
    (make_norm), rotary (Llama), heads back to rows, the residual
    adds and the MLP activation, through autograd. A single mul/add kernel would overstate
    the rate: reductions, broadcasts, copies and the backward's accumulation are slower per
    byte, and they are what a step runs. On a CPU the same ops on one token take the time of
    their dispatch alone, which `layer_overhead` prices apart, so it is taken out here
    (time = fixed dispatch + bytes / bandwidth, through the two points).
    """
    seconds = _elementwise_seconds(cfg, batch, seq_len, device, dtype, repeats)
    # On a GPU the host runs ahead of the kernels: there the one-token time is not priced
    # apart (cost.layer_times), so nothing is taken out.
    dispatch = _elementwise_seconds(cfg, 1, 1, device, dtype, repeats) \
        if device.type == "cpu" else 0.0
    itemsize = torch.empty((), dtype=dtype).element_size()
    traffic = 3 * layer_forward_traffic_per_token_eager(cfg) * itemsize
    # bytes over the time beyond dispatch; never faster than the one-token time allows
    tokens = batch * seq_len - (1 if dispatch else 0)  # the one-token run is taken out
    return traffic * tokens / max(seconds - dispatch, seconds / (batch * seq_len))


def _elementwise_seconds(cfg: ModelConfig, batch: int, seq_len: int, device: torch.device,
                         dtype: torch.dtype, repeats: int) -> float:
    """Seconds of a block's elementwise ops, forward + backward (`elementwise_bandwidth`)."""
    h = cfg.d_model

    def leaf(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=device, dtype=dtype, requires_grad=True)

    norms = [make_norm(cfg).to(device=device, dtype=dtype) for _ in range(2)]
    x, y = leaf(batch, seq_len, h), leaf(batch, seq_len, h)
    heads = leaf(batch, cfg.n_heads, seq_len, cfg.head_dim)
    up, gate = leaf(batch, seq_len, cfg.d_ff), leaf(batch, seq_len, cfg.d_ff)
    kv = [leaf(batch, cfg.n_kv_heads, seq_len, cfg.head_dim)]

    def layer() -> None:
        outs = [norms[0](x), norms[1](y), x + y, x + y,
                heads.transpose(1, 2).reshape(batch, seq_len, h)]
        if cfg.style == "llama":
            outs += [rotary(heads, cfg.rope_theta), rotary(kv[0], cfg.rope_theta),
                     swiglu(gate, up)]
        else:
            outs.append(F.gelu(up, approximate="tanh"))
        torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])

    return best_time(layer, device, repeats)


def layer_overhead(cfg: ModelConfig, device: torch.device, dtype: torch.dtype,
                   repeats: int = 5) -> float:
    """Seconds one paraxis.model.transformer block takes, forward + backward, on a single
    token: what eager PyTorch spends dispatching its few dozen ops (Python, autograd, the kernel
    launch) whatever their size. A rank pays it per layer per microbatch however small its shard
    of the work, so for a small model split over many ranks it can rival the FLOPs."""
    block = Block(cfg).to(device=device, dtype=dtype)
    x = torch.randn(1, 1, cfg.d_model, device=device, dtype=dtype, requires_grad=True)
    return best_time(lambda: block(x).sum().backward(), device, repeats)


# ------------------------------------------------------------------- shared cores


def busy_share(seconds: float) -> float:
    """Run one thread of GEMMs for `seconds` of wall time; return the CPU seconds it got.

    Run on every core at once, the sum over ranks / wall time is how many cores our ranks
    actually get: the machine's cores, less what other processes on it are using.
    """
    torch.set_num_threads(1)
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    started, cpu_started = time.perf_counter(), time.process_time()
    while time.perf_counter() - started < seconds:
        a @ b
    return (time.process_time() - cpu_started) / (time.perf_counter() - started)
