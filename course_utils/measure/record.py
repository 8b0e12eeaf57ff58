"""Record the reference twins: run every lesson on an idle machine and store what it measured.

    make record-reference            (python -m course_utils.measure.record)

Checks first that the machine is idle (the capacity probe must see two free cores, or the
recording would teach a busy machine's numbers as the reference), then runs each lesson in
notebooks/ top to bottom in a fresh kernel with COURSE_RECORD_REFERENCE=1: each measured
experiment stores its measurement in course_utils/data/reference/ instead of loading it.
`--force` records even on a busy machine (the files then say so through their capacity).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from course_utils.measure import reference
from course_utils.measure.capacity import IDLE_TWO_CORES, probe

ROOT = Path(__file__).resolve().parents[2]


def run_lesson(path: Path, timeout: float = 600) -> float:
    """Execute one notebook in a fresh kernel (recording mode); its wall time in seconds."""
    import nbformat

    from course_utils.grading.notebook_tools import notebook_client

    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    notebook_client(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    ).execute()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_utils.measure.record")
    parser.add_argument("lessons", nargs="*", type=Path, help="default: every notebooks/NN_*.ipynb")
    parser.add_argument("--force", action="store_true", help="record even on a busy machine")
    args = parser.parse_args(argv)
    capacity = probe()
    print(capacity.sentence())
    if capacity.speedup < IDLE_TWO_CORES and not args.force:
        print(
            "record-reference: the machine is not idle (2 threads must run at least "
            f"{IDLE_TWO_CORES}x as fast as 1): close other programs and try again, or --force",
            file=sys.stderr,
        )
        return 1
    lessons = args.lessons or sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    os.environ[reference.RECORD_ENV] = "1"  # the kernels inherit it
    for lesson in lessons:
        seconds = run_lesson(lesson)
        print(f"{lesson.name}: {seconds:.0f} s")
    written = sorted(reference.FOLDER.glob("*.json"))
    print(f"{len(written)} reference recordings in {reference.FOLDER}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
