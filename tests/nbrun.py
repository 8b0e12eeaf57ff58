"""Run one notebook in a fresh kernel and report its wall time and the kernel's peak memory.

    python tests/nbrun.py NOTEBOOK [--timeout S] [--allow-errors] [--save OUT.ipynb]
        -> one JSON line on stdout

Used under `taskset` by tests/notebook_runs.py (every notebook once per test session) and
tests/test_constrained.py: the kernel is this process's child, so once it has exited,
RUSAGE_CHILDREN's maximum resident size is the kernel's peak memory. With
--allow-errors every cell runs even after one fails (an exercise notebook's unanswered
checks); --save writes the executed notebook, outputs included, for the tests to read.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

from course_utils.grading.notebook_tools import notebook_client


def main() -> int:
    import nbformat  # after course_utils.grading, which spares it jsonschema's slow formats
    from nbclient.exceptions import CellExecutionError

    parser = argparse.ArgumentParser()
    parser.add_argument("notebook", type=Path)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--allow-errors", action="store_true")
    parser.add_argument("--save", type=Path, default=None)
    args = parser.parse_args()
    nb = nbformat.read(args.notebook, as_version=4)
    client = notebook_client(
        nb,
        timeout=args.timeout,
        kernel_name="python3",
        allow_errors=args.allow_errors,
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
    if args.save is not None:
        nbformat.write(nb, args.save)
    print(json.dumps({"seconds": seconds, "peak_mb": peak_kib / 1024, "error": error,
                      "stdout": outputs}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
