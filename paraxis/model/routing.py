"""A real router's choices: a mixture of experts' routing of a batch of the embedded corpus,
every MoE block, and how the tokens fall on expert-parallel ranks (`paraxis experts`, the
report's and the lab's expert pictures)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from paraxis.data.corpus import embedded_corpus
from paraxis.files.host import available_host_bytes
from paraxis.files.model_file import load_model_config, model_directory
from paraxis.model.inference import load_for_inference
from paraxis.model.transformer import build_model
from paraxis.parallel.experts.layer import MoE
from paraxis.spec.errors import ParaxisError
from paraxis.spec.model_config import ModelConfig


def route_batch(model_name: str, batch: int, seq_len: int, seed: int = 0
                ) -> tuple[ModelConfig, dict[int, tuple[list[list[int]], list[list[float]]]]]:
    """(config, {block index: (chosen, weights)}): the model's routing of `batch` sequences
    of the embedded corpus, every MoE block, tokens in batch order."""
    if model_directory(model_name) is not None:  # as every command reads --model
        cfg, model = load_for_inference(model_name)
    else:
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
