"""This host's folders and memory: where a run may write, a file written whole or not at all,
what creating a folder makes, and how much RAM there is."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from paraxis.spec.errors import ParaxisError


def check_writable_folder(path: str | Path, flag: str, example: str = "pictures") -> None:
    """Fail before training if the folder `path` cannot be created or written in; a flag's
    empty text (which Path reads as the current folder) is refused."""
    if isinstance(path, str):
        if not path.strip():
            raise ParaxisError(f"{flag} is empty; give a folder, e.g. {example}")
        path = Path(path)
    check_name_lengths(path, flag)
    if path.exists() and not path.is_dir():
        raise ParaxisError(f"{flag} {path} is a file, not a folder; choose another path")
    _check_nearest_folder(path, path, flag)


def check_writable(path: str | Path, flag: str, example: str = "runs/x/out.json") -> None:
    """Fail before training (and before creating anything) if the file `path` cannot be
    written; a flag's empty text (which Path reads as the current folder) is refused."""
    if isinstance(path, str):
        if not path.strip():
            raise ParaxisError(f"{flag} is empty; give a file name, e.g. {example}")
        path = Path(path)
    check_name_lengths(path, flag)
    if path.is_dir():
        raise ParaxisError(f"{flag} {path} is a folder; give a file name inside it")
    try:  # a file there must open for writing (without truncating it here)
        os.close(os.open(path, os.O_WRONLY))
    except FileNotFoundError:
        pass  # writing creates it
    except OSError as error:  # an immutable file, a loop of links, a read-only file
        raise ParaxisError(f"{flag} {path} cannot be written ({error.strerror}); choose "
                           "another path") from None
    _check_nearest_folder(path, path.parent, flag)


# The kernel's own file systems: they refuse a new file whatever the permission bits say
# (root may "write" in /proc by its bits)
KERNEL_FILE_SYSTEMS = ("proc", "sysfs", "cgroup", "cgroup2", "debugfs", "tracefs",
                       "securityfs", "configfs", "pstore", "bpf", "devpts", "mqueue")


def _check_nearest_folder(path: Path, folder: Path, flag: str) -> None:
    """The nearest existing folder at or above `folder` (where writing `path` creates what
    is missing) must be a folder this process may write in, on a writable file system that
    holds files (not a read-only mount, not one of KERNEL_FILE_SYSTEMS)."""
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise ParaxisError(f"{flag} {path} cannot be written ({folder} is not a writable "
                           "folder); choose another path")
    kind = _file_system_type(folder)
    reason = ("a read-only file system" if os.statvfs(folder).f_flag & os.ST_RDONLY else
              f"the kernel's {kind} file system" if kind in KERNEL_FILE_SYSTEMS else None)
    if reason is not None:
        raise ParaxisError(f"{flag} {path} cannot be written ({folder} is on {reason}); "
                           "choose another path")


def _file_system_type(folder: Path) -> str:
    """The type of the file system `folder` is on (its mount with the longest matching
    mount point in /proc/self/mounts), or "" where that is not readable (not Linux)."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return ""
    where, kind = str(folder.resolve()), ""
    longest = -1
    for line in mounts:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = where == point or where.startswith(point.rstrip("/") + "/")
        if inside and len(point) > longest:
            longest, kind = len(point), fields[2]
    return kind


def check_name_lengths(path: Path, flag: str) -> None:
    """Refuse a path the file system cannot hold: a name longer than its folder allows
    (255 bytes on ext4 and most others), or a whole path longer than the system's limit."""
    # (asking whether a too-long name exists fails itself: read the limits where the path
    # starts)
    start = Path(path.anchor) if path.is_absolute() else Path.cwd()
    name_max, path_max = _limit(start, "PC_NAME_MAX", 255), _limit(start, "PC_PATH_MAX", 4096)
    for name in path.parts:
        if len(os.fsencode(name)) > name_max:
            raise ParaxisError(f"{flag}: the name {name[:24]}... is {len(os.fsencode(name))} "
                               f"bytes, more than this file system allows ({name_max}); choose "
                               "a shorter name")
    if len(os.fsencode(str(path.absolute()))) >= path_max:
        raise ParaxisError(f"{flag} is a path of more than {path_max} bytes, more than this "
                           "system allows; choose a shorter path")


def _limit(folder: Path, name: str, default: int) -> int:
    try:
        return os.pathconf(folder, name)
    except (OSError, ValueError):
        return default


def outermost_missing(path: Path) -> Path | None:
    """The outermost folder of `path` (itself included) that does not exist yet: what
    creating `path` makes, and what to remove again if nothing lands in it (None: none)."""
    return next((folder for folder in reversed((path, *path.parents))
                 if not folder.exists()), None)


def host_ram_bytes() -> float:
    """This machine's RAM."""
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def available_host_bytes() -> float:
    """Memory a new allocation can have now (the kernel's MemAvailable), else the RAM."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return host_ram_bytes()


def umask() -> int:
    """The process's file-mode mask: from /proc where Linux shows it, else by setting it and
    setting it back (a moment in which another thread's new file would get mode 0666)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_error_reason(error: Exception) -> str:
    """A failed write's reason in a few words: an OSError's strerror, or the OS message inside
    safetensors' own error text ('IoError(Os { code: 28, ..., message: "No space left on
    device" })')."""
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    text = str(error)
    found = re.search(r'message: "([^"]+)"', text)
    return found.group(1) if found else " ".join(text.split())


def plain_mode(path: Path) -> None:
    """Give a file the mode `open` would have created it with (0666 less the umask): writers
    that stage through private temporary files (safetensors' `save_file` leaves 0600) would
    keep the weights from the other users of a shared file system."""
    path.chmod(0o666 & ~umask())


def flush_to_disk(handle: IO) -> None:
    """Write `handle`'s data through to the disk: what a rename then publishes (a checkpoint,
    prepared shards) must not be a file the file system had not written when it crashed."""
    handle.flush()
    os.fsync(handle.fileno())


def sync_folder(folder: Path) -> None:
    """Make `folder`'s entries (a rename into it) durable."""
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def write_whole(path: Path, text: str) -> None:
    """Write `text` at `path` whole or not at all: into a file beside it, renamed over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        staging.write_text(text)
        os.replace(staging, path)
    except OSError:
        with contextlib.suppress(OSError):
            staging.unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def terminate_raises() -> Iterator[None]:
    """SIGTERM (a scheduler's stop, `kill`) raises SystemExit(143) inside the block, so its
    cleanup runs (a temporary folder removed, helper processes stopped) where the signal's
    default action would end the process on the spot. Left alone where a handler is set
    already (a training run's preemption handler) and off the main thread, where handlers
    cannot be set."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
