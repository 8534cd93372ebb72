"""Several ranks on one GPU: a process group that stages CUDA tensors through gloo.

NCCL refuses two ranks of one communicator on one GPU ("Duplicate GPU detected"), and gloo
takes CUDA tensors for a few collectives only, so a run of more CUDA ranks than GPUs has
neither backend. `--share-gpu` gives it this one: a `ProcessGroup` whose every call copies
its CUDA tensors to the host, runs gloo's own collective or point-to-point call there, and
copies the results back (CPU tensors go straight through). It is slow, and the point is
not speed: every axis's CUDA code (its kernels, streams, dtypes and the tensors it hands to
the collectives) runs on a one-GPU machine before an 8-GPU one, with the exact collectives
the run would make; the ranks share the GPU's memory and time.

The calls are gloo's, so the numbers are gloo's: a run that trains the same numbers on CPU
ranks over gloo trains them here (up to the GPU's own kernels). Sends and receives stay
asynchronous as gloo makes them (a received CUDA tensor is filled when its work is waited
on, which every caller does before reading it); collectives complete before they return.
Sends and receives are posted one by one (`groups.batch_isend_irecv`), as torch does for
gloo: torch's batching of CUDA point-to-point calls is NCCL's.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

BACKEND = "paraxis_shared"  # the name init_process_group and dist.get_backend use


class _Done(dist._Work):
    """A finished call: its results are already in place."""

    def wait(self, timeout: timedelta | None = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


class _Then(dist._Work):
    """gloo's work, then the copies back to the CUDA tensors it filled on the host."""

    def __init__(self, work: dist.Work, copies: list[tuple[torch.Tensor, torch.Tensor]],
                 keep: list[torch.Tensor] | None = None) -> None:
        super().__init__()
        self.work, self.copies, self.keep = work, copies, keep  # keep: a send's host copies

    def wait(self, timeout: timedelta | None = None) -> bool:
        self.work.wait()
        _back(self.copies)
        self.copies, self.keep = [], None
        return True

    def is_completed(self) -> bool:
        return self.work.is_completed() and not self.copies


def _host(value: Any, copies: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
    """`value` (a tensor, a list of them, a list of lists, or anything else) with each CUDA
    tensor replaced by a host copy; (CUDA tensor, host copy) pairs are added to `copies`."""
    if isinstance(value, list):
        return [_host(item, copies) for item in value]
    if not isinstance(value, torch.Tensor) or value.device.type == "cpu":
        return value
    host = value.detach().to("cpu")
    copies.append((value, host))
    return host


def _back(copies: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Copy host results into their CUDA tensors, finished before this returns: NCCL's
    callers may read them on another stream than the one the call was made on."""
    for target, source in copies:
        target.copy_(source)
    if copies:
        torch.cuda.current_stream(copies[0][0].device).synchronize()


class SharedGpuGroup(dist.ProcessGroup):
    """gloo with CUDA tensors staged through the host; one per process group of the run.
    Every call's first argument is what it writes (a tensor or a list of them): its CUDA
    tensors get gloo's results back."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: timedelta,
                 name: str = "") -> None:
        super().__init__(rank, size)
        options = dist.ProcessGroupGloo._Options()
        options._timeout, options.group_name = timeout, name
        options._devices = [dist.ProcessGroupGloo.create_default_device()]
        self.gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo", store), rank, size, options)
        # torch reads a group's name from its backends (torch.compile refers to groups by
        # it); the calls themselves reach the methods below, which stage what gloo cannot take
        self._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO,
                               self.gloo)

    def getBackendName(self) -> str:  # noqa: N802 (torch's name)
        return BACKEND

    def _staged(self, call: Any, written: Any, *args: Any) -> dist._Work:
        """gloo's `call` on host copies of its arguments, waited for; `written`'s results
        copied back."""
        copies: list[tuple[torch.Tensor, torch.Tensor]] = []
        host = _host(written, copies)
        call(host, *(_host(arg, []) for arg in args)).wait()
        _back(copies)
        return _Done()

    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> dist._Work:
        return self._staged(self.gloo.allreduce, tensors, opts)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any) -> dist._Work:
        return self._staged(self.gloo.allreduce_coalesced, tensors, opts)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> dist._Work:
        return self._staged(self.gloo.broadcast, tensors, opts)

    def reduce(self, tensors: list[torch.Tensor], opts: Any) -> dist._Work:
        return self._staged(self.gloo.reduce, tensors, opts)

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                  opts: Any) -> dist._Work:
        return self._staged(self.gloo.allgather, outputs, inputs, opts)

    def gather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor],
               opts: Any) -> dist._Work:
        return self._staged(self.gloo.gather, outputs, inputs, opts)

    def scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]],
                opts: Any) -> dist._Work:
        return self._staged(self.gloo.scatter, outputs, inputs, opts)

    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]],
                       opts: Any) -> dist._Work:
        return self._staged(self.gloo.reduce_scatter, outputs, inputs, opts)

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any
                 ) -> dist._Work:
        return self._staged(self.gloo.alltoall, outputs, inputs, opts)

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any
                          ) -> dist._Work:
        return self._staged(self.gloo._allgather_base, output, input, opts)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any
                              ) -> dist._Work:
        return self._staged(self.gloo._reduce_scatter_base, output, input, opts)

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor,
                          output_splits: list[int], input_splits: list[int], opts: Any
                          ) -> dist._Work:
        return self._staged(self.gloo.alltoall_base, output, input, output_splits,
                            input_splits, opts)

    # torch 2.12 and earlier call them by these names
    _allgather_base = all_gather_single
    _reduce_scatter_base = reduce_scatter_single
    alltoall_base = all_to_all_single

    def barrier(self, opts: Any = None) -> dist._Work:
        own = dist.BarrierOptions()  # gloo's, without a CUDA device it would refuse
        if opts is not None:
            own.timeout = opts.timeout
        self.gloo.barrier(own).wait()
        return _Done()

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int) -> dist._Work:
        host = [t.detach().to("cpu").contiguous() for t in tensors]
        return _Then(self.gloo.send(host, dst, tag), [], keep=host)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int) -> dist._Work:
        host = [t if t.device.type == "cpu" else torch.empty(t.shape, dtype=t.dtype,
                                                             device="cpu")
                for t in tensors]  # on the host whatever the default device (gloo reads
        # into it: a CUDA buffer is a bad address), contiguous; nothing copied from the GPU
        copies = [(t, h) for t, h in zip(tensors, host, strict=True) if t.device.type != "cpu"]
        return _Then(self.gloo.recv(host, src, tag), copies)


def _create(options: Any, _backend_options: Any) -> SharedGpuGroup:
    return SharedGpuGroup(options.store, options.group_rank, options.group_size,
                          options.timeout, options.group_id)


def register() -> None:
    """Make `BACKEND` a name init_process_group knows (once per process)."""
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, _create, extended_api=True,
                                      devices=["cpu", "cuda"])
