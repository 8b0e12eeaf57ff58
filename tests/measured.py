"""Run `python -m course_utils ...` in a child and measure it: exit code, output, CPU seconds
and peak memory (the child's own `getrusage` figures, which do not depend on how busy the
machine is), with its standard streams as a careless user leaves them: stdout on /dev/full,
closed, or a pipe its reader closes after a few bytes; stderr closed.

`tree_peak_mb` measures a command with children (grade: workers and kernels) by sampling the
proportional set size of the whole process tree.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Runs in a child: starts the command with the streams asked for, waits, reports as JSON.
RUNNER = r"""
import json, os, resource, subprocess, sys, time
mode, err_mode, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
cmd = sys.argv[4:]
closing = []
if mode == "closed":
    closing.append(1)
if err_mode == "closed":
    closing.append(2)

def close_streams():
    for fd in closing:
        os.close(fd)

stdout = {"capture": subprocess.PIPE, "full": open("/dev/full", "w"),
          "closed": subprocess.DEVNULL, "early": subprocess.PIPE}[mode]
stderr = subprocess.PIPE if err_mode == "capture" else subprocess.DEVNULL
start = time.monotonic()
proc = subprocess.Popen(cmd, stdout=stdout, stderr=stderr, text=True, preexec_fn=close_streams)
if mode == "early":  # read a little, then leave, like `| head -c 10`
    proc.stdout.read(10)
    proc.stdout.close()
    proc.stdout = None
try:
    out, err = proc.communicate(timeout=timeout)
except subprocess.TimeoutExpired:
    proc.kill()
    out, err = proc.communicate()
    err = (err or "") + "\nTIMED OUT"
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"code": proc.returncode, "out": out or "", "err": err or "",
                  "cpu": usage.ru_utime + usage.ru_stime, "mb": usage.ru_maxrss * 1024 / 1e6,
                  "wall": time.monotonic() - start}))
"""


def run_course(
    args: list[str],
    cwd: Path,
    *,
    stdout: str = "capture",
    stderr: str = "capture",
    env: dict[str, str] | None = None,
    timeout: float = 60,
    wrap: list[str] | None = None,
) -> dict:
    """{code, out, err, cpu, mb (10^6 bytes), wall} of `python -m course_utils ARGS` in `cwd`.
    `stdout`: capture, full (/dev/full), closed or early (a reader that leaves after 10
    bytes); `stderr`: capture or closed; `wrap`: a command it runs under (bwrap ...)."""
    command = [*(wrap or []), sys.executable, "-m", "course_utils", *map(str, args)]
    out = subprocess.run(
        [sys.executable, "-c", RUNNER, stdout, stderr, str(timeout), *command],
        capture_output=True,
        text=True,
        timeout=timeout + 60,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def tree_peak_mb(args: list[str], cwd: Path, timeout: float = 600, env=None) -> tuple[int, float]:
    """(exit code, peak MB of the process tree) of `python -m course_utils ARGS`: the sum of
    the proportional set sizes (shared pages split between their users; the resident size
    where the system does not say) of the command and all its descendants, every 0.1 s."""
    import psutil

    proc = subprocess.Popen(
        [sys.executable, "-m", "course_utils", *map(str, args)],
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
