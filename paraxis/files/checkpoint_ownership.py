"""Which run a checkpoint folder belongs to, and who is writing in it now.

    runs/x/checkpoints/
        run.json        the run's identity, written with its first checkpoint: its id, and
                        the facts a continuation must share (global batch, sequence length,
                        seed, and the data: name, token count, fingerprint)
        run.lock        while a run writes here: its id, host, pid and heartbeat (the time of
                        its last beat, renewed every few seconds by a thread)
        step-N/         each manifest names the run that wrote it ("run": {"id": ...})

Without these, step numbers were the only order: a fresh run in a folder holding another
run's higher steps saw its own checkpoints pruned as it wrote them and `--resume auto`
continued the other run, and two runs writing at once deleted each other's temporary
directories. The policy (who may claim a folder) is `train/claim.claim_folder`; this
module is the mechanics: the identity, the lock, and how two runs' facts differ.

A lock's owner is *dead* when it ran on this host and its pid is gone (or a zombie), and
*silent* when its heartbeat is older than --timeout-s (a frozen or unreachable process);
only then may a resuming run take the lock over.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from paraxis.spec.errors import ParaxisError

RUN_FILE = "run.json"
LOCK_FILE = "run.lock"
# Set by a process that holds the lock for the ranks it starts (the --nproc launcher): the
# ranks then write as that holder ({"run": id, "token": ...}) instead of claiming again.
LOCK_ENV = "PARAXIS_FOLDER_LOCK"
FINGERPRINT_BYTES = 1 << 20  # hashed from each end of the token array


def new_run_id() -> str:
    """A fresh run's id: when it started, and 8 random hex digits."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"


def data_facts(tokens: Any, name: str) -> dict[str, Any]:
    """The data's name, length and a fingerprint (SHA-256 of its length, first and last MiB):
    a moved file still matches, another file or another tokenizer does not."""
    dtype = np.dtype(tokens.dtype)
    count = FINGERPRINT_BYTES // dtype.itemsize  # sliced: memory-mapped shards read just these
    digest = hashlib.sha256(f"{len(tokens)} {dtype}".encode())
    digest.update(np.asarray(tokens[:count]).view(np.uint8).tobytes())
    digest.update(np.asarray(tokens[-count:]).view(np.uint8).tobytes())
    return {"name": name, "tokens": int(len(tokens)), "fingerprint": digest.hexdigest()[:16]}


def run_facts(global_batch: int, seq_len: int, seed: int, data: dict[str, Any],
              precision: str) -> dict[str, Any]:
    """What a resumed run must share with the checkpoint it continues."""
    return {"global_batch": global_batch, "seq_len": seq_len, "seed": seed, "source": data,
            "precision": precision}


def differences(saved: dict[str, Any], facts: dict[str, Any]) -> list[str]:
    """How `facts` (this run) differ from `saved` (a checkpoint's "data" record); facts a
    checkpoint does not record (older checkpoints) are not compared."""
    out = []
    for key, flag in (("global_batch", "--global-batch"), ("seq_len", "--seq-len"),
                      ("seed", "--seed"), ("precision", "--precision")):
        if key in saved and saved[key] != facts[key]:
            out.append(f"{flag} {facts[key]} (checkpoint: {saved[key]})")
    old, new = saved.get("source"), facts["source"]
    if isinstance(old, dict) and old.get("train_span") != new.get("train_span"):
        # the same sources, drawn from whole beside a held-out set or all but their tail
        out.append("--val-data " + ("given" if new.get("train_span") else "left out")
                   + " (checkpoint: " + ("with" if old.get("train_span") else "without")
                   + " --val-data, which changes the span training draws from)")
    elif isinstance(old, dict) and (old.get("tokens"), old.get("fingerprint")) != (
            new["tokens"], new["fingerprint"]):
        out.append(f"--data {new['name']} ({new['tokens']:,} tokens; checkpoint: "
                   f"{old.get('name')}, {old.get('tokens', 0):,} tokens)")
    return out


def read_json(path: Path, what: str) -> dict[str, Any] | None:
    """A small JSON record, None when absent; a damaged one is named in one line."""
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, UnicodeDecodeError, OSError) as error:
        raise ParaxisError(f"{path} ({what}) is damaged ({error}); delete it if no run is "
                           "using this folder") from None
    if not isinstance(record, dict) or not isinstance(record.get("id", record.get("run")), str):
        raise ParaxisError(f"{path} ({what}) is not a paraxis record; delete it if no run is "
                           "using this folder")
    return record


def check_not_a_run_folder(folder: Path, command: str) -> None:
    """Refuse writing a checkpoint from outside a run (`command`: what would write it) into
    a folder a run holds (run.lock) or owns (run.json): the run would later replace that
    step with its own, or refuse to resume past it."""
    holder = read_json(folder / LOCK_FILE, "the lock")
    if holder is not None:
        raise ParaxisError(f"{folder} is held by {describe_holder(holder)} (its run.lock); "
                           f"{command} into another folder")
    identity = read_identity(folder)
    if identity is not None:
        raise ParaxisError(f"{folder} belongs to run {identity['id']} (its run.json), whose "
                           f"--resume would meet a step it did not write; {command} into "
                           "another folder")


def read_identity(folder: Path) -> dict[str, Any] | None:
    return read_json(folder / RUN_FILE, "the run that owns the folder")


def write_identity(folder: Path, run_id: str, facts: dict[str, Any] | None) -> None:
    """Record the folder's owner, once (the first checkpoint's save calls this)."""
    if (folder / RUN_FILE).exists():
        return
    _write_atomically(folder / RUN_FILE, {"id": run_id, "created": time.time(),
                                          **({"facts": facts} if facts else {})})


def _write_atomically(path: Path, record: dict[str, Any]) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)


def owner_state(holder: dict[str, Any], timeout_s: float) -> str:
    """"alive", "dead" (no such process on this host) or "silent" (no beat for timeout_s)."""
    if holder.get("host") == socket.gethostname() and not pid_alive(int(holder.get("pid", 0))):
        return "dead"
    if time.time() - float(holder.get("beat", 0)) > timeout_s:
        return "silent"
    return "alive"


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped) still answers kill(pid, 0)
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def describe_holder(holder: dict[str, Any]) -> str:
    age = time.time() - float(holder.get("beat", 0))
    return (f"run {holder.get('run')} (pid {holder.get('pid')} on {holder.get('host')}, last "
            f"heartbeat {age:.0f} s ago)")


@dataclass
class RunIdentity:
    """Which run a checkpoint belongs to, as its manifest records it: the run id, the token of
    the lock the run holds (checked before each save) and the facts that identify the run."""

    run_id: str
    token: str
    facts: dict[str, Any]

    def manifest_entry(self) -> dict[str, Any]:
        return {"id": self.run_id, "token": self.token, "facts": self.facts}


class FolderLock:
    """`run.lock`, held by this process: created exclusively, renewed by a daemon thread
    every `interval_s`, removed by `release`. If another run took the folder over while this
    one was silent, the thread stops renewing and `still_held` turns False."""

    def __init__(self, folder: Path, run_id: str, timeout_s: float) -> None:
        self.folder, self.path = folder, folder / LOCK_FILE
        self.token = uuid.uuid4().hex[:12]
        self.record = {"run": run_id, "token": self.token, "host": socket.gethostname(),
                       "pid": os.getpid(), "beat": time.time()}
        self.interval_s = min(5.0, max(0.5, timeout_s / 10))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def try_create(self) -> bool:
        """Create the lock file if there is none (atomic: O_EXCL); False if there is one."""
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as handle:
            handle.write(json.dumps(self.record))
        self._thread = threading.Thread(target=self._renew, name="paraxis-folder-lock",
                                        daemon=True)
        self._thread.start()
        return True

    def _renew(self) -> None:
        while not self._stop.wait(self.interval_s):
            if not still_held(self.folder, self.token):
                return  # taken over: stop, the next save refuses to write
            self.record["beat"] = time.time()
            try:
                _write_atomically(self.path, self.record)
            except OSError:
                pass  # a full or vanished disk: the next save says so

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.interval_s)
        if still_held(self.folder, self.token):
            self.path.unlink(missing_ok=True)


def still_held(folder: Path, token: str) -> bool:
    """Whether `run.lock` is still the one created with `token`."""
    try:
        holder = read_json(folder / LOCK_FILE, "the lock")
    except ParaxisError:
        return False
    return holder is not None and holder.get("token") == token
