"""`paraxis train --nproc N`: start N ranks on this machine through torch's elastic agent.

The ranks run `run_training`, the function `torchrun -m paraxis.train` reaches on every rank,
so one machine needs no torchrun and several machines use torchrun with its own flags
(`torchrun --nnodes 2 --nproc-per-node 8 --rdzv-endpoint host:port -m paraxis.train ...`).
"""

from __future__ import annotations

import os
import uuid

from paraxis.testing import free_port


def _rank_entry(cfg):  # noqa: ANN001, ANN202 - a TrainConfig; runs in a spawned rank
    import torch

    from paraxis.train import run_training

    if cfg.device == "cpu" or (cfg.device == "auto" and not torch.cuda.is_available()):
        # Ranks share the machine's cores: one thread each avoids oversubscription.
        torch.set_num_threads(1)
    return run_training(cfg)


def launch(cfg, nproc: int, host: str = "127.0.0.1") -> list[dict]:  # noqa: ANN001
    """Run `cfg` on `nproc` local ranks (rendezvous on host:free port); rank 0's records."""
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc,
                          run_id=f"paraxis-{uuid.uuid4().hex[:8]}", rdzv_backend="c10d",
                          rdzv_endpoint=f"{host}:{free_port()}", max_restarts=0,
                          monitor_interval=0.1, start_method="spawn")
    results = elastic_launch(config, _rank_entry)(cfg)
    return results[0]
