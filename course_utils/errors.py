"""Errors the course raises on purpose, so callers (and the CLI) can tell them from bugs."""


class CourseInputError(ValueError):
    """Bad input: the message is one line naming the parameter and what is allowed."""


class ScheduleError(RuntimeError):
    """A schedule that cannot run: stuck (deadlocked) actions, missing or repeated actions."""


class WorkerError(RuntimeError):
    """An exception inside a worker thread, re-raised in the caller with where it happened."""


class Terminated(SystemExit):
    """A SIGTERM, raised where the main thread was (`commands.common.exit_on_sigterm`): the
    command unwinds like Ctrl-C, then leaves without the interpreter's tear-down (__main__.py)."""
