"""Published runs held out from every fitting of the planner: the fitted / held-out split.

FITTED: the planner's A100 efficiency factors (paraxis/plan/hardware.py) were tuned on the
Megatron-LM rows of bench/validate_planner.py (Narayanan et al. 2021 Tables 1-2, Korthikanti
et al. 2022 Table 5 and Sec. 6.3), so those rows are the fitted set and their errors say how
well the model fits, not how well it predicts.

HELD OUT: the rows below. This file was committed before any fitting commit that could see
them, and no factor may be tuned on them. Every row of every table used is listed; a row the
planner cannot price (a precision, compiler or parallelism it does not model) stays in the
list with the reason, so nothing is picked for fitting well. Figures are copied from the
sources as printed (tokens per second per GPU); conversion to step time uses the source's
own convention (step = local batch x sequence length / tokens per second per GPU, since
every GPU of an FSDP/TP group processes its local batch at that rate).
"""

from __future__ import annotations

from dataclasses import dataclass

TORCHTITAN_A100 = ("torchtitan docs/performance.md at commit 0413364 (pytorch/torchtitan): "
                   "Llama 2 and Llama 3 with FSDP2 on 64 A100-80GB")
TORCHTITAN_H100 = ("torchtitan docs/performance.md at commit eaea6f6 (pytorch/torchtitan): "
                   "Llama 3.1 on H100 (96 GB HBM2e, 2.4 TB/s, 500 W power limit; 400 Gb/s "
                   "RDMA per GPU)")
FLOAT8 = "Float8 linears: FP8 tensor cores, a precision the planner does not model"
COMPILE = "torch.compile fuses the elementwise kernels: the planner models eager or Megatron-fused"
CONTEXT = "context parallelism (cp > 1) is not modelled by the planner"
ASYNC_TP = "AsyncTP overlaps TP collectives with GEMMs in the forward too: not modelled"


@dataclass(frozen=True)
class HeldOutRun:
    name: str
    model: str  # paraxis preset (paraxis/model_config.py)
    gpu: str  # "a100" or "h100-96gb"
    gpus: int
    dp: int  # FSDP degree (ZeRO-3 over it)
    tp: int
    pp: int
    local_batch: int  # sequences per GPU per step
    seq_len: int
    recompute: str  # paraxis's closest: none, selective, full
    tokens_per_gpu_s: float | None  # as published; None where the table reports OOM
    source: str
    where: str  # table and row
    unpriced: str = ""  # why the planner cannot price it ("" = priced)
    out_of_memory: bool = False  # the source reports this configuration ran out of memory
    schedule: str = "1f1b"


def _a100(name: str, model: str, batch: int, seq: int, recompute: str, wps: float | None,
          where: str, **extra: object) -> HeldOutRun:
    return HeldOutRun(name, model, "a100", 64, 64, 1, 1, batch, seq, recompute, wps,
                      TORCHTITAN_A100, where, **extra)  # type: ignore[arg-type]


def _h100(name: str, model: str, gpus: int, dp: int, tp: int, pp: int, batch: int, seq: int,
          recompute: str, tps: float, where: str, unpriced: str = "",
          schedule: str = "1f1b") -> HeldOutRun:
    return HeldOutRun(name, model, "h100-96gb", gpus, dp, tp, pp, batch, seq, recompute, tps,
                      TORCHTITAN_H100, where, unpriced, schedule=schedule)


# torchtitan "selective layer" checkpoints every other layer and "selective op" saves the
# matmul outputs: both keep more than Korthikanti's selective recompute (attention core
# only), which is paraxis's closest setting; "full" is full recompute.
HELD_OUT = [
    _a100("Llama 3 8B, sel. layer", "llama3-8b", 1, 8192, "selective", 2904,
          "Llama 3 table, row 8B / selective layer (MFU 56.8%)"),
    _a100("Llama 3 8B, sel. op", "llama3-8b", 1, 8192, "selective", 2973,
          "Llama 3 table, row 8B / selective op (MFU 58.2%)"),
    _a100("Llama 3 70B, full", "llama3-70b", 1, 8192, "full", 331,
          "Llama 3 table, row 70B / full (MFU 51.7%)"),
    _a100("Llama 2 13B, no AC", "llama2-13b", 2, 4096, "none", 2162,
          "Llama 2 table, row 13B / no (MFU 61.1%)"),
    _a100("Llama 2 13B, sel. layer", "llama2-13b", 2, 4096, "selective", 1914,
          "Llama 2 table, row 13B / selective layer (MFU 54.1%)"),
    _a100("Llama 2 13B, sel. op", "llama2-13b", 2, 4096, "selective", 1904,
          "Llama 2 table, row 13B / selective op (MFU 53.8%)"),
    _a100("Llama 2 70B, sel. op", "llama2-70b", 1, 4096, "selective", 355,
          "Llama 2 table, row 70B / 1 / selective op (MFU 50.8%)"),
    _a100("Llama 2 70B, full", "llama2-70b", 2, 4096, "full", 353,
          "Llama 2 table, row 70B / 2 / full (MFU 50.5%)"),
    _a100("Llama 2 70B, batch 2, sel. op", "llama2-70b", 2, 4096, "selective", None,
          "Llama 2 table, footnote 1: local batch 2 with selective checkpointing is OOM",
          out_of_memory=True),
    # H100, Table 1 (8 GPUs) and Table 3 (128 GPUs): Llama 3.1 8B, FSDP, local batch 2.
    _h100("Llama 3.1 8B FSDP x8", "llama3-8b", 8, 8, 1, 1, 2, 8192, "selective", 5762,
          "Table 1, row FSDP"),
    _h100("Llama 3.1 8B FSDP x8 compile", "llama3-8b", 8, 8, 1, 1, 2, 8192, "selective", 6667,
          "Table 1, row FSDP + torch.compile", COMPILE),
    _h100("Llama 3.1 8B FSDP x8 compile fp8", "llama3-8b", 8, 8, 1, 1, 2, 8192, "selective",
          8532, "Table 1, row FSDP + torch.compile + Float8", FLOAT8),
    _h100("Llama 3.1 8B FSDP x128", "llama3-8b", 128, 128, 1, 1, 2, 8192, "selective", 5605,
          "Table 3, row FSDP"),
    _h100("Llama 3.1 8B FSDP x128 compile", "llama3-8b", 128, 128, 1, 1, 2, 8192, "selective",
          6514, "Table 3, row FSDP + torch.compile", COMPILE),
    _h100("Llama 3.1 8B FSDP x128 compile fp8", "llama3-8b", 128, 128, 1, 1, 2, 8192,
          "selective", 8380, "Table 3, row FSDP + torch.compile + Float8", FLOAT8),
    # Table 2: FSDP + CP + compile + Float8, 8B, local batch 1, full checkpointing.
    _h100("Llama 3.1 8B CP1 32K", "llama3-8b", 8, 8, 1, 1, 1, 32768, "full", 3890,
          "Table 2, row FSDP 8, CP 1", FLOAT8),
    _h100("Llama 3.1 8B CP2 64K", "llama3-8b", 8, 4, 1, 1, 1, 65536, "full", 2540,
          "Table 2, row FSDP 4, CP 2", CONTEXT),
    _h100("Llama 3.1 8B CP4 128K", "llama3-8b", 8, 2, 1, 1, 1, 131072, "full", 1071,
          "Table 2, row FSDP 2, CP 4", CONTEXT),
    _h100("Llama 3.1 8B CP8 256K", "llama3-8b", 8, 1, 1, 1, 1, 262144, "full", 548,
          "Table 2, row FSDP 1, CP 8", CONTEXT),
    # Table 4: 70B, FSDP 32 x TP 8, local batch 16, full checkpointing, compile + Float8.
    _h100("Llama 3.1 70B 2D", "llama3-70b", 256, 32, 8, 1, 16, 8192, "full", 829,
          "Table 4, row 2D", FLOAT8),
    _h100("Llama 3.1 70B 2D AsyncTP", "llama3-70b", 256, 32, 8, 1, 16, 8192, "full", 876,
          "Table 4, row 2D + AsyncTP", ASYNC_TP),
    # Table 5: 405B, FSDP 8 x TP 8 x PP 8, local batch 32, global 256, full checkpointing.
    _h100("Llama 3.1 405B 3D 1F1B", "llama3-405b", 512, 8, 8, 8, 32, 8192, "full", 100,
          "Table 5, row 1F1B", FLOAT8),
    _h100("Llama 3.1 405B 3D interleaved", "llama3-405b", 512, 8, 8, 8, 32, 8192, "full", 128,
          "Table 5, row Interleaved 1F1B", FLOAT8, schedule="interleaved"),
    # Table 6: 405B, TP 8 x PP 8, local batch 8, full checkpointing, 1F1B.
    _h100("Llama 3.1 405B 4D CP1 32K", "llama3-405b", 512, 8, 8, 8, 8, 32768, "full", 76,
          "Table 6, row FSDP 8, CP 1", FLOAT8),
    _h100("Llama 3.1 405B 4D CP2 64K", "llama3-405b", 512, 4, 8, 8, 8, 65536, "full", 47,
          "Table 6, row FSDP 4, CP 2", CONTEXT),
    _h100("Llama 3.1 405B 4D CP4 128K", "llama3-405b", 512, 2, 8, 8, 8, 131072, "full", 31,
          "Table 6, row FSDP 2, CP 4", CONTEXT),
    _h100("Llama 3.1 405B 4D CP8 256K", "llama3-405b", 512, 1, 8, 8, 8, 262144, "full", 16,
          "Table 6, row FSDP 1, CP 8", CONTEXT),
]
