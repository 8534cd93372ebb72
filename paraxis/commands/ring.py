"""`paraxis ring`: watch a ring all-reduce, one step at a time, in the terminal.

    paraxis ring --ranks 4            # 4 ranks, one element per chunk
    paraxis ring --ranks 4 --size 10  # uneven chunks (3, 3, 2, 2 elements)
"""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING

from paraxis.plan.ring_steps import (
    REDUCE_SCATTER,
    RingSimulation,
    RingStep,
    ring_all_reduce_time_s,
    simulate_ring,
)
from paraxis.spec.errors import ParaxisError

if TYPE_CHECKING:
    from rich.table import Table


# The largest ring worth watching step by step (16 ranks print in seconds; the work grows as
# N^3: `/usr/bin/time -f "%e s %M KB" paraxis ring --ranks 64` took 246 s and 1.1 GB on the
# loaded 2-core machine, 256 ranks 23 GB before the kernel killed it).
MAX_RANKS, MAX_SIZE = 16, 4096


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ranks", type=int, default=4, help="ranks on the ring (N)")
    parser.add_argument("--size", type=int, default=None,
                        help="elements in each rank's vector (default: N, one per chunk)")
    parser.add_argument("--bytes-per-element", type=int, default=4,
                        help="4 for fp32 gradients, 2 for bf16")
    parser.add_argument("--bandwidth-gbps", type=float, default=25.0,
                        help="link bandwidth B in GB/s for the cost line (25: the course's "
                             "worked example)")
    parser.add_argument("--latency-us", type=float, default=0.0,
                        help="per-step link latency in microseconds for the cost line")
    parser.add_argument("--message-gb", type=float, default=None,
                        help="also price an all-reduce of this many GB per rank")


def _cell(sim: RingSimulation, step: RingStep | None, rank: int, chunk: int) -> str:
    values = (step.values if step else sim.initial)[rank][chunk]
    owners = step.contributors[rank][chunk] if step else frozenset({rank})
    shown = ", ".join(f"{v:g}" for v in values[:3]) + (" …" if len(values) > 3 else "")
    who = "all" if len(owners) == sim.ranks else "+".join(f"r{o}" for o in sorted(owners))
    text = f"{shown}\n[dim]{who}[/]"
    if len(owners) == sim.ranks:
        text = f"[green]{text}[/]"
    if step and any(t.dst == rank and t.chunk == chunk for t in step.transfers):
        text = f"[bold]{text}[/]"
    return text


def _table(sim: RingSimulation, step: RingStep | None, title: str) -> Table:
    from rich.table import Table

    table = Table(title=title, title_justify="left", show_lines=True)
    table.add_column("rank")
    for c in range(sim.ranks):
        table.add_column(f"chunk {c}")
    for r in range(sim.ranks):
        table.add_row(f"r{r}", *(_cell(sim, step, r, c) for c in range(sim.ranks)))
    return table


def _check_costs(args: argparse.Namespace) -> None:
    """The cost line's inputs: a finite bandwidth above zero, no negative latency or size."""
    if not math.isfinite(args.bandwidth_gbps) or args.bandwidth_gbps <= 0:
        raise ParaxisError(f"--bandwidth-gbps {args.bandwidth_gbps} must be a positive number "
                           "of GB/s (25: the course's worked example)")
    if not math.isfinite(args.latency_us) or args.latency_us < 0:
        raise ParaxisError(f"--latency-us {args.latency_us} must be a number of microseconds "
                           "at least 0")
    if args.message_gb is not None and (not math.isfinite(args.message_gb)
                                        or args.message_gb <= 0):
        raise ParaxisError(f"--message-gb {args.message_gb} must be a positive number of GB; "
                           "leave it out to skip that line")
    if args.bytes_per_element < 1:
        raise ParaxisError(f"--bytes-per-element {args.bytes_per_element} must be at least 1 "
                           "(4 for fp32, 2 for bf16)")
    if args.size is not None and args.size < 1:
        raise ParaxisError(f"--size {args.size} must be at least 1 element (default: --ranks)")


def run(args: argparse.Namespace) -> int:
    from paraxis.files.terminal import console as terminal_console

    if args.ranks > MAX_RANKS or (args.size or 0) > MAX_SIZE:
        raise ParaxisError(f"--ranks {args.ranks} --size {args.size or args.ranks} is too big to "
                           f"watch: every step prints an N x N table (64 ranks already take "
                           f"minutes and a GB); use --ranks <= {MAX_RANKS} and --size <= "
                           f"{MAX_SIZE}, and `paraxis plan` for the cost at scale")
    _check_costs(args)
    console = terminal_console()
    sim = simulate_ring(args.ranks, size=args.size, bytes_per_element=args.bytes_per_element)
    n, x_bytes = sim.ranks, sim.size * sim.bytes_per_element
    console.print(f"[bold]Ring all-reduce[/] of {sim.size} elements ({x_bytes} B) on {n} "
                  f"ranks: {len(sim.steps)} steps = 2(N-1), reduce-scatter then all-gather. "
                  "Each cell: the chunk's values, and whose inputs are summed in it; "
                  "[bold]bold[/] = just received, [green]green[/] = fully reduced.")
    console.print(_table(sim, None, "before step 1: every rank holds its own vector"))
    for step in sim.steps:
        moves = ", ".join(f"r{t.src}→r{t.dst} c{t.chunk}" for t in step.transfers)
        action = "adds what it receives" if step.phase == REDUCE_SCATTER \
            else "keeps the finished chunk it receives"
        console.print(_table(
            sim, step, f"step {step.index}/{len(sim.steps)} · {step.phase}: each rank {action}"
                       f" · sent {step.total_bytes} B in all, at most {max(step.bytes_sent)} B"
                       f" per rank · {moves}"))
    expected = [sum(col) for col in zip(*(sum(r, ()) for r in sim.initial), strict=True)]
    agree = all(row == expected for row in sim.result)
    console.print(f"result on every rank equals the plain sum: "
                  f"{'[green]yes[/]' if agree else '[red]NO[/]'}")
    bandwidth = args.bandwidth_gbps * 1e9
    latency = args.latency_us * 1e-6
    console.print(
        f"bytes sent per rank: {sim.bytes_sent_per_rank} B  (2(N-1)·X/N = "
        f"{2 * (n - 1) * x_bytes / n:g} B; the (N-1)/N factor is why it barely grows with N)")
    console.print(
        f"time T = 2(N-1)·α + 2(N-1)·X/(N·B) (Patarasuk & Yuan 2009) at B = "
        f"{args.bandwidth_gbps:g} GB/s, α = {args.latency_us:g} µs: "
        f"{ring_all_reduce_time_s(x_bytes, n, bandwidth, latency) * 1e6:.4g} µs")
    if args.message_gb is not None:
        seconds = ring_all_reduce_time_s(args.message_gb * 1e9, n, bandwidth, latency)
        console.print(f"an all-reduce of {args.message_gb:g} GB per rank: {seconds:.4g} s")
    return 0
