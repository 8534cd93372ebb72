"""Data parallelism and ZeRO 0-3 train exactly like one device on the same global batch (fp32).

Each distributed run trains several configurations one after another on the same forked ranks
(process start-up dominates on this machine); the single-device reference runs in the test
process. The "odd" model has a parameter count that no dp size divides, so every bucket and
shard is padded.
"""

import pytest
import torch

from paraxis.dist.testing import RankContext, run_on_ranks
from paraxis.engine.contract import LocalEngine
from paraxis.engine.data_parallel import DataParallelEngine
from paraxis.model.transformer import build_model
from paraxis.spec.layout import Layout
from paraxis.spec.model_config import PRESETS, ModelConfig
from paraxis.spec.runtime_options import RuntimeOptions

ODD = ModelConfig("odd", "gpt2", vocab_size=251, n_layers=2, d_model=15, n_heads=3,
                  n_kv_heads=3, d_ff=36, max_seq_len=33)
MODELS = {"odd": ODD, "tiny-llama": PRESETS["tiny-llama"]}
STEPS, GLOBAL_BATCH, SEQ, LR, SEED = 5, 8, 16, 1e-3, 3
CLIP = 0.05  # far below the gradient norm of these models: every step clips


def batches(vocab: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(11)
    return [(torch.randint(0, vocab, (GLOBAL_BATCH, SEQ), generator=g),
             torch.randint(0, vocab, (GLOBAL_BATCH, SEQ), generator=g)) for _ in range(STEPS)]


def train(engine, data, clip: float, rows: slice) -> tuple[list[float], list[float]]:
    losses, norms = [], []
    for x, y in data:
        losses.append(engine.forward_backward(x[rows], y[rows]))
        norms.append(engine.clip_grad_norm(clip))
        engine.optimizer_step(LR)
        engine.zero_grad()
    return losses, norms


def reference(model: str, clip: float):
    cfg = MODELS[model]
    engine = LocalEngine(build_model(cfg, seed=SEED), Layout())
    losses, norms = train(engine, batches(cfg.vocab_size), clip, slice(None))
    return losses, norms, {n: p.detach() for n, p in engine.model.named_parameters()}


def _rank_body(ctx: RankContext, configs):
    results = []
    for model, zero, micro, clip in configs:
        cfg = MODELS[model]
        dp = torch.distributed.get_world_size()
        layout = Layout(dp=dp, zero=zero, microbatches=micro)
        groups = ctx.with_layout(layout).groups
        # Small buckets so several of them (with padding) are in play.
        engine = DataParallelEngine(build_model(cfg, seed=SEED), layout, groups,
                                    options=RuntimeOptions(bucket_bytes=8_000))
        per_rank = GLOBAL_BATCH // dp
        rows = slice(groups.dp_rank * per_rank, (groups.dp_rank + 1) * per_rank)
        losses, norms = train(engine, batches(cfg.vocab_size), clip, rows)
        # numpy, not tensors: tensors through a multiprocessing queue travel as shared memory
        # that the exiting rank may take with it.
        params = {n: p.numpy() for n, p in engine.full_parameters().items()}
        results.append((losses, norms, params if groups.dp_rank == 0 else None))
    return results


CONFIGS = [("odd", zero, 1, 0.0) for zero in range(4)] + \
          [("odd", zero, 2, CLIP) for zero in range(4)] + \
          [("tiny-llama", 3, 1, CLIP), ("tiny-llama", 1, 2, 0.0)]


@pytest.mark.parametrize("dp", [2, 4])
def test_dp_and_zero_match_single_device(dp):
    per_rank = run_on_ranks(dp, _rank_body, CONFIGS, timeout_s=170)
    refs = {key: reference(key[0], key[1]) for key in {(m, c) for m, _, _, c in CONFIGS}}
    for index, (model, zero, micro, clip) in enumerate(CONFIGS):
        ref_losses, ref_norms, ref_params = refs[(model, clip)]
        if clip:
            assert min(ref_norms) > clip, "clipping must be active in this configuration"
        what = f"{model} dp={dp} zero={zero} microbatches={micro} clip={clip}"
        for rank_results in per_rank:
            losses, norms, _ = rank_results[index]
            assert losses == pytest.approx(ref_losses, rel=1e-5), what
            assert norms == pytest.approx(ref_norms, rel=1e-4), what
        params = per_rank[0][index][2]
        assert params.keys() == ref_params.keys()
        for name, value in params.items():
            torch.testing.assert_close(torch.from_numpy(value), ref_params[name], rtol=0, atol=1e-5,
                                       msg=lambda m, n=name, w=what: f"{w} {n}: {m}")
