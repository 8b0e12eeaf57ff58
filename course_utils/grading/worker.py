"""One grading job in a process of its own: `python -I -m course_utils.grading.worker FD LIFE`.

Started isolated (`-I`: neither its working folder nor PYTHONPATH nor user site packages are
on `sys.path`) in a private folder the batch made for it, so nothing it imports can have been
planted by a submission. The job (JSON) comes on stdin; the result (JSON, with the job's
token) goes to the pipe `FD`, which the learner's kernel does not inherit. See
`course_utils.grading.batch`. Sandboxed, it runs inside a bwrap of its own that shows it
the machine as it is but for its kernels' sockets folder, a small tmpfs
(`isolation.worker_argv`), and its data segment is capped (`WORKER_MEMORY`, a soft limit
its kernel's own limits replace), so not even a flood of output can grow it without bound.

It never outlives the batch that started it: the worker runs in a session of its own, so
nothing else would tell it that the batch was killed. The batch holds the write end of the
pipe `LIFE`; a watcher thread reads it and sees its end the moment the batch is gone,
however it ended (then nobody will remove its private folder, so it does); SIGTERM (the
batch stopping on Ctrl-C) ends it at once too. Either way it removes the sockets folder it
may have made in /tmp and exits, and its kernel dies with it (bubblewrap's
--die-with-parent; without a sandbox, the kernel is killed).
"""

from __future__ import annotations

import base64
import json
import os
import resource
import shutil
import signal
import sys
import threading
from pathlib import Path

WORKER_MEMORY = 3 << 30  # the worker's own data segment, at most (it uses ~0.4 GiB)


def _leave(private: Path | None) -> None:
    """Remove what this worker left in /tmp (and its private folder if asked), kill the
    kernel it started, and exit at once: no cleanup that could wait on the kernel."""
    from course_utils.grading import sandbox

    sandbox.abandon()
    if private is not None:
        shutil.rmtree(private, ignore_errors=True)
    os._exit(143)


def _watch(life: int, private: Path) -> None:
    while True:
        try:
            if os.read(life, 1) == b"":  # the batch died (killed): we are an orphan now
                _leave(private)
        except InterruptedError:
            continue
        except OSError:
            _leave(private)


def main() -> int:
    fd, life = int(sys.argv[1]), int(sys.argv[2])
    private = Path.cwd()
    signal.signal(signal.SIGTERM, lambda *_: _leave(None))  # the batch removes the folder
    threading.Thread(target=_watch, args=(life, private), daemon=True).start()
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if hard == resource.RLIM_INFINITY or hard > WORKER_MEMORY:
        resource.setrlimit(resource.RLIMIT_DATA, (WORKER_MEMORY, hard))
    job = json.loads(sys.stdin.read())
    from course_utils.grading.grader import grade_notebook
    from course_utils.grading.isolation import Limits

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
        limits=Limits(**job["limits"]) if job.get("limits") else None,
        ipc_root=Path(job["ipc"]) if job.get("ipc") else None,
        cgroup=Path(job["cgroup"]) if job.get("cgroup") else None,
    )
    report = {**result.to_dict(), "token": job["token"]}
    with os.fdopen(fd, "wb") as pipe:
        pipe.write(json.dumps(report).encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
