"""This host's folders and memory: where a run may write, what creating a folder makes, and
how much RAM there is."""

from __future__ import annotations

import os
from pathlib import Path

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
        with open(path, "r+b"):
            pass
    except FileNotFoundError:
        pass  # writing creates it
    except OSError as error:  # an immutable file, a loop of links, a read-only file
        raise ParaxisError(f"{flag} {path} cannot be written ({error.strerror}); choose "
                           "another path") from None
    _check_nearest_folder(path, path.parent, flag)


def _check_nearest_folder(path: Path, folder: Path, flag: str) -> None:
    """The nearest existing folder at or above `folder` (where writing `path` creates what
    is missing) must be a folder this process may write in, on a file system that holds
    files: permission bits let root "write" in /proc, whose file system has no blocks, and
    on a read-only mount."""
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise ParaxisError(f"{flag} {path} cannot be written ({folder} is not a writable "
                           "folder); choose another path")
    system = os.statvfs(folder)
    reason = ("a read-only file system" if system.f_flag & os.ST_RDONLY else
              "a file system that holds no files" if system.f_blocks == 0 else None)
    if reason is not None:
        raise ParaxisError(f"{flag} {path} cannot be written ({folder} is on {reason}); "
                           "choose another path")


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
