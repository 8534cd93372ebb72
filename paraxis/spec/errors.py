"""The exception types a user sees.

A `ParaxisError` is bad input, not a bug: the command line prints its message on one line
(no traceback unless `--debug`) and exits with code 2. Messages say what is wrong and how to
fix it.

A `RunFailed` is a run that started and cannot go on (a peer rank stopped answering, the loss
became NaN): also one line, exit code 3, so scripts can tell it from bad input.
"""


class ParaxisError(Exception):
    """Bad input from the user: the message names the problem and a fix."""

    exit_code = 2


class RunFailed(ParaxisError):
    """The run cannot go on; the message names the step or the wait and what to do."""

    exit_code = 3
    # Every rank raises it for the same reason (a NaN loss is the same number on every rank):
    # rank 0 alone prints it, rather than N identical lines.
    same_on_every_rank = False


class CommFailure(RunFailed):
    """A collective or point-to-point wait timed out or lost its peer (`dist/watchdog.py`).

    Each rank prints its own line (which wait, which group, which peer); `linger_s` keeps the
    process alive a moment after printing, so that a launcher, which ends the job when its
    first rank exits, does not cut off the peers whose waits expired a moment later.
    """

    linger_s = 3.0
