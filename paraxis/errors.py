"""The one exception type a user sees.

A `ParaxisError` is bad input, not a bug: the command line prints its message on one line
(no traceback unless `--debug`) and exits non-zero. Messages say what is wrong and how to
fix it.
"""


class ParaxisError(Exception):
    """Bad input from the user: the message names the problem and a fix."""
