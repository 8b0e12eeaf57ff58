"""One grading job in a process of its own: `python -I -m course_utils.grading.worker FD PID`.

Started isolated (`-I`: neither its working folder nor PYTHONPATH nor user site packages are
on `sys.path`) in a private folder the batch made for it, so nothing it imports can have been
planted by a submission. The job (JSON) comes on stdin; the result (JSON, with the job's
token) goes to the pipe `FD`, which the learner's kernel does not inherit. See
`course_utils.grading.batch`.

It never outlives the batch that started it (process `PID`): the worker runs in a session of
its own, so nothing else would tell it that the batch was killed. A watcher thread notices
within a fraction of a second that its parent is gone (then nobody will remove its private
folder, so it does); SIGTERM (the batch stopping on Ctrl-C) ends it at once too. Either way
it removes the sockets folder it may have made in /tmp and exits, and its kernel dies with
it (bubblewrap's --die-with-parent; without a sandbox, the kernel is killed).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import sys
import threading
from pathlib import Path

WATCH_S = 0.2  # how often the watcher checks that the batch is still there


def _leave(private: Path | None) -> None:
    """Remove what this worker left in /tmp (and its private folder if asked), kill the
    kernel it started, and exit at once: no cleanup that could wait on the kernel."""
    from course_utils.grading import sandbox

    sandbox.abandon()
    if private is not None:
        shutil.rmtree(private, ignore_errors=True)
    os._exit(143)


def _watch(parent: int, private: Path) -> None:
    while True:
        if os.getppid() != parent:  # the batch died (killed): we are an orphan now
            _leave(private)
        threading.Event().wait(WATCH_S)


def main() -> int:
    fd, parent = int(sys.argv[1]), int(sys.argv[2])
    private = Path.cwd()
    signal.signal(signal.SIGTERM, lambda *_: _leave(None))  # the batch removes the folder
    threading.Thread(target=_watch, args=(parent, private), daemon=True).start()
    job = json.loads(sys.stdin.read())
    from course_utils.grading.grader import grade_notebook

    result = grade_notebook(
        base64.b64decode(job["data"]),
        job["name"],
        student=job["student"],
        variant=job["variant"],
        lesson=job["lesson"],
        solutions=Path(job["solutions"]),
        folder_files={k: base64.b64decode(v) for k, v in job["folder_files"].items()},
        cell_timeout=job["cell_timeout"],
        total_timeout=job["total_timeout"],
        call_timeout=job["call_timeout"],
        sandbox=job.get("sandbox", True),
        trust_name_cell=job.get("trust_name_cell", False),
    )
    report = {**result.to_dict(), "token": job["token"]}
    with os.fdopen(fd, "wb") as pipe:
        pipe.write(json.dumps(report).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
