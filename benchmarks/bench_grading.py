"""Benchmark: grading a class of 30 notebooks serially and with 2 workers (target: -j 2 faster).

The class is lesson 03's solution, its blank exercise version and partial answers, plus two
broken files (truncated JSON, not a notebook), in 30 sub-folders: the batch must give 30
rows. Both runs grade the same files in the same process, one after the other; the figure is
the ratio of their wall times. Exits 1 if -j 2 is not faster than serial or a row is missing.

    .venv/bin/python benchmarks/bench_grading.py
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import nbformat

from course_utils.grading.batch import grade_all

ROOT = Path(__file__).resolve().parents[1]
SIZE = 30


def make_class(folder: Path) -> None:
    solved = nbformat.read(ROOT / "solutions" / "03_bubble_tradeoff.ipynb", as_version=4)
    blank = nbformat.read(ROOT / "exercises" / "03_bubble_tradeoff.ipynb", as_version=4)
    for i in range(SIZE - 2):
        nb = solved if i % 3 == 0 else blank if i % 3 == 1 else solved
        if i % 3 == 2:  # a partial one: the first exercise left blank
            nb = nbformat.reads(nbformat.writes(solved), as_version=4)
            blank_cells = {c.get("id"): c for c in blank.cells}
            for c in nb.cells:
                if c.get("id") == "answer-03-1":
                    c.source = blank_cells["answer-03-1"].source
        (folder / f"student{i:02d}").mkdir()
        nbformat.write(nb, folder / f"student{i:02d}" / "03_bubble_tradeoff.ipynb")
    (folder / "broken1").mkdir()
    (folder / "broken1" / "03_bubble_tradeoff.ipynb").write_text(nbformat.writes(solved)[:400])
    (folder / "broken2").mkdir()
    (folder / "broken2" / "03_bubble_tradeoff.ipynb").write_text("not a notebook")


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        make_class(folder)
        times, rows = {}, {}
        for jobs in (1, 2):
            start = time.perf_counter()
            results = grade_all([folder], jobs=jobs)
            times[jobs] = time.perf_counter() - start
            rows[jobs] = len(results)
            print(f"-j {jobs}: {times[jobs]:.1f} s for {len(results)} rows", flush=True)
    ratio = times[1] / times[2]
    print(f"-j 2 is {ratio:.2f}x as fast as serial")
    ok = rows[1] == rows[2] == SIZE and ratio > 1.0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
