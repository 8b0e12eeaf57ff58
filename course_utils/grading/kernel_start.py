"""Inside a learner's sandbox, before any of their code: set the limits, make the scratch copy,
then become the kernel.

    python -I -S kernel_start.py '{"limits": {...}, "handout": ..., "work": ...}' -- KERNEL...

Run by `isolation.kernel_argv` as the sandbox's command. It uses the standard library only
(it runs with `-S`, before the virtual environment is on the path), sets the limits with
`setrlimit` (what `prlimit` does) so that they hold for the kernel and everything it starts,
copies the submission's folder (mounted read-only) into the memory-backed working folder, and
`exec`s the kernel, which keeps the process, the limits and the working folder.
"""

import json
import os
import resource
import shutil
import sys


def main() -> None:
    settings = json.loads(sys.argv[1])
    command = sys.argv[sys.argv.index("--") + 1 :]
    limits = settings["limits"]
    for which, value in (
        (resource.RLIMIT_DATA, limits["memory_bytes"]),
        (resource.RLIMIT_NPROC, limits["processes"]),
        (resource.RLIMIT_FSIZE, limits["file_bytes"]),
        (resource.RLIMIT_CORE, 0),
    ):
        resource.setrlimit(which, (value, value))
    # SIGXCPU at the soft limit, SIGKILL ten seconds later.
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_seconds"], limits["cpu_seconds"] + 10))
    shutil.copytree(settings["handout"], settings["work"], dirs_exist_ok=True)
    if "fonts" in settings:
        cache = os.environ["MPLCONFIGDIR"]
        os.makedirs(cache, exist_ok=True)
        for name in os.listdir(settings["fonts"]):
            if name.startswith("fontlist-v") and name.endswith(".json"):
                shutil.copyfile(os.path.join(settings["fonts"], name), os.path.join(cache, name))
    os.chdir(settings["work"])
    os.execv(command[0], command)


if __name__ == "__main__":
    main()
