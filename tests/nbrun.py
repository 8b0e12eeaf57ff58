"""Run one notebook in a fresh kernel and report its wall time and the kernel's peak memory.

    python tests/nbrun.py NOTEBOOK [--timeout S]     -> one JSON line on stdout

Used by tests/test_constrained.py under `taskset`: the kernel is this process's child, so
once it has exited, RUSAGE_CHILDREN's maximum resident size is the kernel's peak memory.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import nbformat
from nbclient.exceptions import CellExecutionError

from course_utils.grading.notebook_tools import notebook_client


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("notebook", type=Path)
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    nb = nbformat.read(args.notebook, as_version=4)
    client = notebook_client(
        nb,
        timeout=args.timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(args.notebook.parent)}},
    )
    start, error = time.perf_counter(), None
    try:
        client.execute()
    except CellExecutionError as exc:
        error = str(exc).splitlines()[-1] if str(exc) else type(exc).__name__
    except Exception as exc:  # a time-out or a dead kernel: report it, do not hide it
        error = f"{type(exc).__name__}: {exc}"
    seconds = time.perf_counter() - start
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # Linux: KiB
    outputs = "\n".join(
        o.get("text", "")
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.get("output_type") == "stream"
    )
    print(json.dumps({"seconds": seconds, "peak_mb": peak_kib / 1024, "error": error,
                      "stdout": outputs}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
