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
    fp8_recipe     FP8 compute: the block linears' GEMMs (q/k/v, o, the MLP's or experts' up,
                   gate and down) run on FP8 tensor cores, their inputs scaled by this
                   recipe ("tensorwise": one scale a tensor, "rowwise": one a row); the
                   output layer, the MoE router and the attention core stay in
                   compute_dtype; "" (every preset but fp8): no FP8

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
    fp8            bf16's states, the block GEMMs in FP8 (tensorwise)    2 + 2 + 12

CPU default: fp32 (bf16 matmuls run 50-250x slower than fp32 on CPUs without AVX-512 BF16;
docs/precision.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from paraxis.spec.errors import ParaxisError

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
# How an FP8 GEMM's inputs are scaled: one scale per tensor or per row (torchao's float8
# training recipes; Micikevicius et al. 2022, "FP8 Formats for Deep Learning", Sec. 3).
FP8_RECIPES = ("tensorwise", "rowwise")


@dataclass(frozen=True)
class PrecisionPolicy:
    name: str
    param_dtype: str = "fp32"
    compute_dtype: str = "fp32"
    grad_dtype: str = "fp32"
    reduce_dtype: str = "fp32"
    master_weights: bool = False
    loss_scaling: bool = False
    fp8_recipe: str = ""

    def __post_init__(self) -> None:
        if self.fp8_recipe and self.fp8_recipe not in FP8_RECIPES:
            raise ParaxisError(f"precision {self.name}: fp8_recipe {self.fp8_recipe!r} is "
                               f"unknown; use {', '.join(FP8_RECIPES)}")
        for field in ("param_dtype", "compute_dtype", "grad_dtype", "reduce_dtype"):
            if getattr(self, field) not in DTYPE_BYTES:
                raise ParaxisError(f"precision {self.name}: {field} "
                                   f"{getattr(self, field)!r} is unknown; use "
                                   f"{', '.join(DTYPE_BYTES)}")
        if self.reduce_dtype != self.grad_dtype:
            # Gradients are reduced in the buffer they accumulate in (no cast copy per step).
            raise ParaxisError(f"precision {self.name}: reduce_dtype must equal grad_dtype")
        if self.grad_dtype == "fp32" and self.param_dtype != "fp32" \
                and not self.master_weights:
            raise ParaxisError(f"precision {self.name}: fp32 gradients of 16-bit parameters "
                               "need master_weights")

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
                f"{f', block GEMMs fp8 ({self.fp8_recipe})' if self.fp8_recipe else ''} "
                f"({self.param_bytes}+{self.grad_bytes}+{self.optimizer_bytes} bytes/param)")


FP32 = PrecisionPolicy("fp32")
BF16 = PrecisionPolicy("bf16", "bf16", "bf16", "bf16", "bf16", master_weights=True)
BF16_FP32GRAD = PrecisionPolicy("bf16-fp32grad", "bf16", "bf16", "fp32", "fp32",
                                master_weights=True)
FP16 = PrecisionPolicy("fp16", "fp16", "fp16", "fp16", "fp16", master_weights=True,
                       loss_scaling=True)
POLICIES = {p.name: p for p in (FP32, BF16, BF16_FP32GRAD, FP16)}
# bf16's states (fp32 masters and AdamW), the block GEMMs in FP8 with tensorwise scales.
# The planner prices it (plan/fp8.py); `paraxis train` runs the policies of POLICIES.
FP8 = PrecisionPolicy("fp8", "bf16", "bf16", "bf16", "bf16", master_weights=True,
                      fp8_recipe="tensorwise")
# Other names of a preset: "mixed" is the planner's older name of bf16 (ZeRO's "16 P").
ALIASES = {"mixed": "bf16"}


def autocast_policy(compute_dtype: str) -> PrecisionPolicy:
    """fp32 parameters, gradients and optimizer with 16-bit compute under autocast (what
    `--dtype` meant before the policies; fp16 still scales its loss): 4 + 4 + 8 bytes."""
    if compute_dtype == "fp32":
        return FP32
    return PrecisionPolicy(f"autocast-{compute_dtype}", compute_dtype=compute_dtype,
                           loss_scaling=compute_dtype == "fp16")


def get_policy(name: str | PrecisionPolicy, subject: str | None = None) -> PrecisionPolicy:
    """The preset called `name` or one of its `ALIASES` (a policy passes through); an unknown
    name's error starts with `subject` (default: `--precision NAME`)."""
    if isinstance(name, PrecisionPolicy):
        return name
    name = ALIASES.get(name, name)
    if name not in POLICIES:
        raise ParaxisError(f"{subject or f'--precision {name}'} is unknown; use "
                           f"{', '.join(POLICIES)}")
    return POLICIES[name]


# ------------------------------------------------ bytes per parameter, as the planner prices


@dataclass(frozen=True)
class Precision:
    """Bytes each parameter costs in parameters, gradients and optimizer states, and bytes
    per element of the activations the step computes in. A policy reduces gradients in
    their own dtype and gathers parameters in theirs, so grad_bytes and param_bytes are also
    the dp collectives' bytes per element (plan/comm.py), except that `fp8_weight_gather`
    gathers the FP8 linears' weights at 1 byte (plan/fp8.py)."""

    param_bytes: float
    grad_bytes: float
    optimizer_bytes: float
    activation_bytes: float = 2  # bf16/fp16 compute; 4 for fp32
    fp8_recipe: str = ""  # the block GEMMs in FP8 with these scales ("": none; plan/fp8.py)
    # ZeRO's gathers move the FP8 linears' weights cast to FP8 (torchao's
    # enable_fsdp_float8_all_gather, Megatron's --fp8-param-gather); paraxis's runtime
    # gathers bf16 weights
    fp8_weight_gather: bool = False

    @property
    def total_bytes(self) -> float:
        return self.param_bytes + self.grad_bytes + self.optimizer_bytes

    @classmethod
    def of(cls, policy: PrecisionPolicy) -> Precision:
        """The planner's view of a runtime policy."""
        return cls(policy.param_bytes, policy.grad_bytes, policy.optimizer_bytes,
                   activation_bytes=policy.compute_bytes, fp8_recipe=policy.fp8_recipe)


# ZeRO (Rajbhandari et al. 2020) Sec. 3.1: fp16 params and grads (2+2) plus fp32 master copy,
# momentum and variance (K = 12): the "16 P" rule, paraxis's bf16 policy.
MIXED_ADAM = Precision.of(BF16)
# Plain fp32 Adam: fp32 params and grads, momentum and variance (4+4+8).
FP32_ADAM = Precision.of(POLICIES["fp32"])
# The --precision choices of `paraxis plan`, `paraxis memory` and `paraxis report`: the
# runtime's policies and their aliases, and fp8.
PRECISIONS = {name: Precision.of(get_policy(name)) for name in (*POLICIES, *ALIASES)}
PRECISIONS[FP8.name] = Precision.of(FP8)
