"""`paraxis experts`: where a mixture of experts sends its tokens, and what that costs EP.

    paraxis experts --model tiny-moe --ep 4                  # initial weights, demo text
    paraxis experts --model runs/moe/checkpoints --ep 2 --out moe/   # a trained model

Runs the model's forward on a batch of the embedded corpus's text, records
every MoE block's routing, and prints per block the tokens per expert, the busiest expert
over the mean (the load the step waits for under expert parallelism) and, for `--ep N`, the
bytes each EP rank sends in the dispatch all-to-all when the batch's sequences are split
over the N ranks as data parallelism splits them. `--out DIR` also draws the routing and the
all-to-all of one block (`--block`, default the first MoE block).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from paraxis.spec.errors import ParaxisError
from paraxis.spec.model_config import routing_text

if TYPE_CHECKING:
    from paraxis.spec.model_config import ModelConfig

MAX_TOKENS = 65_536  # one forward on one CPU: a look, not a run



def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="tiny-moe",
                        help="an MoE preset, model file, or checkpoint/HF directory")
    parser.add_argument("--ep", type=int, default=1, help="expert-parallel ranks to price")
    parser.add_argument("--batch", type=int, default=8, help="sequences in the batch")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per sequence")
    parser.add_argument("--seed", type=int, default=0, help="initial weights' seed (presets)")
    parser.add_argument("--block", type=int, default=None, help="the block to draw")
    parser.add_argument("--out", default=None, help="directory for the pictures")


def run(args: argparse.Namespace) -> int:
    for flag in ("ep", "batch", "seq_len"):  # before the imports below (torch: seconds)
        if getattr(args, flag) < 1:
            raise ParaxisError(f"--{flag.replace('_', '-')} must be >= 1")
    if not 0 <= args.seed < 2**63:  # as `paraxis train`: torch's generator takes these
        raise ParaxisError(f"--seed {args.seed} must be between 0 and 2**63 - 1")
    if args.batch * args.seq_len > MAX_TOKENS:  # one forward on one CPU: a look, not a run
        raise ParaxisError(f"--batch {args.batch} x --seq-len {args.seq_len} is over "
                           f"{MAX_TOKENS:,} tokens; route fewer tokens (the routing of a "
                           "few thousand shows the balance)")
    if args.batch % args.ep:
        raise ParaxisError(f"--batch {args.batch} is not divisible by --ep {args.ep}; give a "
                           "batch the ep ranks can share")
    if args.out is not None:
        from paraxis.files.host import check_writable_folder

        check_writable_folder(args.out, "--out")
    from rich.table import Table

    from paraxis.files.terminal import console as terminal_console
    from paraxis.model.routing import counts_by_rank, route_batch
    from paraxis.spec.expert_placement import (
        all_to_all_bytes,
        experts_of_rank,
        kib,
        send_matrix,
    )

    cfg, routes = route_batch(args.model, args.batch, args.seq_len, args.seed)
    experts_of_rank(cfg.n_experts, args.ep, 0)  # ep must divide the experts
    if args.block is not None and args.block not in routes:  # with or without --out
        raise ParaxisError(f"--block {args.block} is not an MoE block of {cfg.name} (blocks "
                           f"0..{cfg.n_layers - 1}); choose one of "
                           f"{', '.join(map(str, routes))}")
    console = terminal_console()
    console.print(f"[bold]{cfg.name}[/]: {cfg.n_experts} experts, top {cfg.top_k}, "
                  f"{args.batch} x {args.seq_len} tokens, ep={args.ep}; routing: "
                  f"{routing_text(cfg)}")
    table = Table("block", "tokens per expert", "busiest / mean",
                  *(["dispatch KiB out per EP rank (fp32)"] if args.ep > 1 else []))
    for index, (chosen, _) in routes.items():
        counts = counts_by_rank(chosen, cfg.n_experts, args.ep)
        totals = [sum(column) for column in zip(*counts, strict=True)]
        mean = sum(totals) / cfg.n_experts
        row = [str(index), " ".join(str(t) for t in totals), f"{max(totals) / mean:.2f}x"]
        if args.ep > 1:
            sent = all_to_all_bytes(send_matrix(counts, args.ep), cfg.d_model, 4)
            row.append(" ".join(kib(b) for b in sent))
        table.add_row(*row)
    console.print(table)
    if args.out is not None:
        _draw(args, cfg, routes, console)
    return 0


def _draw(args: argparse.Namespace, cfg: ModelConfig, routes: dict, console: object) -> None:
    from paraxis.model.routing import counts_by_rank
    from paraxis.show.viz.moe import plot_all_to_all, plot_routing
    from paraxis.show.viz.style import figure_bytes

    block = min(routes) if args.block is None else args.block  # run() checked it
    chosen, weights = routes[block]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shown = min(len(chosen), 24)
    pictures = {"routing.png": plot_routing(chosen[:shown], weights[:shown], cfg.n_experts,
                                            args.ep, counted=chosen)}
    if args.ep > 1:
        pictures["all_to_all.png"] = plot_all_to_all(
            counts_by_rank(chosen, cfg.n_experts, args.ep), args.ep, cfg.d_model)
    for name, figure in pictures.items():
        (out / name).write_bytes(figure_bytes(figure, fmt="png"))
        console.print(f"wrote {out / name}")  # type: ignore[attr-defined]
