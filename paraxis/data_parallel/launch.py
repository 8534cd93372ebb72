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


def launch(cfg, nproc: int, host: str = "127.0.0.1",  # noqa: ANN001
           max_restarts: int = 0) -> list[dict]:
    """Run `cfg` on `nproc` local ranks (rendezvous on host:free port, loopback by default);
    rank 0's records.

    max_restarts: when any rank dies (killed, an exception, out of memory), the agent stops
    the others and starts all of them again, up to this many times; each start resumes from
    the newest complete checkpoint (`train._resume`).
    """
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from paraxis.errors import ParaxisError

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc,
                          run_id=f"paraxis-{uuid.uuid4().hex[:8]}", rdzv_backend="c10d",
                          rdzv_endpoint=f"{host}:{free_port()}", max_restarts=max_restarts,
                          monitor_interval=0.1, start_method="spawn")
    try:
        results = elastic_launch(config, _rank_entry)(cfg)
    except ChildFailedError as error:
        rank, failure = error.get_first_failure()
        raise ParaxisError(f"rank {rank} failed ({_describe(failure.exitcode)}) after "
                           f"{max_restarts} restart(s); its output is above") from None
    return results[0]


def _describe(exitcode: int) -> str:
    import signal

    if exitcode < 0:
        return f"killed by {signal.Signals(-exitcode).name}"
    return f"exit code {exitcode}"
