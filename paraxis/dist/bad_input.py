"""One line for bad input, however many ranks see it (under `--nproc` and under torchrun).

Every rank of a job runs the same checks, so bad input the launcher's preflight cannot see
(a checkpoint of another model, a damaged manifest: under torchrun, everything) is found by
several ranks at once, and a problem found by one rank alone makes its peers fail a moment
later ("lost a peer"). Printed as they come, that is N lines and the peers' exit code 3 for
what is one mistake of the user's.

The ranks agree through the job's rendezvous store (the launcher's or torchrun's agent's,
which outlives any rank), with no collective (the group may be broken by then):

- a rank with bad input (exit code 2) marks the attempt as ended by bad input, then counts
  its line: only the first rank to count a line prints it (another line, another count);
- a rank whose run failed after that mark (its peer left: a lost connection, a timeout)
  prints nothing and exits with code 2 as well: its peer's line says why.

The mark is written before the rank exits, and a peer only sees the connection drop once it
has exited, so the mark is always there in time. Without a store (one process, or none
reachable within a few seconds) every rank prints its own line.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import os
import re
import sys
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NoReturn

from paraxis.spec.errors import ParaxisError

if TYPE_CHECKING:
    from torch.distributed import Store

BAD_INPUT = "bad_input"


def decide(error: ParaxisError) -> tuple[bool, int]:
    """(whether this rank prints `error`'s line, the exit code it ends with)."""
    if getattr(error, "not_a_rank", False):  # found before any rank of a job: say it here
        return True, error.exit_code
    if getattr(error, "same_on_every_rank", False):  # every rank raises it: rank 0 says it
        return os.environ.get("RANK", "0") == "0", error.exit_code
    if int(os.environ.get("WORLD_SIZE", "1")) < 2:
        return True, error.exit_code
    store = _job_store()
    if store is None:
        return True, error.exit_code
    try:
        if error.exit_code == 2:
            store.set(BAD_INPUT, "1")
            digest = hashlib.sha256(str(error).encode()).hexdigest()[:16]
            return store.add(f"line_{digest}", 1) == 1, 2
        if store.check([BAD_INPUT]):
            return False, 2  # a peer stopped on bad input and said so
    except (RuntimeError, ValueError):  # the store went away: say it here, to be safe
        pass
    return True, error.exit_code


def _job_store() -> Store | None:
    """A client of the job's store, keys kept apart per restart attempt; None without one."""
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not host or not port:
        return None
    import torch.distributed as dist  # lazy: torch; CLI start-up imports this

    from paraxis.dist.groups import restart_attempt  # lazy: torch; CLI start-up imports this

    try:
        attempt = restart_attempt()
        store = dist.TCPStore(host, int(port), is_master=False,
                              timeout=timedelta(seconds=5))
    except (RuntimeError, ValueError, ParaxisError):
        return None
    return dist.PrefixStore(f"paraxis/one_line/attempt_{attempt}", store)


def one_line(message: str) -> str:
    """`message` on one line: a line break inside it (a path typed with one) written as the
    escape a shell's $'...' takes."""
    return message.replace("\r", "\\r").replace("\n", "\\n")


# A negative number in any spelling float() takes: argparse's own pattern knows only "-1" and
# "-.5", so `--adam-eps -1e-8` read "-1e-8" as a flag and said "expected one argument".
NEGATIVE_NUMBER = re.compile(r"^-(?:(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?|inf|infinity|nan)$",
                             re.IGNORECASE)


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (argparse prints the whole usage block first),
    like every other paraxis error, and a negative number is a value, whatever its spelling.
    Subcommand parsers inherit the class."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = NEGATIVE_NUMBER

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"paraxis: error: {one_line(message)}; see `{self.prog} --help`\n")


def _named_too_long(body: Callable[[], int]) -> int:
    """`body()`, a path the file system cannot name (a name past its 255 bytes, given to any
    flag that reads a file) said as bad input, wherever it was opened."""
    try:
        return body() or 0
    except OSError as error:
        if error.errno != errno.ENAMETOOLONG:
            raise
        name = os.fsdecode(error.filename) if error.filename is not None else "a path"
        shown = name if len(name) <= 60 else f"{name[:28]}...{name[-28:]}"
        raise ParaxisError(f"{shown}: a name longer than this file system allows; choose a "
                           "shorter path") from None


def run_guarded(body: Callable[[], int], debug: bool = False) -> int:
    """Run a command; bad input becomes one line on stderr and exit code 2, a failed run
    (`RunFailed`) one line and exit code 3; no traceback unless `debug`."""
    try:
        return _named_too_long(body)
    except ParaxisError as error:
        if debug:
            traceback.print_exc()
        say, code = decide(error)  # one line however many ranks of a job raise it
        if say:
            print(f"paraxis: error: {one_line(str(error))}", file=sys.stderr, flush=True)
        time.sleep(getattr(error, "linger_s", 0.0))
        return code
    except KeyboardInterrupt:
        print("paraxis: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader left (`paraxis schedule --json | head`): nothing more to say, and stdout
        # goes to /dev/null so that the interpreter's last flush does not fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # as a shell reports a process that SIGPIPE ended
