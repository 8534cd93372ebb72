"""Training what one rank cannot hold: no rank ever makes a full copy of the model.

The model below is sized so that its single-device training state (fp32 parameters,
gradients and AdamW's two moments: 16 bytes a parameter) is over the per-rank limit the test
sets, three quarters of it. Every layout builds, loads and trains it under the limit,
counted exactly in tensor bytes (`TensorBytes`, the profiler's allocation events, not RSS);
a rank that first built the whole model, as paraxis did before `parallelize` ran on the meta
device, or that held every unit's gradients until the end of backward, as ZeRO-3 did, goes
over it. Building and loading also stay within the rank's own share plus one full tensor:
values are drawn or read one tensor at a time, and only where the rank holds a piece.
"""

import gc

import torch

from paraxis.dist.tensor_memory import TensorBytes
from paraxis.dist.testing import RankContext, run_on_ranks
from paraxis.model.checkpoint import save
from paraxis.model.checkpoint.load import load_checkpoint
from paraxis.model.checkpoint.pieces import cut
from paraxis.model.checkpoint.save import save_checkpoint
from paraxis.model.transformer import build_model
from paraxis.parallelize import materialize, parallelize
from paraxis.spec.model_config import ModelConfig

# Llama-style, wide for its length (parameters, not activations, are what must not fit),
# and made of many tensors: the largest (an MLP matrix) is 1/32 of the model.
MODEL = ModelConfig("scale-test", "llama", 256, 8, 256, 4, 2, 768, 16)
FULL_STATE = 16 * MODEL.num_params()  # fp32 parameters + gradients + AdamW moments
LIMIT = 3 * FULL_STATE // 4
LARGEST = 4 * MODEL.d_ff * MODEL.d_model
SLACK = 2**20  # small temporaries (norms, indices, file headers)


def share(engine) -> int:
    return sum(engine.memory_report().values())


def build_train_reload(ctx: RankContext, folder: str) -> dict:
    """Peaks (tensor bytes) of building, two steps, and loading the saved state again."""
    idx = torch.randint(0, MODEL.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    reference = dict(build_model(MODEL, seed=3).named_parameters())  # made before the meter:
    with TensorBytes() as meter:                                   # not counted
        with meter.phase("build"):
            engine = parallelize(MODEL, ctx.layout, ctx.groups, "cpu")
            materialize(engine, MODEL, seed=3)
        built = share(engine)
        same = all(torch.equal(e.tensor.reshape(-1), cut(reference[e.name].detach(), e))
                   for e in engine.checkpoint_entries() if e.kind == "param")
        with meter.phase("train"):
            for _ in range(2):
                engine.forward_backward(idx[:, :-1], idx[:, 1:])
                engine.clip_grad_norm(1.0)
                engine.optimizer_step(1e-3)
                engine.zero_grad()
        save.FILE_BYTES = LARGEST  # this small model's share would fit one file: split it
        with meter.phase("save"):
            path = save_checkpoint(engine, folder, 2, MODEL.to_dict())
        del engine
        gc.collect()
        with meter.phase("load"):  # into a fresh engine
            engine = parallelize(MODEL, ctx.layout, ctx.groups, "cpu")
            load_checkpoint(engine, path, MODEL.to_dict(), ctx.rank)
        loaded = share(engine)
    return {"peaks": meter.peaks, "starts": meter.starts, "peak": meter.peak, "built": built,
            "loaded": loaded, "same_initial_weights": same, "limit": LIMIT}


def test_no_rank_holds_the_model(tmp_path):
    layouts = ["dp=2,zero=3", "tp=2", "pp=2,microbatches=2"]
    results = run_on_ranks(layouts, build_train_reload, str(tmp_path), timeout_s=300)
    assert FULL_STATE > LIMIT + 4 * LARGEST  # the test means something: one copy is too much
    for layout, ranks in zip(layouts, results, strict=True):
        for rank, r in enumerate(ranks):
            where = f"{layout} rank {rank}: {r}"
            grew = {phase: r["peaks"][phase] - r["starts"][phase] for phase in r["peaks"]}
            assert r["same_initial_weights"], where
            assert r["peak"] <= LIMIT, where  # never near a single device's whole state
            # one full tensor (and the slice cut from it) at a time while drawing; one piece
            # (and the buffer it is assembled in) while reading; one file's worth while saving
            assert grew["build"] <= r["built"] + 2 * LARGEST + SLACK, where
            assert grew["load"] <= r["loaded"] + 2 * LARGEST + SLACK, where
            assert grew["save"] <= 2 * LARGEST + SLACK, where
