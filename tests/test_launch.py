"""`paraxis.dist.launch` starts ranks from a fork server that imported torch once: each rank
still gets its launcher's environment, working folder, stdout and stderr as they are at the
launch, and one thread; the server is gone when the launch returns."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from paraxis.dist.launch import launch
from paraxis.dist.rank_server import rank_context


def report(tag: str, launcher: int) -> dict:
    import torch

    for fd, name in ((1, "out"), (2, "err")):  # one write each: the ranks share the files
        os.write(fd, f"rank {os.environ['RANK']} {tag} {name}\n".encode())
    parent = os.getppid()  # the fork server, which had loaded torch's library before forking
    server_torch = "libtorch_cpu" in open(f"/proc/{parent}/maps").read()
    return {"tag": os.environ.get("PARAXIS_TEST_TAG"), "cwd": os.getcwd(),
            "threads": torch.get_num_threads(), "server": parent != launcher and server_torch}


def servers_of(pid: int) -> list[str]:
    """The fork servers among `pid`'s (main thread's) children."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [child for child in children if b"multiprocessing.forkserver" in
            Path(f"/proc/{child}/cmdline").read_bytes()]


@pytest.mark.skipif(sys.platform != "linux", reason="the fork server is POSIX's")
def test_ranks_fork_from_a_server_and_take_the_launchers_state_at_each_launch(
        tmp_path, monkeypatch, capfd):
    assert rank_context(report).get_start_method() == "forkserver"
    for tag in ("first", "second"):
        folder = tmp_path / tag
        folder.mkdir()
        monkeypatch.chdir(folder)
        monkeypatch.setenv("PARAXIS_TEST_TAG", tag)
        got = launch(report, (tag, os.getpid()), nproc=2, device="cpu")
        assert got == {"tag": tag, "cwd": str(folder), "threads": 1, "server": True}
        assert not servers_of(os.getpid())  # stopped as the launch returned
        out, err = capfd.readouterr()  # this launch's lines, in this test's capture
        assert sorted(out.splitlines()) == [f"rank 0 {tag} out", f"rank 1 {tag} out"]
        assert sorted(line for line in err.splitlines() if line.startswith("rank")) == [
            f"rank 0 {tag} err", f"rank 1 {tag} err"]


def _imported_while_training(layout: str) -> list[str]:
    """The modules of paraxis and its libraries that a run of `layout` imported as it ran."""
    from paraxis.train.config import RunConfig
    from paraxis.train.loop import run_training

    before = set(sys.modules)
    run_training(RunConfig.from_flags(model="tiny-moe", steps=1, global_batch=4, seq_len=32,
                                      device="cpu", quiet=True, layout=layout))
    return sorted(name for name in set(sys.modules) - before
                  if name.split(".")[0] in ("paraxis", "rich", "safetensors"))


@pytest.mark.skipif(sys.platform != "linux", reason="the fork server is POSIX's")
def test_a_run_imports_nothing_its_rank_server_did_not(tmp_path, monkeypatch):
    # Each rank would otherwise import the training stack again, every launch (half a
    # second of CPU a rank); the suite's ranks inherit the same list (tests/conftest.py).
    from paraxis.dist.rank_server import start_rank_server
    from paraxis.train.loop import RUN_IMPORTS

    monkeypatch.chdir(tmp_path)
    start_rank_server(_imported_while_training, RUN_IMPORTS)
    assert launch(_imported_while_training, ("dp=2,ep=2,zero=1",), nproc=2, device="cpu") == []


@pytest.mark.skipif(sys.platform != "linux", reason="the fork server is POSIX's")
def test_the_server_preloads_from_the_launchers_import_path(tmp_path, monkeypatch):
    # A module only this process's sys.path finds, as paraxis is where it is not installed:
    # the ranks' server imports it once (it runs in another folder, without PYTHONPATH).
    from paraxis.dist.rank_server import start_rank_server

    (tmp_path / "found_by_path").mkdir()
    (tmp_path / "found_by_path" / "preloaded_probe.py").write_text(
        "import os\nIMPORTED_IN = os.getpid()\n\n\n"
        "def where():\n    return IMPORTED_IN, os.getppid()\n")
    monkeypatch.syspath_prepend(str(tmp_path / "found_by_path"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    import preloaded_probe

    start_rank_server(preloaded_probe.where)
    imported_in, server = launch(preloaded_probe.where, (), nproc=2, device="cpu")
    assert imported_in == server
    assert "PYTHONPATH" not in os.environ
