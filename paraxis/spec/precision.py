"""The precision policy: which dtype each piece of the training state has, as one fact.

A run's mixed precision is four choices and two flags (Micikevicius et al., "Mixed Precision
Training", ICLR 2018; ZeRO, Rajbhandari et al. 2020, sec. 3.1):

    param_dtype    what the model's parameters are stored in (what forward reads)
    compute_dtype  what matmuls run in (autocast)
    grad_dtype     what gradients accumulate in, between microbatches
    reduce_dtype   what the dp collectives move (ZeRO-3 gathers param_dtype)
    master_weights an fp32 copy of the parameters that AdamW updates (in the ZeRO shard
                   where ZeRO shards the optimizer); the 16-bit parameters are cast from it
    loss_scaling   fp16's dynamic loss scale (engine/data_parallel/loss_scale.py)
    fp8_recipe     None, or how the FP8 GEMMs scale their operands: "tensorwise" (one
                   scale per tensor) or "rowwise" (one per row of each GEMM's operands)

The runtime (`engine.data_parallel`, `engine.pipeline_parallel`), the planner (through
`Precision`, below: bytes per parameter) and the metrics read the same `PrecisionPolicy`, so
the bytes the planner prices are the bytes paraxis holds (tests/test_precision.py counts
them). Dtypes are names here, not torch dtypes: the planner imports no torch (`torch_dtype`
maps them in the runtime).

Presets (bytes per parameter: params + grads + optimizer states):

    fp32           fp32 everything                                      4 + 4 + 8
    bf16           bf16 params/grads/reductions, fp32 masters and Adam  2 + 2 + 12 (16P)
    bf16-fp32grad  bf16 params, fp32 gradient accumulation/reduction    2 + 4 + 12
    fp16           as bf16 in fp16, with dynamic loss scaling           2 + 2 + 12
    fp8            as bf16, the blocks' GEMMs in FP8 (tensorwise)       2 + 2 + 12
    fp8-rowwise    as fp8, rowwise scales                               2 + 2 + 12

FP8 is a compute format (paraxis/kernels/fp8.py; Micikevicius et al., "FP8 Formats for Deep
Learning", 2022): every projection inside a block (`FP8_GEMMS`) casts its operands to FP8 for
its matmul, while parameters, gradients, masters, checkpoints and every other op keep the
bf16 policy's dtypes. The output layer and the MoE router stay in bf16 (`KEPT_GEMMS`).

CPU default: fp32 (bf16 matmuls run 50-250x slower than fp32 on CPUs without AVX-512 BF16;
docs/precision.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from paraxis.spec.errors import ParaxisError
from paraxis.spec.hashing import hash_once, state_unhashed
from paraxis.spec.model_config import ModelConfig

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
# FP8 scaling recipes (torchao's float8 training names them alike): one scale per tensor, or
# one per row along each GEMM's contraction dim.
FP8_RECIPES = ("tensorwise", "rowwise")
# The GEMMs an FP8 policy runs in FP8, as module-name patterns ("*": one name component):
# attention's q, k, v, o, the dense MLP's and every expert's and shared expert's up, gate,
# down. torchao's float8 training and Megatron's keep the output layer in 16 bits (its
# logits feed the loss's softmax over the whole vocabulary), and so does the MoE router,
# whose logits choose the experts.
FP8_GEMMS = ("blocks.*.attn.q", "blocks.*.attn.k", "blocks.*.attn.v", "blocks.*.attn.o",
             "blocks.*.mlp.up", "blocks.*.mlp.gate", "blocks.*.mlp.down",
             "blocks.*.moe.experts.*.up", "blocks.*.moe.experts.*.gate",
             "blocks.*.moe.experts.*.down",
             "blocks.*.moe.shared.up", "blocks.*.moe.shared.gate", "blocks.*.moe.shared.down")
KEPT_GEMMS = ("lm_head", "blocks.*.moe.router")  # in the compute dtype under FP8 too
# FP8 tensor cores (torch._scaled_mm): Ada (8.9) and Hopper (9.0) and later.
FP8_MIN_CAPABILITY = (8, 9)
# torch._scaled_mm needs both dims of its second operand and the contraction dim to be
# multiples of 16: every FP8 weight's rows and columns (the token dim is padded).
FP8_DIM_MULTIPLE = 16


@dataclass(frozen=True)
class PrecisionPolicy:
    name: str
    param_dtype: str = "fp32"
    compute_dtype: str = "fp32"
    grad_dtype: str = "fp32"
    reduce_dtype: str = "fp32"
    master_weights: bool = False
    loss_scaling: bool = False
    fp8_recipe: str | None = None

    def __post_init__(self) -> None:
        for field in ("param_dtype", "compute_dtype", "grad_dtype", "reduce_dtype"):
            if getattr(self, field) not in DTYPE_BYTES:
                raise ParaxisError(f"precision {self.name}: {field} "
                                   f"{getattr(self, field)!r} is unknown; use "
                                   f"{', '.join(DTYPE_BYTES)}")
        if self.reduce_dtype != self.grad_dtype:
            # Gradients are reduced in the buffer they accumulate in (no cast copy per step).
            raise ParaxisError(f"precision {self.name}: reduce_dtype must equal grad_dtype")
        if self.param_dtype != "fp32" and not self.master_weights:
            # AdamW on the 16-bit weights themselves would keep 16-bit moments and round away
            # every update below half a unit in the last place of its weight
            raise ParaxisError(f"precision {self.name}: 16-bit parameters need "
                               "master_weights (fp32 masters the optimizer steps)")
        if self.fp8_recipe is not None and self.fp8_recipe not in FP8_RECIPES:
            raise ParaxisError(f"precision {self.name}: fp8_recipe {self.fp8_recipe!r} is "
                               f"unknown; use {' or '.join(FP8_RECIPES)}")
        if self.fp8_recipe is not None and self.compute_dtype == "fp16":
            raise ParaxisError(f"precision {self.name}: FP8 GEMMs write bf16 or fp32, not "
                               "fp16 (torch._scaled_mm's rowwise kernels: bf16 only)")

    @property
    def fp8_gemms(self) -> tuple[str, ...]:
        """The module-name patterns of the GEMMs that run in FP8 (none without a recipe)."""
        return FP8_GEMMS if self.fp8_recipe is not None else ()

    @property
    def param_bytes(self) -> int:
        return DTYPE_BYTES[self.param_dtype]

    @property
    def grad_bytes(self) -> int:
        return DTYPE_BYTES[self.grad_dtype]

    @property
    def compute_bytes(self) -> int:
        """Bytes per element of the activations the step computes in."""
        return DTYPE_BYTES[self.compute_dtype]

    @property
    def optimizer_bytes(self) -> int:
        """AdamW's two fp32 moments, plus the fp32 master copy where there is one."""
        return 8 + (4 if self.has_masters else 0)

    @property
    def has_masters(self) -> bool:
        """Whether an fp32 copy exists besides the stored parameters (fp32 storage needs
        none: the parameters are the masters)."""
        return self.master_weights and self.param_dtype != "fp32"

    @property
    def total_bytes(self) -> int:
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes

    def describe(self) -> str:
        """One line: the dtypes and bytes per parameter."""
        return (f"{self.name}: params {self.param_dtype}, compute {self.compute_dtype}, "
                f"grads {self.grad_dtype}, masters "
                f"{'fp32' if self.has_masters else 'none'}"
                f"{', loss scaling' if self.loss_scaling else ''}"
                f"{f', FP8 block GEMMs ({self.fp8_recipe})' if self.fp8_recipe else ''} "
                f"({self.param_bytes}+{self.grad_bytes}+{self.optimizer_bytes} bytes/param)")


FP32 = PrecisionPolicy("fp32")
BF16 = PrecisionPolicy("bf16", "bf16", "bf16", "bf16", "bf16", master_weights=True)
BF16_FP32GRAD = PrecisionPolicy("bf16-fp32grad", "bf16", "bf16", "fp32", "fp32",
                                master_weights=True)
FP16 = PrecisionPolicy("fp16", "fp16", "fp16", "fp16", "fp16", master_weights=True,
                       loss_scaling=True)
POLICIES = {p.name: p for p in (FP32, BF16, BF16_FP32GRAD, FP16)}
# bf16's state with the blocks' GEMMs in FP8 (`FP8_GEMMS`): a policy of its own per recipe,
# as bf16-fp32grad is bf16's with fp32 gradients.
FP8 = PrecisionPolicy("fp8", "bf16", "bf16", "bf16", "bf16", master_weights=True,
                      fp8_recipe="tensorwise")
FP8_ROWWISE = PrecisionPolicy("fp8-rowwise", "bf16", "bf16", "bf16", "bf16",
                              master_weights=True, fp8_recipe="rowwise")
FP8_POLICIES = {p.name: p for p in (FP8, FP8_ROWWISE)}
# Every preset --precision takes: POLICIES (every GEMM in the compute dtype), the FP8 ones,
# and bf16 compute over fp32 state (`autocast_policy`).
PRESETS = {**POLICIES, **FP8_POLICIES}
# Other names of a preset: "mixed" for bf16, the mixed-precision AdamW of ZeRO's "16 P".
ALIASES = {"mixed": "bf16"}


def autocast_policy(compute_dtype: str) -> PrecisionPolicy:
    """fp32 parameters, gradients and optimizer with 16-bit compute under autocast (fp16
    scales its loss): 4 + 4 + 8 bytes."""
    if compute_dtype == "fp32":
        return FP32
    return PrecisionPolicy(f"autocast-{compute_dtype}", compute_dtype=compute_dtype,
                           loss_scaling=compute_dtype == "fp16")


# bf16 compute over fp32 parameters, gradients and AdamW (4 + 4 + 8 bytes): a plain PyTorch
# loop's autocast recipe, and torchtitan's under FSDP2's bf16 MixedPrecisionPolicy. The
# 16-bit weights exist only as the casts the forward and backward make, where `bf16` keeps
# them all step beside its fp32 masters: on one GPU the lighter of the two.
AUTOCAST_BF16 = autocast_policy("bf16")
PRESETS[AUTOCAST_BF16.name] = AUTOCAST_BF16


def get_policy(name: str | PrecisionPolicy, subject: str | None = None) -> PrecisionPolicy:
    """The preset called `name` or one of its `ALIASES` (a policy passes through); an unknown
    name's error starts with `subject` (default: `--precision NAME`)."""
    if isinstance(name, PrecisionPolicy):
        return name
    name = ALIASES.get(name, name)
    if name not in PRESETS:
        raise ParaxisError(f"{subject or f'--precision {name}'} is unknown; use "
                           f"{', '.join(PRESETS)}")
    return PRESETS[name]


def fp8_shape_problem(cfg: ModelConfig, tp: int = 1, etp: int = 1, precision: str = "fp8"
                      ) -> str | None:
    """Why `cfg`'s FP8 GEMMs cannot run at tensor-parallel degree `tp` (experts: `etp`) under
    `--precision precision`, in words naming the dimension and a fix; None when every weight
    dim, as each rank holds it, is a multiple of `FP8_DIM_MULTIPLE`."""
    m = FP8_DIM_MULTIPLE
    # (what, its width, the axis splitting it across ranks, that axis's degree)
    widths = [("d_model", cfg.d_model, "tp", 1),
              ("the attention width (heads x head_dim)", cfg.n_heads * cfg.head_dim, "tp", tp),
              ("the k/v width (kv_heads x head_dim)", cfg.kv_dim, "tp", tp)]
    if cfg.n_moe_layers < cfg.n_layers:  # a dense MLP somewhere
        widths.append(("d_ff", cfg.d_ff, "tp", tp))
    if cfg.is_moe:
        widths.append(("d_ff_expert", cfg.d_ff_expert, "etp", etp))
        if cfg.n_shared_experts:
            widths.append(("the shared experts' width (n_shared_experts x d_ff_expert)",
                           cfg.n_shared_experts * cfg.d_ff_expert, "etp", etp))
    for what, width, axis, split in widths:
        if (width // split) % m:
            on = (f" ({width} / {axis} {split} = {width // split} on each rank)"
                  if split > 1 else "")
            lower = f", or a lower {axis}" if split > 1 else ""
            return (f"--precision {precision} needs every weight dimension a multiple of {m}: "
                    f"{what} is "
                    f"{width}{on}; use a model whose {what} is a multiple of {m * split}"
                    f"{lower}, or --precision bf16")
    return None


def fp8_gather_problem(precision: str, zero: int | None, recipe: str | None = None
                       ) -> str | None:
    """Why `--fp8-weight-gather` cannot run with this precision and ZeRO stage (a sentence
    with the fix); None when it can: tensorwise FP8 (one scale per GEMM, which the gathered
    copy carries) and ZeRO-3 (which gathers weights). `recipe`: an FP8 recipe other than the
    precision's own (the planner's --fp8-recipe); `zero` None: not chosen yet."""
    recipe = recipe or get_policy(precision).fp8_recipe
    if recipe != "tensorwise":
        has = ("no FP8 GEMMs" if recipe is None else
               f"the {recipe} recipe: its scales are taken by each GEMM")
        return (f"--fp8-weight-gather gathers weights cast with one scale per GEMM "
                f"(--precision fp8); --precision {precision} has {has}; use --precision fp8 "
                "or drop --fp8-weight-gather")
    if zero is not None and zero != 3:
        return (f"--fp8-weight-gather is how ZeRO-3 gathers its weights; zero={zero} keeps "
                "them whole on every rank; use ZeRO-3 or drop --fp8-weight-gather")
    return None


def fp8_weights_regathered(recompute: str, reruns: bool = True) -> bool:
    """Whether ZeRO-3 gathers a block's weights gathered in FP8 again for the backward: only
    where full recompute runs the block's forward again (`reruns`: under the block method
    only the blocks it checkpoints do); otherwise the backward multiplies the copy autograd
    kept from the forward (runtime `zero.zero3_units`, planner
    `fp8.regather_bytes_per_param`)."""
    return recompute == "full" and reruns


# The fp32 masters' step (engine/data_parallel/masters.py, kernels/master_adamw.py) runs this
# many units a call: on CUDA one compiled graph launches their kernels (each unit adds its
# kernel's code generation to the compile, about a second on a CPU, so a model of many units
# takes a few calls of one graph); the gradients it gathers into one flat copy a unit (where
# they are the parameters' own) exist for a call's units at once
# (plan.memory.master_step_buffers).
MASTER_UNITS_A_CALL = 8


# ------------------------------------------------ bytes per parameter, as the planner prices


@dataclass(frozen=True)
class Precision:
    """Bytes each parameter costs in parameters, gradients and optimizer states, and bytes
    per element of the activations the step computes in. A policy reduces gradients in
    their own dtype and gathers parameters in theirs, so grad_bytes and param_bytes are also
    the dp collectives' bytes per element (plan/comm.py), except that `fp8_weight_gather`
    gathers the FP8 linears' weights at 1 byte (plan/fp8.py)."""

    __hash__ = hash_once  # a search hashes it in every cached price it asks for: once
    __getstate__ = state_unhashed

    param_bytes: float
    grad_bytes: float
    optimizer_bytes: float
    activation_bytes: float = 2  # bf16/fp16 compute; 4 for fp32
    # the block GEMMs' FP8 scaling: the policy's, or one the planner alone prices
    # (plan/fp8.py's PRICED_RECIPES); None: no FP8
    fp8_recipe: str | None = None
    # ZeRO's gathers move the FP8 linears' weights cast to FP8 (torchao's
    # enable_fsdp_float8_all_gather, Megatron's --fp8-param-gather; paraxis's runtime under
    # ZeRO-3 with --fp8-weight-gather)
    fp8_weight_gather: bool = False
    # what the matmuls run in: the GPU's rate for it (plan/rates.py: for_precision)
    compute_dtype: str = "bf16"

    @property
    def total_bytes(self) -> float:
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes

    @classmethod
    def of(cls, policy: PrecisionPolicy) -> Precision:
        """The planner's view of a runtime policy."""
        return cls(policy.param_bytes, policy.grad_bytes, policy.optimizer_bytes,
                   activation_bytes=policy.compute_bytes, fp8_recipe=policy.fp8_recipe,
                   compute_dtype=policy.compute_dtype)


# ZeRO (Rajbhandari et al. 2020) Sec. 3.1: fp16 params and grads (2+2) plus fp32 master copy,
# momentum and variance (K = 12): the "16 P" rule, paraxis's bf16 policy.
MIXED_ADAM = Precision.of(BF16)
# Plain fp32 Adam: fp32 params and grads, momentum and variance (4+4+8).
FP32_ADAM = Precision.of(POLICIES["fp32"])
# The --precision choices of `paraxis plan`, `paraxis memory` and `paraxis report`: the
# runtime's policies and their aliases.
PRECISIONS = {name: Precision.of(get_policy(name)) for name in (*PRESETS, *ALIASES)}
