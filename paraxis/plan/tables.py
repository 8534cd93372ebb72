"""Rich tables for `paraxis plan` and `paraxis memory` (humans; machines read --json)."""

from __future__ import annotations

from rich.table import Table

from paraxis.files.terminal import console as terminal_console
from paraxis.plan.cost import Estimate
from paraxis.plan.explain import states_fit
from paraxis.plan.hardware import GPU, Cluster
from paraxis.plan.search import SearchResult
from paraxis.plan.uncertainty import error_band
from paraxis.spec.model_config import ModelConfig
from paraxis.spec.units import GB, seconds


def print_plan(cfg: ModelConfig, cluster: Cluster, seq_len: int, global_batch: int,
               layouts: list[Estimate], lines: list[str],
               result: SearchResult | None) -> None:
    console = terminal_console()
    active = (f", {cfg.num_active_params() / 1e9:.3g}B active per token"
              if cfg.is_moe else "")
    console.print(f"[bold]{cfg.name}[/] ({cfg.num_params() / 1e9:.3g}B params{active}) on "
                  f"{cluster.world_size} x {cluster.gpu.name} ({cluster.nodes} node"
                  f"{'s' if cluster.nodes > 1 else ''} of {cluster.gpus_per_node}, "
                  f"{cluster.gpu.memory_bytes / GB:.0f} GB = "
                  f"{cluster.gpu.memory_bytes / 2**30:.0f} GiB each); global batch "
                  f"{global_batch} x {seq_len} tokens")
    if result is not None:
        console.print(f"priced {result.considered} layouts: {len(result.ranked)} fit, "
                      f"{len(result.too_big)} too big, {len(result.rule_breakers)} break a rule; "
                      f"{result.skipped} skipped, slower than all shown (their floor)")
    band = error_band(cluster)
    table = Table(show_lines=False, caption=f"step s: predicted; {band.name} ±{band.rms:.1%} "
                  f"RMS ({band.source})")
    # the K/V exchange's exposed seconds, where a layout splits sequences
    parts = ("tp", "cp", "pp", "dp") if any(e.layout.cp > 1 for e in layouts) else (
        "tp", "pp", "dp")
    if any(e.layout.ep > 1 for e in layouts):  # the MoE all-to-alls' seconds
        parts = ("tp", *parts[1:-1], "ep", "dp")
    for column in ("#", "layout", "mb", "GB/GPU", "compute s", *(f"{p} s" for p in parts),
                   "bubble s", "step s", "tokens/s", "MFU"):
        table.add_column(column, justify="left" if column == "layout" else "right")
    fastest = min(e.step_time_s for e in layouts)  # a small model's steps to their 1/100
    for i, e in enumerate(layouts, 1):
        t = e.time
        table.add_row(str(i), str(e.layout), str(e.micro_batch),
                      f"{e.memory['total'] / GB:.1f}" + ("" if e.fits else " ✗"),
                      *(seconds(t[p], fastest) for p in ("compute", *parts, "bubble", "step")),
                      f"{e.tokens_per_s:,.0f}", f"{e.mfu:.1%}")
    console.print(table)
    m = layouts[0].memory
    console.print("memory of #1 (GB/GPU, pipeline stage {:.0f}): ".format(m["stage"]) + ", ".join(
        f"{k} {m[k] / GB:.1f}" for k in ("params", "grads", "optimizer", "activations",
                                         "buffers", "reserved", "total")))
    for line in lines:
        console.print(f"• {line}", highlight=False)


def print_zero_table(num_params: float, gpus: int, rows: list[dict], gpu: GPU,
                     formulas: list[str]) -> None:
    """The ZeRO calculator's table; "fits" asks `explain.states_fit`: the states and the
    runtime's reserve within the GPU's memory, as the planner and the lab ask it."""
    count = (f"{num_params / 1e9:g}B" if num_params >= 1e9 else f"{num_params / 1e6:g}M"
             if num_params >= 1e6 else f"{num_params:,}")
    table = Table(title=f"{count} parameters on {gpus} GPUs: model states per GPU")
    memory = f"{gpu.memory_bytes / GB:.0f} GB ({gpu.memory_bytes / 2**30:.0f} GiB)"
    for column in ("stage", "shards", "formula", "params GB", "grads GB", "optimizer GB",
                   "total GB", f"fits {memory}?", "sent GB/step"):
        table.add_column(column, justify="left" if column in ("stage", "shards") else "right")
    shards = ["nothing", "optimizer states", "+ gradients", "+ parameters"]
    for row, shard, formula in zip(rows, shards, formulas, strict=True):
        table.add_row("baseline" if row["zero"] == 0 else f"ZeRO-{row['zero']}", shard, formula,
                      f"{row['params'] / GB:.4g}", f"{row['grads'] / GB:.4g}",
                      f"{row['optimizer'] / GB:.4g}", f"{row['total'] / GB:.4g}",
                      "yes" if states_fit(row["total"], gpu) else "no",
                      f"{row['traffic'] / GB:.4g} ({row['traffic'] / rows[1]['traffic']:.2g}x)"
                      if gpus > 1 else "0")
    table.caption = (f"fits: the states and the {gpu.reserved_bytes / GB:g} GB the runtime holds "
                     "back on every GPU; activations need room on top. sent: bytes each GPU "
                     "sends per step of one microbatch, ring collectives (ZeRO Sec. 7: the "
                     "parameters' size x (N-1)/N twice, ZeRO-3 three times)")
    terminal_console().print(table)
