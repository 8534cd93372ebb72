"""Security: loading never executes code, and a local run listens on loopback only."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
UNSAFE_MODULES = {"pickle", "cPickle", "dill", "marshal", "shelve", "cloudpickle"}


def unsafe_calls(source: str) -> list[str]:
    """Loads that can run code: pickle & co, torch.load without weights_only=True, numpy
    pickles, yaml.load, eval/exec."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [
                node.module or ""]
            found += [f"import {n}" for n in names if n.split(".")[0] in UNSAFE_MODULES]
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = (f"{func.value.id}.{func.attr}" if isinstance(func, ast.Attribute)
                and isinstance(func.value, ast.Name) else getattr(func, "id", ""))
        keywords = {k.arg: k.value for k in node.keywords}
        if name == "torch.load" and not (isinstance(keywords.get("weights_only"), ast.Constant)
                                         and keywords["weights_only"].value is True):
            found.append("torch.load without weights_only=True")
        if name == "np.load" and "allow_pickle" in keywords:
            found.append("np.load with allow_pickle")
        if name in ("yaml.load", "eval", "exec"):
            found.append(name)
    return found


def test_the_checker_sees_unsafe_loads():
    assert unsafe_calls("import pickle\ntorch.load(f)\neval('1')") == [
        "import pickle", "torch.load without weights_only=True", "eval"]
    assert unsafe_calls("torch.load(f, weights_only=True)\nimport json") == []


def test_no_loader_in_paraxis_can_execute_code():
    problems = {str(path.relative_to(ROOT)): unsafe_calls(path.read_text())
                for path in sorted((ROOT / "paraxis").rglob("*.py"))}
    assert {path: p for path, p in problems.items() if p} == {}


# ----------------------------------------------------------------- listening sockets


def _listening_inodes() -> dict[str, str]:
    """inode -> local address of every listening TCP socket (IPv4 and IPv6)."""
    out = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":  # TCP_LISTEN
                out[fields[9]] = fields[1].rsplit(":", 1)[0]
    return out


def _process_tree(root: int) -> list[int]:
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    tree, frontier = [root], [root]
    while frontier:
        frontier = [pid for pid, ppid in parents.items() if ppid in frontier]
        tree += frontier
    return tree


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").glob("*"):
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


LOOPBACK_HEX = {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1, ::1


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc")
def test_a_local_run_listens_on_loopback_only(tmp_path):
    """`paraxis train --nproc 2`: while the ranks wait (one is held at step 0 on purpose),
    every listening socket of the launcher and its ranks is bound to 127.0.0.1."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PARAXIS_FAULT": "hang:rank=1,step=0"}
    env.pop("GLOO_SOCKET_IFNAME", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "paraxis", "train", "--nproc", "2", "--model", "tiny", "--steps",
         "2", "--global-batch", "4", "--seq-len", "32", "--device", "cpu", "--quiet",
         "--timeout-s", "120"], cwd=tmp_path, env=env, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 150
        listening: dict[int, list[str]] = {}
        while time.monotonic() < deadline:
            table = _listening_inodes()
            tree = _process_tree(process.pid)
            listening = {pid: [table[i] for i in _socket_inodes(pid) if i in table]
                         for pid in tree}
            # the store in the launcher, and a gloo listener in each of the two ranks
            if len(tree) >= 3 and sum(bool(addrs) for addrs in listening.values()) >= 3:
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"the ranks never came up: {listening}")
        addresses = [a for addrs in listening.values() for a in addrs]
        assert addresses and set(addresses) <= LOOPBACK_HEX, listening
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
