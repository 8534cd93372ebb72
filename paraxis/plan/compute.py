"""FLOPs of a training step: model FLOPs (for MFU) and hardware FLOPs (for HFU).

Narayanan et al. 2021 Sec. 5.1 (Appendix): a GPT step costs 96 B s l h^2 (1 + s/6h + V/16lh)
FLOPs with full recomputation. We count the same terms from the ModelConfig (so SwiGLU and
GQA blocks are priced by their real matrices) and keep recomputation apart: model FLOPs never
include it (MFU, Chowdhery et al. 2022 App. B), hardware FLOPs do (HFU).

The causal attention core: the planner counts the half of the s x s scores under the causal
mask (`CAUSAL_SHARE`), as Megatron-LM has counted since March 2025 (megatron/training/
training.py, `num_floating_point_operations`, commit 8873b55: "only half of the attention
matrix is non-zero"), and as the time model prices a flash kernel (it skips the masked half,
paraxis/spec/kernels.py). The older convention, full squares (PaLM's 6N + 12LHQT,
Chowdhery et al. 2022 App. B; Narayanan et al. 2021 eq. 3), is `causal=False`: the published
figures of those papers, and of the Llama 3 paper, which cites PaLM's definition, are in it.
Counting the full square while pricing half let a long-sequence plan report MFU above 100%
(llama3-8b at 131,072 tokens: 102%); with the causal count the model FLOPs never exceed what
the time model prices, so MFU <= HFU <= 1 (tests/test_plan_compute.py).

Document packing (paraxis.parallel.context.packing) changes neither count. Every input position is a
token here and in the training loop's tokens/s, masked targets included: their forward and backward
run like any other's, only their loss term is zero. Attention stays counted over the whole causal
window, though packing computes only the scores within documents (on CUDA; the CPU kernel computes
the whole square): `python -m tools.probes.packing` gives the share, which docs/data.md quotes. So
MFU is comparable between packed and unpacked runs of one shape.
"""

from __future__ import annotations

import functools

from paraxis.plan.activations import has_dropout
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import ModelConfig
from paraxis.spec.precision import Precision


def layer_forward_flops_per_token(cfg: ModelConfig, seq_len: int,
                                  index: int | None = None) -> tuple[float, float]:
    """(matmul FLOPs against the weights, attention-score FLOPs) of block `index`'s forward
    (None: the mean block). A mixture-of-experts block counts the weights one token passes
    through: the router, its top_k experts and the shared ones (`layer_params(active=True)`)."""
    # Narayanan et al. 2021 App.: 2 FLOPs per weight per token (one multiply-add) ...
    if index is None:
        weights = 2 * _active_block_params(cfg) / cfg.n_layers
    else:
        weights = 2 * cfg.layer_params(index, active=True)
    # ... and Q K^T plus scores x V: 2 * 2 * s * h per token (non-causal count, as the paper).
    scores = 4 * seq_len * cfg.d_model
    return weights, scores


@functools.lru_cache(maxsize=256)  # a layout search asks thousands of times
def _active_block_params(cfg: ModelConfig) -> int:
    return cfg.blocks_params(active=True)


def layer_gemm_shapes(cfg: ModelConfig, tp: int = 1,
                      mlp: bool = True) -> tuple[tuple[float, float], ...]:
    """(k, n) of each forward GEMM of one layer on one TP rank (m is the tokens): QKV and
    MLP-in split their outputs over tp, the output projection and MLP-down their inputs
    (Shoeybi et al. 2019 Sec. 3). 2 k n FLOPs per token each. Without `mlp`, the attention
    half alone (an MoE block's experts are priced in plan/experts.py)."""
    h, f = cfg.d_model, cfg.d_ff
    mlp_in = f if cfg.style == "gpt2" else 2 * f  # SwiGLU: gate and up
    attention = ((h, (h + 2 * cfg.kv_dim) / tp), (h / tp, h))
    return attention + ((h, mlp_in / tp), (f / tp, h)) if mlp else attention


# Share of the s x s attention scores a causal model counts (Megatron-LM since 2025).
CAUSAL_SHARE = 0.5
# A backward's FLOPs over its forward's: the input's and the weights' gradients, each a GEMM the
# size of the forward's (Narayanan et al. 2021 App.).
BACKWARD_FLOPS_RATIO = 2


def counted_forward_flops_per_token(cfg: ModelConfig, seq_len: int,
                                    causal: bool = True) -> tuple[float, float]:
    """(weights, attention core) forward FLOPs of one layer as the MFU count has them: the
    causal half of the scores, or (causal=False) the full square of PaLM and Narayanan 2021."""
    weights, scores = layer_forward_flops_per_token(cfg, seq_len)
    return weights, scores * (CAUSAL_SHARE if causal else 1.0)


def model_flops_per_token(cfg: ModelConfig, seq_len: int, causal: bool = True) -> float:
    """Training FLOPs (forward + backward, no recomputation) per token: the MFU numerator.
    `causal=False` counts the full attention square (PaLM, Narayanan 2021)."""
    weights, scores = counted_forward_flops_per_token(cfg, seq_len, causal)
    # Narayanan et al. 2021 App.: backward = 2x forward, so a step is 3x the forward;
    # the LM head adds 3 * 2 h V per token. A mixture of experts counts its active
    # parameters (router, top_k and shared experts), as Megatron-LM's
    # num_floating_point_operations does for MoE models.
    return (1 + BACKWARD_FLOPS_RATIO) * (cfg.n_layers * (weights + scores)
                                         + 2 * cfg.d_model * cfg.vocab_size)


def recompute_flops_per_token(cfg: ModelConfig, seq_len: int, recompute: str,
                              causal: bool = True) -> float:
    """Extra forward FLOPs per token that recomputation adds (hardware FLOPs only)."""
    weights, scores = counted_forward_flops_per_token(cfg, seq_len, causal)
    if recompute == "full":
        # Narayanan et al. 2021 App.: one more forward of every layer (72 -> 96 B s l h^2).
        return cfg.n_layers * (weights + scores)
    if recompute == "selective":
        # Korthikanti et al. 2022 Sec. 5: only the attention core is recomputed.
        return cfg.n_layers * scores
    return 0.0


def iteration_flops(cfg: ModelConfig, seq_len: int, global_batch: int,
                    recompute: str = "none", share: float = 1.0, causal: bool = True
                    ) -> dict[str, float]:
    """{"model", "hardware"} FLOPs of one step over `global_batch` sequences, `recompute`
    applying to `share` of the blocks (`stages.recomputed_share`)."""
    tokens = global_batch * seq_len
    model = model_flops_per_token(cfg, seq_len, causal) * tokens
    return {"model": model, "hardware": model + share * recompute_flops_per_token(
        cfg, seq_len, recompute, causal) * tokens}


def mfu(cfg: ModelConfig, seq_len: int, tokens_per_s: float, world_size: int,
        peak_flops: float) -> float:
    """Model FLOPs utilisation (Chowdhery et al. 2022 App. B): model FLOP/s over peak, with
    the causal count of the attention core (`CAUSAL_SHARE`)."""
    return model_flops_per_token(cfg, seq_len) * tokens_per_s / (world_size * peak_flops)


# How a runtime runs its elementwise ops (`GPU.kernels`): Megatron's fused kernels, or
# paraxis's own runtime, eager or under torch.compile.
ELEMENTWISE_KERNELS = ("fused", "eager", "compiled")
PARAXIS_KERNELS = ("eager", "compiled")


def layer_forward_traffic_per_token(cfg: ModelConfig, seq_len: int, tp: int = 1,
                                    sequence_parallel: bool = False, mlp: bool = True,
                                    dropout: bool | None = None) -> tuple[float, float]:
    """HBM bytes per token of one layer's memory-bound (non-GEMM) forward kernels on one GPU:
    (hidden-sized elementwise ops, attention-score ops). Each bf16 tensor read or written once.

    Counted like Korthikanti et al. 2022 Sec. 4.1 counts stored activations: 2 LayerNorms
    (read + write h: 8h bytes) and 2 dropout + residual adds (12h) sit outside the TP regions
    (split over tp only with SP); bias + GELU reads and writes the 4h MLP activation (16h,
    split over tp). The fused scale-mask-softmax reads and writes a*s scores (4as) and the
    attention dropout reads them, writes them and a 1-byte mask (5as), with a/tp heads per GPU.
    Without `mlp`, the MLP's own kernels are left out (an MoE block's: plan/experts.py).
    `dropout`: whether the block has it (`activations.has_dropout`; a runtime without it adds
    the residuals alone, 4h).
    """
    h, f = cfg.d_model, cfg.d_ff
    dropout = has_dropout(cfg, dropout)
    outside = 8 * h + (12 * h if dropout else 4 * h)
    inside = 4 * f if cfg.style == "gpt2" else 6 * f  # SwiGLU: read gate and up, write product
    inside *= mlp
    hidden = inside / tp + outside / (tp if sequence_parallel else 1)
    scores = (9 if dropout else 4) * cfg.n_heads / tp * seq_len
    return hidden, scores


def layer_forward_traffic_per_token_eager(cfg: ModelConfig, tp: int = 1,
                                          mlp: bool = True) -> float:
    """Elements read + written per token by one layer's non-GEMM forward kernels as eager
    PyTorch runs paraxis.model.transformer (one kernel per op, nothing fused), on one rank.

    Counted op by op from paraxis/model/transformer.py (h = d_model, q = query width,
    kv = key/value width,
    f = d_ff; q, kv, f split over tp): an out-of-place op reads its inputs and writes its
    output once. Llama: RMSNorm (pow, x * rsqrt, * weight: 6h) twice; rotary on q and k (mul,
    neg, cat, mul, add: 10 per element); heads back to rows (a copy, 2q; grouped K and V
    need no repeat, spec/kernels.py); two residual adds (3h each); SiLU (2f) and the gate
    product (3f). GPT-2: LayerNorm is one kernel (2h) twice, GELU one (2f); biases ride in
    the GEMMs. The attention core itself is priced by FLOPs (`attention_flops`). Without
    `mlp`, the MLP's activation and gate product are left out (plan/experts.py).
    """
    h, q, f = cfg.d_model, cfg.d_model / tp, cfg.d_ff / tp * mlp
    kv = cfg.kv_dim / tp
    if cfg.style == "gpt2":
        return 2 * h + 2 * q + 3 * h + 2 * h + 2 * f + 3 * h
    return 6 * h + 10 * (q + kv) + 2 * q + 3 * h + 6 * h + 5 * f + 3 * h


def head_forward_traffic_per_token_eager(cfg: ModelConfig, tp: int = 1) -> float:
    """Elements per token of the final norm and the loss (log-softmax over the vocabulary
    shard, then the target's entry): eager kernels, as the layer count above."""
    norm = 2 * cfg.d_model if cfg.style == "gpt2" else 6 * cfg.d_model
    return norm + 3 * cfg.vocab_size / tp


def own_gradients(layout: Layout, precision: Precision) -> bool:
    """Whether the step reads the parameters' own gradients, with no flat buffer of the
    reducer's (`engine.data_parallel.buckets`: nothing to reduce, and the gradients in the
    parameters' dtype): one rank of data, no ZeRO."""
    return (layout.dp * layout.cp == 1 and layout.zero == 0
            and precision.grad_bytes == precision.param_bytes)


@functools.lru_cache(maxsize=256)  # asked by every layout a search prices
def gathered_share(cfg: ModelConfig, tp: int, bucket_bytes: float, param_bytes: float,
                   etp: int = 1) -> float:
    """The share of a rank's parameters whose gradients the masters' step gathers into a
    flat copy where they are the parameters' own (`engine.data_parallel.masters`): all but
    the matrices of at least a gradient bucket, each a unit of its own
    (`buckets.make_buckets`), whose gradient is read where it is: the embedding and LM
    head, each block's projections and MLP matrices (split over tp), an MoE block's router
    and every expert's three matrices (routed and shared, split over `etp`)."""
    d, kv = cfg.d_model, cfg.kv_dim
    dense_mlp = [d * cfg.d_ff / tp] * (3 if cfg.style != "gpt2" else 2)
    experts = [d * cfg.d_ff_expert / etp] * 3 * (cfg.n_experts + cfg.n_shared_experts)
    moe_mlp = [d * cfg.n_experts, *experts]  # the router, whole on every rank
    attention = [m / tp for m in (d * d, d * kv, d * kv, d * d)]
    matrices = [cfg.vocab_size * d / tp] * (1 if cfg.tied_embeddings else 2)
    for index in range(cfg.n_layers):
        matrices += attention + (moe_mlp if cfg.is_moe_layer(index) else dense_mlp)
    alone = sum(m for m in matrices if m * param_bytes >= bucket_bytes)
    routed = cfg.n_moe_layers * (cfg.n_experts + cfg.n_shared_experts) * cfg.expert_params()
    router = cfg.n_moe_layers * d * cfg.n_experts
    held = (cfg.num_params() - routed - router) / tp + routed / etp + router
    return max(0.0, 1.0 - alone / held)


def optimizer_traffic_per_param(precision: Precision, kernels: str = "fused",
                                gathered: float = 0.0, one_pass: bool = True) -> float:
    """Memory bytes one AdamW step moves per parameter, gradient clipping included (about one
    FLOP per byte, so memory-bound; Kingma & Ba 2015 Alg. 1). The one place this count lives.
    `kernels`: how AdamW runs (`GPU.optimizer_kernel`; the elementwise settings "eager" and
    "compiled" stand for paraxis's runtime, "fused" for Megatron's).

    fused (Megatron/Apex multi-tensor Adam, the published runs): the gradient read twice (the
    global norm for clipping, then the update), the optimizer states (fp32 master, m, v) and
    the parameter each read and written: 32 B for mixed precision.

    foreach (torch.optim.AdamW's multi-tensor ops, one kernel per op): each op reads and
    writes whole fp32 tensors, 21 element passes (decay mul_ 2, lerp_ 3, mul_ + addcmul_ 6,
    sqrt / div / add_ 6, addcdiv_ 4), plus the gradient-norm read and the clipping mul_ (3
    passes of the gradient).

    paraxis (`engine.optimizer.adamw`): torch's fused AdamW kernel reads the fp32 weight, its
    fp32 gradient and both moments and writes back the weight and moments (28 B), around
    paraxis's own passes: the norm's read and the clipping multiply of fp32 gradients (40 B
    in fp32). fp32 masters of 16-bit parameters step in one pass (`kernels.master_adamw`):
    the gradient, master and moments read, master, moments and the 16-bit weight written,
    clipped inside, beside the norm's read: 30 B for bf16; where the gradients are the
    parameters' own (one rank, no ZeRO: `engine.data_parallel.masters`), the `gathered`
    share of them (`gathered_share`) copied into one flat gradient a unit first (4 B more a
    parameter for bf16). Without `one_pass` (CPU ranks: the pass is compiled on CUDA only),
    torch's fused kernel steps an fp32 copy of the gradients, writing the unscaled copy
    back, and the 16-bit weight is written after it: 2 + 6 + 32 + 6, 46 B for bf16.
    """
    kernels = "paraxis" if kernels in PARAXIS_KERNELS else kernels
    if kernels == "foreach":
        return 21 * 4 + 3 * precision.grad_bytes
    if kernels == "paraxis":
        norm = precision.grad_bytes
        if precision.optimizer_bytes <= 8:  # no masters: the fp32 weights are stepped
            return 4 * 4 + 3 * 4 + norm + 2 * precision.grad_bytes
        gather = 2 * precision.grad_bytes * gathered
        if not one_pass:
            to_fp32 = 0 if precision.grad_bytes == 4 else precision.grad_bytes + 4
            return norm + gather + to_fp32 + 4 * 4 + 4 * 4 + 4 + precision.param_bytes
        return norm + gather + precision.grad_bytes + 3 * 4 + 3 * 4 + precision.param_bytes
    return 2 * (precision.grad_bytes + precision.optimizer_bytes + precision.param_bytes)


def optimizer_time(layout: Layout, precision: Precision, kernels: str, stage_params: float,
                   experts: float, hbm_Bps: float, pipelined: bool,
                   optimizer: str = "auto", gathered: float = 1.0,
                   one_pass: bool = True) -> float:
    """Seconds of a stage's optimizer step, after the flush and the gradient sync: memory-bound,
    its bytes at memory bandwidth on this rank's share of the parameters (ZeRO-1+ shards the
    update over the replicas; Rajbhandari et al. 2020); `experts` shard over their own
    replicas. `pipelined`: ZeRO-2 under a pipeline keeps whole gradients, as ZeRO-1 does.
    kernels: the elementwise setting; optimizer: how AdamW runs (`GPU.optimizer_kernel`;
    "auto" follows `kernels`); gathered: `gathered_share`; one_pass: the masters' step as
    on CUDA, not as on CPU ranks (`optimizer_traffic_per_param`)."""
    replicas = layout.zero_ranks  # dp x cp, or one shard group of them
    shard = stage_params / (replicas if layout.zero >= 1 else 1)
    shard += experts / (replicas // layout.ep if layout.zero >= 1 else 1)
    # "auto": paraxis's AdamW beside paraxis's kernels, Megatron's fused Adam beside its own
    seconds = shard * optimizer_traffic_per_param(
        precision, kernels if optimizer == "auto" else optimizer,
        gathered=gathered if own_gradients(layout, precision) else 0.0,
        one_pass=one_pass) / hbm_Bps
    whole = layout.zero < 2 or layout.pp > 1 and (layout.zero == 3 or pipelined)
    if kernels in PARAXIS_KERNELS and whole:
        # paraxis's autograd adds each later microbatch's gradients into .grad (read 2, write 1);
        # ZeRO-2/3 add only their reduced shards, unless a pipeline keeps them whole
        seconds += (layout.microbatches - 1) * 3 * precision.grad_bytes \
            * (stage_params + experts) / hbm_Bps
    return seconds


# Kernels one transformer layer launches per microbatch, forward + backward, by runtime.
# "eager" and "compiled" (paraxis's runtime, one kernel per op and autocast's casts; its
# blocks under torch.compile) are measured on an H200 with both models cut to width 64
# (tools/probes/host_per_kernel.py; docs/gpu/README.md, "The fifth H200 run"): each model at
# its depth and at half, the difference over the blocks between them. GPT-2: 75.3 kernels a
# block eager and 55.3 compiled; the Llama slice: 86.2 and 48.2 (the compiled reference's
# blocks: 41.8 and 39.0). Those counts include the optimizer's casts of each gradient to fp32
# as one kernel a parameter (16 a GPT-2 block, 9 a Llama block); the runtime makes them one
# multi-tensor copy (engine/data_parallel/masters.py), launched from C++ in one loop, which
# the whole step's average host seconds a kernel (hardware.HOST_SECONDS_PER_KERNEL) may
# overstate, so the measured counts are kept until `tools/probes/gpu_session.sh host`
# measures that step. A compiled block launches its GEMMs, attention and the custom
# operators' kernels apart, and its elementwise ops in generated kernels between them.
# "fused" (Megatron-LM's kernels), counted from its GPT layer: forward 4 GEMMs, 2 layer
# norms, the attention kernel, 2 bias-dropout-adds and the bias-GeLU (10), backward twice
# the GEMMs and one kernel per fused op (20).
LAYER_KERNELS = {("eager", "gpt2"): 75, ("eager", "llama"): 86, ("compiled", "gpt2"): 55,
                 ("compiled", "llama"): 48, ("fused", "gpt2"): 30, ("fused", "llama"): 30}


def layer_kernels(cfg: ModelConfig, kernels: str) -> int:
    """Kernels one layer launches per microbatch, forward and backward (`LAYER_KERNELS`)."""
    return LAYER_KERNELS[(kernels, "gpt2" if cfg.style == "gpt2" else "llama")]

