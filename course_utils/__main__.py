"""`python -m course_utils ...`: see course_utils/cli.py."""

import atexit
import os
import sys

from course_utils.cli import INTERRUPTED, main
from course_utils.errors import Terminated


def _leave(code: int) -> None:
    """Leave at once once a stopped command has cleaned up: its `finally` blocks have closed
    what it started and the exit handlers run here, but not the interpreter's tear-down of
    torch's modules (half a second of CPU on an idle machine, seconds on a busy one, spent
    after every rank has gone: a job scheduler or a test waits for it)."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):  # closed or gone: nothing left to say
            pass
    os._exit(code)


try:
    code = main()
except Terminated as stopped:  # SIGTERM (kill, a job scheduler), after the clean-up
    _leave(stopped.code if isinstance(stopped.code, int) else 1)
if code == INTERRUPTED:  # Ctrl-C, after the clean-up
    _leave(code)
sys.exit(code)
