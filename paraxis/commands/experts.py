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
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from paraxis.spec.errors import ParaxisError
from paraxis.spec.moe_checks import routing_text

if TYPE_CHECKING:
    import torch

    from paraxis.parallel.experts.layer import MoE
    from paraxis.spec.model_config import ModelConfig


MAX_TOKENS = 65_536


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="tiny-moe",
                        help="an MoE preset, model file, or checkpoint/HF directory")
    parser.add_argument("--ep", type=int, default=1, help="expert-parallel ranks to price")
    parser.add_argument("--batch", type=int, default=8, help="sequences in the batch")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per sequence")
    parser.add_argument("--seed", type=int, default=0, help="initial weights' seed (presets)")
    parser.add_argument("--block", type=int, default=None, help="the block to draw")
    parser.add_argument("--out", default=None, help="directory for the pictures")


def route_batch(model_name: str, batch: int, seq_len: int, seed: int = 0
                ) -> tuple[ModelConfig, dict[int, tuple[list[list[int]], list[list[float]]]]]:
    """(config, {block index: (chosen, weights)}): the model's routing of `batch` sequences
    of the embedded corpus, every MoE block, tokens in batch order."""
    import torch

    from paraxis.data.corpus import embedded_corpus
    from paraxis.model.transformer import build_model
    from paraxis.spec.model_config import load_model_config

    if Path(model_name).is_dir():
        from paraxis.model.inference import load_for_inference

        cfg, model = load_for_inference(model_name)
    else:
        from paraxis.train.run_checks import available_host_bytes

        cfg = load_model_config(model_name)
        cfg.check_seq_len(seq_len)
        need, have = cfg.num_params() * 4, available_host_bytes()  # fp32 weights, one device
        if cfg.is_moe and need > have:
            raise ParaxisError(f"{cfg.name}'s fp32 weights ({need / 1e9:,.1f} GB) exceed this "
                               f"machine's {have / 1e9:,.1f} GB available; route a smaller "
                               "model (tiny-moe, or a model file with fewer layers)")
        model = build_model(cfg, seed=seed) if cfg.is_moe else None
    if not cfg.is_moe or model is None:
        raise ParaxisError(f"model {cfg.name} has no experts; give an MoE model (a preset such "
                           "as tiny-moe, a model file with n_experts, or its checkpoint)")
    corpus = torch.from_numpy(embedded_corpus()[: batch * seq_len].astype("int64"))
    if corpus.numel() < batch * seq_len:
        raise ParaxisError(f"--batch {batch} x --seq-len {seq_len} is more text than the "
                           "embedded corpus holds; ask for fewer tokens")
    ids = corpus.view(batch, seq_len) % cfg.vocab_size
    routes: dict[int, tuple[list[list[int]], list[list[float]]]] = {}
    for index, block in zip(range(cfg.n_layers), model.blocks, strict=True):
        if hasattr(block, "moe"):
            block.moe.register_forward_hook(_recorder(routes, index, cfg.d_model))
    with torch.no_grad():
        model(ids)
    return cfg, routes


def _recorder(routes: dict, index: int, d_model: int) -> Callable[..., None]:
    def record(layer: MoE, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        weights, chosen, _ = layer.route(inputs[0].reshape(-1, d_model))
        routes[index] = (chosen.tolist(), weights.tolist())
    return record


def counts_by_rank(chosen: list[list[int]], n_experts: int, ep: int) -> list[list[int]]:
    """Per-expert assignments of each EP rank's tokens when the batch's tokens (in batch
    order) are split into ep equal contiguous parts, as data parallelism splits sequences."""
    share = len(chosen) // ep
    counts = [[0] * n_experts for _ in range(ep)]
    for token, experts in enumerate(chosen[: share * ep]):
        for expert in experts:
            counts[token // share][expert] += 1
    return counts


def run(args: argparse.Namespace) -> int:
    from rich.table import Table

    from paraxis.files.terminal import console as terminal_console
    from paraxis.spec.expert_placement import all_to_all_bytes, experts_of_rank, send_matrix

    for flag in ("ep", "batch", "seq_len"):
        if getattr(args, flag) < 1:
            raise ParaxisError(f"--{flag.replace('_', '-')} must be >= 1")
    if args.batch * args.seq_len > MAX_TOKENS:  # one forward on one CPU: a look, not a run
        raise ParaxisError(f"--batch {args.batch} x --seq-len {args.seq_len} is over "
                           f"{MAX_TOKENS:,} tokens; route fewer tokens (the routing of a "
                           "few thousand shows the balance)")
    if args.batch % args.ep:
        raise ParaxisError(f"--batch {args.batch} is not divisible by --ep {args.ep}; give a "
                           "batch the ep ranks can share")
    if args.out is not None:
        from paraxis.train.run_checks import check_writable_folder

        check_writable_folder(args.out, "--out")
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
            row.append(" ".join(f"{b / 1024:.0f}" for b in sent))
        table.add_row(*row)
    console.print(table)
    if args.out is not None:
        _draw(args, cfg, routes, console)
    return 0


def _draw(args: argparse.Namespace, cfg: ModelConfig, routes: dict, console: object) -> None:
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
