"""`paraxis context`: how context parallelism splits a sequence and moves K/V, in the
terminal and as pictures.

    paraxis context --cp 4 --seq-len 4096                  # the split and the ring, as text
    paraxis context --cp 4 --attention all_gather --out pictures/
    paraxis context --layout dp=2,cp=2,tp=2 --seq-len 4096 --out docs/img   # + the rank grid

Every number comes from `paraxis.spec.cp_balance`, the functions the runtime runs;
the pictures are `paraxis.show.viz.context` and `context_ring` (what `paraxis report` shows for a
layout with cp > 1). --out writes context-chunks-<attention>.png, context-<attention>.png
and, with --layout, context-grid.png; a layout with cp_a2a (two levels) draws its level
across, whose ranks are the all-to-all groups (context-*-across.png).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from paraxis.spec.cp_balance import (
    VARIANTS,
    check_split,
    gathered_blocks,
    gathered_chunks,
    pairs_per_rank,
    rank_chunks,
    ring_blocks,
    ring_source,
)
from paraxis.spec.errors import ParaxisError
from paraxis.spec.layout import Layout

DEFAULT_CP = 4
TOKENS_PER_RANK = 1024  # the default sequence: this many tokens per rank


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--cp", type=int, default=None, help=f"context-parallel ranks (default {DEFAULT_CP}, "
        "or the --layout's)")
    add("--seq-len", type=int, default=None,
        help=f"tokens per sequence, divisible by 2*cp (default {TOKENS_PER_RANK} per rank)")
    add("--attention", choices=VARIANTS, default=None,
        help="how K/V reach the queries (default ring, or the --layout's cp_attention)")
    add("--layout", default=None,
        help="take cp and the attention from this layout (e.g. dp=2,cp=2,tp=2) and also draw "
             "its rank grid")
    add("--gpus-per-node", type=int, default=8, help="for the rank grid's node boundaries")
    add("--out", default=None, metavar="DIR", help="write the pictures (PNG) into this folder")


MAX_CP = 64  # ranks to list and draw
MAX_SEQ_LEN = 1 << 24  # 16M tokens: the pairs are counted exactly, in Python


def resolve(args: argparse.Namespace) -> tuple[int, str, int, Layout | None]:
    """(cp, attention, seq_len, layout or None) from the flags, checked."""
    layout = Layout.parse(args.layout) if args.layout else None
    cp, attention = args.cp, args.attention
    if layout is not None:
        for flag, given, own in (("--cp", cp, layout.cp),
                                 ("--attention", attention, layout.cp_attention)):
            if given is not None and given != own:
                raise ParaxisError(f"{flag} {given} disagrees with the layout's {own}; give "
                                   f"one of {flag} and --layout")
        cp, attention = layout.cp, layout.cp_attention
    cp = DEFAULT_CP if cp is None else cp
    attention = attention or VARIANTS[0]
    if not 1 <= cp <= MAX_CP:
        raise ParaxisError(f"--cp must be within 1..{MAX_CP} (a picture per rank), got {cp}")
    seq_len = args.seq_len if args.seq_len is not None else TOKENS_PER_RANK * cp
    if not 1 <= seq_len <= MAX_SEQ_LEN:
        raise ParaxisError(f"--seq-len must be within 1..{MAX_SEQ_LEN:,}, got {seq_len}")
    check_split(seq_len, cp)
    if args.gpus_per_node < 1:
        raise ParaxisError(f"--gpus-per-node {args.gpus_per_node} must be at least 1 (8 on a "
                           "DGX node)")
    return cp, attention, seq_len, layout


def describe(cp: int, attention: str, seq_len: int, a2a: int = 1) -> str:
    """The split, each rank's pairs, and each step's (or the gather's) kernel calls, as text;
    with `a2a` > 1 (two-level cp), its two levels."""
    from paraxis.show.viz.context import contiguous_pairs

    chunk_len = check_split(seq_len, cp)
    pairs, contiguous = pairs_per_rank(seq_len, cp), contiguous_pairs(seq_len, cp)
    mean = sum(pairs) / cp
    lines = [f"context parallelism, cp={cp}: {seq_len} tokens in {2 * cp} chunks of "
             f"{chunk_len}; rank i holds chunks i and {2 * cp - 1}-i",
             f"{'rank':<6}{'chunks':<10}{'tokens':<24}(query, key) pairs per head, forward"]
    for rank in range(cp):
        chunks = rank_chunks(rank, cp)
        tokens = ", ".join(f"{c * chunk_len}-{(c + 1) * chunk_len - 1}" for c in chunks)
        lines.append(f"r{rank:<5}{', '.join(map(str, chunks)):<10}{tokens:<24}{pairs[rank]:,}")
    lines.append(f"max/mean {max(pairs) / mean:.2f} (a contiguous split: "
                 f"{max(contiguous) / mean:.2f}, its last rank {max(contiguous):,} pairs)")
    if a2a > 1:
        return "\n".join(lines + _two_levels(cp, a2a, attention, seq_len))
    return "\n".join(lines + _exchange(cp, attention, seq_len))


def _exchange(cp: int, attention: str, seq_len: int) -> list[str]:
    """Each ring step's (or the gather's, or the all-to-all's) kernel calls, by rank."""
    from paraxis.show.viz.context import blocks_text

    lines = []
    if attention == "ring":
        lines.append("ring steps: KVj = the K/V of rank j held; q×k = query chunks × key "
                     "chunks computed")
        for step in range(cp):
            cells = []
            for rank in range(cp):
                source = ring_source(rank, step, cp)
                calls = blocks_text(ring_blocks(rank, step, cp), rank_chunks(rank, cp),
                                    rank_chunks(source, cp))
                cells.append(f"r{rank} KV{source} {calls.replace(chr(10), ' + ')}")
            lines.append(f"  step {step}: " + " | ".join(cells))
    elif attention == "all_to_all":
        lines.append("all-to-all: rank j sends head group i of its chunks to rank i and "
                     "gets head group j of every chunk, then runs one causal call over all "
                     f"{seq_len} tokens for its heads/cp heads; the output goes back")
        for rank in range(cp):
            lines.append(f"  r{rank}: head group {rank}, q0-{2 * cp - 1}×k0-{2 * cp - 1} "
                         "causal")
    else:
        lines.append("all-gather: every rank gets all K/V once (again in backward), then:")
        for rank in range(cp):
            calls = blocks_text(gathered_blocks(rank, cp), rank_chunks(rank, cp),
                                gathered_chunks(cp))
            lines.append(f"  r{rank}: {calls.replace(chr(10), ' + ')}")
    return lines


def _two_levels(cp: int, a2a: int, attention: str, seq_len: int) -> list[str]:
    """Two-level cp (`parallel/context/hierarchical.py`): the all-to-all groups, the groups
    across, and the across level's exchange, which is the one-level one over cp / a2a ranks
    on chunks a2a times longer."""
    across = cp // a2a
    groups = [list(range(g * a2a, (g + 1) * a2a)) for g in range(across)]
    rings = [list(range(i, cp, a2a)) for i in range(a2a)]
    names = "; ".join(",".join(f"r{r}" for r in group) for group in groups)
    lines = [f"two levels, cp_a2a={a2a}: cp = {a2a} x {across}. An all-to-all inside each group "
             f"of {a2a} consecutive ranks ({names}) trades heads for sequence: rank g*{a2a}+i "
             f"then holds head group i (heads/{a2a}) of its group's {2 * a2a} chunks, which are "
             f"coarse chunks g and {2 * across - 1}-g of {2 * across} chunks of "
             f"{seq_len // (2 * across)} tokens.",
             "across: the ranks of one index i in every group ("
             + "; ".join(",".join(f"r{r}" for r in ring) for ring in rings)
             + f") run the {attention.replace('_', '-')} over {across} as one-level cp="
             f"{across} does, its r<g> here being group g, on the coarse chunks:"]
    lines += ["  " + line for line in _exchange(across, attention, seq_len)]
    lines.append("then a second all-to-all inside each group gives every rank its own chunks "
                 "back, for all heads")
    return lines


def draw(cp: int, attention: str, seq_len: int, layout: Layout | None, gpus_per_node: int,
         folder: str | Path) -> list[Path]:
    """Write the pictures into `folder`; return their paths. Under two-level cp they draw
    the level across (`_two_levels`): its ranks are the all-to-all groups."""
    from paraxis.show.viz.context import plot_chunks
    from paraxis.show.viz.context_ring import plot_kv_exchange
    from paraxis.show.viz.grid import plot_rank_grid
    from paraxis.show.viz.style import save_figure

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    a2a = layout.cp_a2a if layout is not None else 1
    level, tail = (cp // a2a, "-across") if a2a > 1 else (cp, "")
    figures = {f"context-chunks-{attention}{tail}.png": plot_chunks(seq_len, level, attention),
               f"context-{attention}{tail}.png": plot_kv_exchange(level, attention)}
    if layout is not None:
        figures["context-grid.png"] = plot_rank_grid(layout, gpus_per_node)
    for name, fig in figures.items():
        save_figure(fig, str(folder / name))
    return [folder / name for name in figures]


def run(args: argparse.Namespace) -> int:
    from paraxis.files.host import check_writable_folder

    cp, attention, seq_len, layout = resolve(args)
    if args.out is not None:
        check_writable_folder(args.out, "--out")
    a2a = layout.cp_a2a if layout is not None else 1
    print(describe(cp, attention, seq_len, a2a))
    if args.out is not None:
        for path in draw(cp, attention, seq_len, layout, args.gpus_per_node, args.out):
            print(f"wrote {path}" + (" (the level across: rank g is all-to-all group g)"
                                     if "-across" in path.name else ""))
    return 0
