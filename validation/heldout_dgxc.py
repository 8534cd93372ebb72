"""NVIDIA's DGX Cloud benchmarking recipes as held-out runs (validation/heldout_runs.py).

NVIDIA/dgxc-benchmarking at commit 8f5cbb3 (release v25.02): each NeMo training recipe's
README publishes its step time and throughput at five to nine GPU counts on DGX H100 (8 x
400 Gb/s InfiniBand per node), BF16 and FP8. Every row of every table is copied verbatim
into validation/data/dgxc_benchmarking.md and read here; each run is priced as the recipe
ran it at the same commit: its yaml (NeMo 24.12), with what its configure.sh overrides on
the command line and in the environment:

- Megatron-Core with the distributed optimizer (`distributed_fused_adam` or
  `mcore_distributed_optim`: optimizer states sharded, ZeRO-1), `overlap_grad_sync` and
  `overlap_param_sync` (the parameter all-gather behind the next forward:
  `param_gather_overlap`), gradient buckets of the yaml's `bucket_cap_mb`;
- Transformer Engine: fused elementwise kernels and fused Adam; sequence parallelism
  wherever TP > 1; attention through FusedAttention (cuDNN, `attention_impl` "cudnn") where
  configure.sh sets NVTE_FUSED_ATTN=1 (GPT-3, Nemotron-4 15B, Llama 3.1), FlashAttention-2
  where it sets 0 (Nemotron-4 340B, Grok-1); `ub_tp_comm_overlap` (userbuffers: every TP
  collective pipelined with its GEMM, `tp_comm_overlap` "all") where the yaml or
  configure.sh sets it (all but Llama 3.1 8B, whose TP is 1);
- Nemotron-4 340B's BF16 runs with CP = 2 (configure.sh: `if DTYPE = bf16: CP=2`, which the
  README's header leaves out: half the data parallelism, twice the accumulation);
- activation checkpointing off, except Nemotron-4 340B's `selective`;
- AdamW's states as NeMo 24.12 stores them (nemo/collections/nlp/models/language_modeling/
  megatron_base_model.py, `setup_optimization`): `distributed_fused_adam` with bf16
  parameters keeps fp32 moments and only the 16 low bits of each fp32 master
  (`store_param_remainders`), 10 bytes a parameter, unless `fp8_params` is set (the FP8
  runs, and GPT-3's yaml for both precisions), which keeps whole masters: 12; Nemotron-4
  340B's optimizer `dtype: bf16` keeps bf16 moments and no master (4 bytes), a bf16 master
  too under `fp8_params` (6). Megatron-Core's own optimizer (`mcore_distributed_optim`:
  Nemotron-4 15B, Grok-1) keeps fp32 moments and master, 12. Under `fp8_params` the
  parameters are stored, so gathered, in FP8 (`fp8_weight_gather`);
- Grok-1's experts split over the tensor-parallel ranks (expert tensor parallelism defaults
  to TP in Megatron-Core 0.10, NeMo 24.12's), its tokens dispatched by the yaml's `alltoall`
  dispatcher: each TP rank sends its sequence-parallel shard, then the TP group all-gathers
  the received tokens (`expert_tp_dispatch` "sequence_shard"); every expert padded to its
  capacity at a capacity factor of 1 (`moe_pad_expert_input_to_capacity`), so each computes
  exactly the mean load.

Shapes as the configs give them: Nemotron-4 has grouped-query attention and a squared-ReLU
MLP without a gate, which ModelConfig cannot state together (its GPT-2 style ties kv heads to
heads): it is priced as a Llama-style block whose gated MLP has 2/3 of the width, the same
parameters, FLOPs and kept activations. Llama 3.1 405B runs with 16 query groups (the
config's `num_query_groups`). Vocabularies are padded to a multiple of 128 x TP, as
Megatron pads them. Grok-1's table gives DP = 1 beside EP = 2-8 at 8-32 GPUs, which
Megatron-Core cannot run (EP divides the data-parallel size): dp is the GPUs left after
tp x pp x cp, and the table's GBS and MBS give the accumulation. MaxText's table (JAX/XLA)
is listed, not priced.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

from paraxis.spec.model_config import PRESETS, ModelConfig
from validation.heldout_record import HeldOutRun

DGXC = ("NVIDIA/dgxc-benchmarking at commit 8f5cbb3 (v25.02): NeMo 24.12 training recipes on "
        "DGX H100, each README's performance table")
DGXC_TABLES = Path(__file__).parent / "data" / "dgxc_benchmarking.md"
MAXTEXT = "JAX/XLA (MaxText): a runtime the planner does not model; its remat policy not stated"

MIB = 2**20


@dataclasses.dataclass(frozen=True)
class Recipe:
    """What a recipe's yaml and configure.sh set (the README's tables give the degrees and
    batches)."""

    model: ModelConfig
    seq_len: int
    bucket_mb: int  # bucket_cap_mb; 0: not set, Megatron-Core's own rule (comm.py)
    attention: str  # NVTE_FUSED_ATTN=1: "cudnn"; 0: FlashAttention-2, "fa2"
    recompute: str = "none"
    # AdamW's bytes a parameter, BF16 runs and FP8 runs (fp8_params: whole masters)
    optimizer_bytes: tuple[float, float] = (10, 12)
    bf16_cp: int = 0  # configure.sh's CP for BF16 runs where the table's header leaves it out


def _padded(cfg: ModelConfig, tp: int) -> ModelConfig:
    step = 128 * tp  # make_vocab_size_divisible_by x TP
    return cfg.replace(vocab_size=math.ceil(cfg.vocab_size / step) * step)


def _nemotron(name: str, layers: int, d_model: int, heads: int, ffn: int) -> ModelConfig:
    return ModelConfig(name, "llama", 256000, layers, d_model, heads, 8, ffn * 2 // 3, 4096)


GROK = ModelConfig("grok-1", "llama", 131072, 64, 6144, 48, 8, 32768, 8192, n_experts=8,
                   top_k=2, d_ff_expert=32768, capacity_factor=1.0)

# README file -> its recipe (the yaml and configure.sh at the same commit)
RECIPES = {
    "nemo_megatron/README_175b.md": Recipe(PRESETS["gpt3-175b"].replace(vocab_size=50257),
                                           2048, 220, "cudnn", optimizer_bytes=(12, 12)),
    "nemotron/README_15b.md": Recipe(_nemotron("nemotron4-15b", 32, 6144, 48, 24576), 4096,
                                     100, "cudnn", optimizer_bytes=(12, 12)),
    "nemotron/README_340b.md": Recipe(_nemotron("nemotron4-340b", 96, 18432, 96, 73728),
                                      4096, 50, "fa2", "selective", optimizer_bytes=(4, 6),
                                      bf16_cp=2),
    "llama3.1/README_8b.md": Recipe(PRESETS["llama3-8b"], 8192, 75, "cudnn"),
    "llama3.1/README_70b.md": Recipe(PRESETS["llama3-70b"], 8192, 75, "cudnn"),
    "llama3.1/README_405b.md": Recipe(PRESETS["llama3-405b"].replace(n_kv_heads=16), 8192,
                                      125, "cudnn"),
    "grok1/README_314b.md": Recipe(GROK, 8192, 0, "fa2", optimizer_bytes=(12, 12)),
}


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def _degrees(header: str) -> dict[str, int]:
    return {key: int(value) for key, value in re.findall(r"\b(TP|PP|CP|VP|MBS|GA)=(\d+)", header)}


def _grok_layouts(lines: list[str]) -> dict[int, dict[str, int]]:
    """Grok-1's configuration table: GPUs -> its columns (VP "NA" read as 1)."""
    head = _cells(lines[0])
    return {int(cells[0]): {key: int(value) if value.isdigit() else 1
                            for key, value in zip(head, cells, strict=True)}
            for cells in map(_cells, lines[2:])}


def _named(file: str, header: str, gpus: int) -> tuple[str, str]:
    """A row's name ("Nemotron4 15b FP8 x64") and where it stands (file, table, column)."""
    table = header.split(" (")[0]
    title = table.replace(" BF16", "").replace("NeMo Megatron", "GPT-3 175B")
    return f"{title} x{gpus}", f"{file}, {table} table, {gpus} GPUs"


def _run(file: str, header: str, column: int, gpus: int, rows: dict[str, list[str]],
         layout: dict[str, int], precision: str) -> HeldOutRun:
    recipe = RECIPES[file]
    fp8 = precision == "FP8"
    tp, cp = layout["TP"], recipe.bf16_cp if recipe.bf16_cp and not fp8 else layout.get("CP", 1)
    pp = int(rows["PP"][column]) if "PP" in rows else layout.get("PP", 1)
    vp_cell = rows["VP"][column] if "VP" in rows else str(layout.get("VP", 1))
    vp = int(vp_cell) if vp_cell.isdigit() else 1
    layers = int(rows["Layers"][column]) if "Layers" in rows else layout.get(
        "Layers", recipe.model.n_layers)
    gbs = int(rows["GBS"][column]) if "GBS" in rows else layout["GBS"]
    seq = layout.get("SeqLen", recipe.seq_len)
    dp = gpus // (tp * pp * cp)
    cfg = _padded(recipe.model.replace(n_layers=layers, max_seq_len=seq), tp)
    tokens = float(rows["Throughput in tokens per second"][column]) / gpus
    name, where = _named(file, header, gpus)
    buckets = (("gradient_bucket_bytes", recipe.bucket_mb * MIB) if recipe.bucket_mb
               else ("gradient_bucket_rule", "megatron"))
    return HeldOutRun(
        name, cfg, "h100", gpus, dp, tp, pp, gbs // dp, seq, recipe.recompute, tokens, DGXC,
        where, micro_batch=layout["MBS"],
        zero=1, kernels="fused", attention_impl=recipe.attention, cp=cp,
        sequence_parallel=tp > 1,
        schedule="interleaved" if vp > 1 else "1f1b", virtual_stages=vp,
        ep=layout.get("EP", 1), etp=tp if recipe.model.is_moe else 1,
        optimizer_bytes=recipe.optimizer_bytes[fp8],
        network=(("tp_comm_overlap", "all"),
                 ("param_gather_overlap", True), buckets,
                 *((("expert_tp_dispatch", "sequence_shard"),) if recipe.model.is_moe else ())),
        **({"precision": "fp8", "fp8_recipe": "delayed", "fp8_weight_gather": True} if fp8
           else {}))  # type: ignore[arg-type]


def dgxc_rows(path: Path = DGXC_TABLES) -> list[HeldOutRun]:
    """One held-out run per GPU count of every performance table in the copied READMEs."""
    sections: dict[str, list[str]] = {}
    file = ""
    for line in path.read_text().splitlines():
        if line.startswith("## "):
            file = line[3:].strip()
            sections[file] = []
        elif line.startswith("|") and file:
            sections[file].append(line)
    runs = []
    for file, lines in sections.items():
        configs = _grok_layouts(lines[:11]) if file.startswith("grok1/") else {}
        # a table starts at its header: "<model> BF16|FP8 (...) | Throughput on N H100 GPUs"
        # (GPT-3's: "... | Nx H100 GPUs (GBS=...)"); Grok-1's layout table is not one
        tables = [i for i, line in enumerate(lines)
                  if (re.search(r"(BF16|FP8)", _cells(line)[0]) and "Throughput on" in line)
                  or "x H100 GPUs (GBS" in line]
        for start, end in zip(tables, [*tables[1:], len(lines)], strict=True):
            header = _cells(lines[start])
            rows = {cells[0]: cells[1:] for cells in map(_cells, lines[start + 2:end])}
            precision = "FP8" if "FP8" in header[0] else "BF16"
            for column, title in enumerate(header[1:]):
                gpus = int(re.search(r"(\d+)x? H100", title).group(1))  # type: ignore[union-attr]
                if file.startswith("maxtext/"):
                    runs.append(_maxtext(header[0], title, gpus, rows, column))
                    continue
                gbs = re.search(r"GBS=(\d+)", title)
                layout = configs.get(gpus) or {**_degrees(header[0]),
                                               **({"GBS": int(gbs.group(1))} if gbs else {})}
                runs.append(_run(file, header[0], column, gpus, rows, layout, precision))
    return runs


def _maxtext(header: str, title: str, gpus: int, rows: dict[str, list[str]],
             column: int) -> HeldOutRun:
    gbs = int(re.search(r"GBS=(\d+)", title).group(1))  # type: ignore[union-attr]
    tokens = float(rows["Throughput in tokens per second"][column]) / gpus
    fp8 = {"precision": "fp8"} if "FP8" in header else {}
    name, where = _named("maxtext/README_70b.md", header, gpus)
    return HeldOutRun(name, "llama3-70b", "h100", gpus, gpus, 1, 1, gbs // gpus, 8192,
                      "not stated", tokens, DGXC, where, MAXTEXT, micro_batch=2,
                      kernels="fused", **fp8)  # type: ignore[arg-type]
