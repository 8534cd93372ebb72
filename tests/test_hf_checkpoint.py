"""Hugging Face weights through paraxis checkpoints: import, train from them at tp=2 x pp=2,
export back. The model files come from `transformers` itself (tests/conftest.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from paraxis.data.corpus import TokenData
from paraxis.dist.testing import RankContext, run_on_ranks
from paraxis.model.checkpoint import read_full_state
from paraxis.model.checkpoint.convert import export_hf, import_hf
from paraxis.model.hf import read_hf
from paraxis.spec.layout import Layout
from paraxis.train.config import RunConfig
from paraxis.train.loop import run_training


def _cfg(model: str, layout: str, init_from: str) -> RunConfig:
    return RunConfig.from_flags(model=model, steps=1, global_batch=4, seq_len=32, quiet=True,
                                layout=layout, init_from=init_from)


def _first_losses(ctx: RankContext, hf_dir: str, checkpoint: str) -> list[float]:
    layout = str(ctx.layout)
    return [run_training(_cfg(hf_dir, layout, source))[0]["loss"]
            for source in (hf_dir, checkpoint)]


@pytest.mark.slow
def test_training_starts_from_hf_weights_at_tp2_pp2(hf_dir, hf_logits, tmp_path):
    checkpoint = import_hf(hf_dir, tmp_path / "imported")
    # The loss transformers gives on the first training batch (embedded corpus, seed 0).
    inputs, targets = TokenData.load("embedded").batch(0, 4, 32, seed=0)
    logits = hf_logits(hf_dir, torch.from_numpy(inputs))
    expected = F.cross_entropy(logits.flatten(0, 1), torch.from_numpy(targets).flatten())
    from_hf, from_checkpoint = run_on_ranks("tp=2,pp=2,microbatches=2", _first_losses, hf_dir,
                                            str(checkpoint))[0]
    assert from_hf == from_checkpoint
    assert from_hf == pytest.approx(float(expected), rel=1e-5)


def test_import_export_round_trip_is_exact(hf_dir, hf_logits, tmp_path):
    checkpoint = import_hf(hf_dir, tmp_path / "imported", Layout.parse("tp=2,pp=2"))
    _, original = read_hf(hf_dir)
    _, imported = read_full_state(checkpoint)
    assert sorted(imported) == sorted(original)
    assert all(torch.equal(imported[name], original[name]) for name in original)
    exported = export_hf(checkpoint, tmp_path / "hf-out")
    _, again = read_hf(exported)
    assert all(torch.equal(again[name], original[name]) for name in original)
    idx = torch.arange(16).view(1, 16)
    assert torch.equal(hf_logits(str(exported), idx), hf_logits(hf_dir, idx))
