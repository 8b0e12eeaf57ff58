"""One grading job in a process of its own: `python -I -m course_utils.grading.worker FD`.

Started isolated (`-I`: neither its working folder nor PYTHONPATH nor user site packages are
on `sys.path`) in a private folder the batch made for it, so nothing it imports can have been
planted by a submission. The job (JSON) comes on stdin; the result (JSON, with the job's
token) goes to the pipe `FD`, which the learner's kernel does not inherit. See
`course_utils.grading.batch`.
"""

from __future__ import annotations

import base64
import json
import os
import sys
from pathlib import Path


def main() -> int:
    fd = int(sys.argv[1])
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
