"""A CPU rank's memory before it holds any of the model: the process baseline.

Every rank of `paraxis train` is a fresh Python process with the interpreter, PyTorch, the
paraxis modules and a gloo process group in it before it builds anything. That is memory the
planner must add to a rank's tensors to forecast its resident peak, as it adds the CUDA
context and NCCL workspaces on a GPU (`plan.hardware.GPU.reserved_bytes`). It is measured
the way a rank starts: a new interpreter (not a fork, which would share its parent's pages)
imports what a rank imports, joins a process group and runs one collective.
"""

from __future__ import annotations

import os
import subprocess
import sys

from paraxis.spec.errors import ParaxisError

# What `paraxis train` runs in each rank before the model exists (dist/launch.py).
RANK_START = """
import os, socket, torch, torch.distributed as dist
import paraxis.train.loop, paraxis.parallelize
from paraxis.dist.host_memory import return_freed_memory
torch.set_num_threads(1)
return_freed_memory()
listener = socket.create_server(("127.0.0.1", 0))
port = listener.getsockname()[1]
store = dist.TCPStore("127.0.0.1", port, 1, True, master_listen_fd=listener.detach())
dist.init_process_group("gloo", store=store, rank=0, world_size=1)
dist.all_reduce(torch.ones(1024))
with open("/proc/self/status") as status:
    peak = [line for line in status if line.startswith("VmHWM")][0]
print(int(peak.split()[1]) * 1024)
dist.destroy_process_group()
"""


def process_baseline_bytes() -> int:
    """The resident peak of a rank that has started but built nothing (Linux)."""
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", RANK_START], capture_output=True, text=True,
                          timeout=120, env=env)
    if done.returncode != 0:
        raise ParaxisError("measuring a rank's baseline memory failed: "
                           f"{done.stderr.strip().splitlines()[-1:]}; is this Linux?")
    return int(done.stdout.strip().splitlines()[-1])
