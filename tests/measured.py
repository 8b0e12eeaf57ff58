"""Run `python -m course_utils ...` in a child and measure it: exit code, output, CPU seconds
and peak memory (the child's own `getrusage` figures, which do not depend on how busy the
machine is), with its standard streams as a careless user leaves them: stdout on /dev/full,
closed, or a pipe its reader closes after a few bytes; stderr closed.

The commands start from a small runner process (this file, run with `--serve`), one per test
process, not from the test process itself: Linux carries a process's peak resident size
across `exec`, so a child forked from a pytest worker that holds torch would report the
worker's memory as its own peak.

`tree_peak_mb` measures a command with children (grade: workers and kernels) by sampling the
proportional set size of the whole process tree.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def measure(
    command: list[str],
    cwd: Path,
    *,
    stdout: str = "capture",
    stderr: str = "capture",
    env: dict[str, str] | None = None,
    timeout: float = 60,
) -> dict:
    """{code, out, err, cpu, mb (10^6 bytes), wall} of `command` run in `cwd`, started by the
    runner. `stdout`: capture, full (/dev/full), closed or early (a reader that leaves after
    10 bytes); `stderr`: capture or closed. CPU time and peak memory come from `os.wait4`: the
    child's own figures, its waited-for children included (what its `getrusage` says), not the
    machine's."""
    request = {
        "command": command,
        "cwd": str(cwd),
        "stdout": stdout,
        "stderr": stderr,
        "env": {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        "timeout": timeout,
    }
    runner = _runner()
    assert runner.stdin is not None and runner.stdout is not None
    runner.stdin.write(json.dumps(request) + "\n")
    runner.stdin.flush()
    answer = runner.stdout.readline()
    assert answer, "the measuring runner died"
    return json.loads(answer)


@functools.cache
def _runner() -> subprocess.Popen:
    """The small process that starts the commands (-S: no site-packages); it ends when its
    stdin closes, which this process does at exit."""
    import atexit

    runner = subprocess.Popen(
        [sys.executable, "-S", __file__, "--serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    atexit.register(lambda: (runner.stdin and runner.stdin.close(), runner.wait(30)))
    return runner


def _measured(
    command: list[str], cwd: str, stdout: str, stderr: str, env: dict[str, str], timeout: float
) -> dict:
    """In the runner: start `command`, wait for it, and measure it."""
    import tempfile
    import threading

    closing = [fd for fd, mode in ((1, stdout), (2, stderr)) if mode == "closed"]
    if closing:  # sh closes them, then becomes the command: same process, same figures
        shut = " ".join(f"{fd}>&-" for fd in closing)
        command = ["/bin/sh", "-c", f'exec "$@" {shut}', "sh", *command]
    timed_out = threading.Event()
    with (
        tempfile.TemporaryFile("w+") as out_file,
        tempfile.TemporaryFile("w+") as err_file,
        open("/dev/full", "w") as full,
    ):
        sinks = {"capture": out_file, "full": full, "closed": subprocess.DEVNULL}
        start = time.monotonic()
        proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE if stdout == "early" else sinks[stdout],
            stderr=err_file if stderr == "capture" else subprocess.DEVNULL,
            text=True,
            cwd=cwd,
            env=env,
        )
        timer = threading.Timer(timeout, lambda: (timed_out.set(), proc.kill()))
        timer.start()
        try:
            if stdout == "early":  # read a little, then leave, like `| head -c 10`
                assert proc.stdout is not None
                proc.stdout.read(10)
                proc.stdout.close()
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        wall = time.monotonic() - start
        out_file.seek(0)
        err_file.seek(0)
        out, err = out_file.read(), err_file.read()
    if timed_out.is_set():
        err += "\nTIMED OUT"
    return {
        "code": proc.returncode,
        "out": out,
        "err": err,
        "cpu": usage.ru_utime + usage.ru_stime,
        "mb": usage.ru_maxrss * 1024 / 1e6,
        "wall": wall,
    }


def run_course(args: list[str], cwd: Path, *, wrap: list[str] | None = None, **how) -> dict:
    """`measure` of `python -m course_utils ARGS` in `cwd`, under `wrap` (bwrap ...) if given;
    `how`: measure's stdout, stderr, env and timeout."""
    command = [*(wrap or []), sys.executable, "-m", "course_utils", *map(str, args)]
    return measure(command, cwd, **how)


def tree_peak_mb(
    args: list, cwd: Path, timeout: float = 600, env=None, module: str | None = "course_utils"
) -> tuple[int, float]:
    """(exit code, peak MB of the process tree) of `python -m MODULE ARGS` (course_utils's
    commands by default; `python ARGS` for module None): the sum of the proportional set sizes
    (shared pages split between their users; the resident size where the system does not say)
    of the command and all its descendants, every 0.1 s."""
    import psutil

    proc = subprocess.Popen(
        [sys.executable, *(["-m", module] if module else []), *map(str, args)],
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )
    top, peak, deadline = psutil.Process(proc.pid), 0.0, time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        total = 0
        try:
            tree = [top, *top.children(recursive=True)]
        except psutil.Error:
            tree = []
        for p in tree:
            try:
                total += p.memory_full_info().pss
            except (psutil.AccessDenied, AttributeError):
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    pass
            except psutil.Error:
                pass
        peak = max(peak, total / 1e6)
        time.sleep(0.1)
    if proc.poll() is None:
        proc.kill()
    return proc.wait(), peak


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
    for line in sys.stdin:  # one request per line, one answer per line
        print(json.dumps(_measured(**json.loads(line))), flush=True)
