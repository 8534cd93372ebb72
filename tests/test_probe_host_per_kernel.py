"""tools/probes/host_per_kernel.py cuts bench.gpu's models to a width where a GPU step is the
host's: the cut models keep their layers and build and train as paraxis and the reference
(on CPU here; the probe itself needs CUDA)."""

from __future__ import annotations

import torch

from bench import gpu
from bench.common import token_batch
from tools.probes.host_per_kernel import cut


def test_the_cut_models_keep_their_layers_and_train():
    for name in ("gpt2-124m", "llama3-8b/8"):
        full = gpu.model(name)
        cfg = cut(full, 64, 512)
        assert (cfg.n_layers, cfg.d_model, cfg.vocab_size, cfg.head_dim) == (
            full.n_layers, 64, 512, 64)
        x, y = token_batch(cfg.vocab_size, 1, 16, torch.device("cpu"))
        for side in ("paraxis", "reference"):
            gpu.build_side(side, cfg, x, y, False, torch.device("cpu"))()
