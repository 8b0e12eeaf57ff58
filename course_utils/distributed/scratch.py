"""Scratch folders of a run on processes that a killed run does not leave behind for long.

A run removes its folder when it ends, however it ends, but not when its own process is
killed outright (SIGKILL: a kernel restarted mid-run, the grader's time limit, a launcher
killed from outside): nothing of it runs any more. So every folder is named after the
process that made it (`course-worker-4242-x1y2z3`), and the next run of that kind removes
the folders of processes that no longer exist before it makes its own.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import psutil  # type: ignore[import-untyped]  # a dependency (requirements.txt)


def scratch_folder(kind: str) -> Path:
    """A new folder `course-{kind}-{pid}-...` in the temporary directory, made after removing
    the `course-{kind}-*` folders whose process is gone."""
    prefix = f"course-{kind}-"
    for old in Path(tempfile.gettempdir()).glob(f"{prefix}*"):
        pid = old.name.removeprefix(prefix).split("-", 1)[0]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):  # any user's living process keeps it
            shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-"))
