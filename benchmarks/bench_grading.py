"""Benchmark: a class of 30 lesson-06 notebooks graded at -j 2, each kernel in its sandbox.

Target (issue 24): under 4 minutes on 2 cores. The class is lesson 06's solution, its blank
exercise version and partial answers (the first exercise left blank), plus two broken files
(truncated JSON, not a notebook), in 30 sub-folders: the batch must give 30 rows, and the
solved ones full marks. Then the sandbox's own cost: six of the notebooks graded one at a
time, alternately with and without the sandbox (so a busy machine slows both alike), and the
mean difference per notebook. Exits 1 if the class takes 4 minutes or more or a row is wrong.

    .venv/bin/python benchmarks/bench_grading.py
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from course_utils.grading.batch import grade_all

ROOT = Path(__file__).resolve().parents[1]
NAME = "06_data_parallelism.ipynb"
SIZE = 30
TARGET_S = 240.0


def make_class(folder: Path) -> dict[str, str]:
    """The class in `folder`; returns {student: "solved" | "blank" | "partial" | "broken"}."""
    solved = nbformat.read(ROOT / "solutions" / NAME, as_version=4)
    blank = nbformat.read(ROOT / "exercises" / NAME, as_version=4)
    blank_cells = {c.get("id"): c for c in blank.cells}
    kinds = {}
    for i in range(SIZE - 2):
        kind = ("solved", "blank", "partial")[i % 3]
        nb = blank if kind == "blank" else nbformat.reads(nbformat.writes(solved), as_version=4)
        if kind == "partial":
            for c in nb.cells:
                if c.get("id") == "answer-06-1":
                    c.source = blank_cells["answer-06-1"].source
        (folder / f"student{i:02d}").mkdir()
        nbformat.write(nb, folder / f"student{i:02d}" / NAME)
        kinds[f"student{i:02d}"] = kind
    for i, text in enumerate((nbformat.writes(solved)[:400], "not a notebook"), start=1):
        (folder / f"broken{i}").mkdir()
        (folder / f"broken{i}" / NAME).write_text(text)
        kinds[f"broken{i}"] = "broken"
    return kinds


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "class"
        folder.mkdir()
        kinds = make_class(folder)
        start = time.perf_counter()
        results = grade_all([folder], jobs=2)
        seconds = time.perf_counter() - start
        print(f"-j 2, sandboxed: {seconds:.1f} s for {len(results)} rows "
              f"(target: under {TARGET_S:.0f} s)", flush=True)  # fmt: skip
        total = max(r.total for r in results)
        wrong = [
            r.student
            for r in results
            if (kinds[r.student] == "solved" and r.score != total)
            or (kinds[r.student] in ("blank", "broken") and r.score != 0)
            or (kinds[r.student] == "partial" and r.score != total - 1)
        ]
        if wrong:
            print(f"wrong scores: {wrong}")

        sample = [folder / s for s in sorted(kinds) if kinds[s] in ("solved", "blank")][:6]
        times: dict[bool, list[float]] = {True: [], False: []}
        for path in sample:
            for sandbox in (True, False):
                t0 = time.perf_counter()
                grade_all([path], sandbox=sandbox)
                times[sandbox].append(time.perf_counter() - t0)
        with_box, without = statistics.mean(times[True]), statistics.mean(times[False])
        print(f"one notebook at a time: {with_box:.2f} s in the sandbox, {without:.2f} s without: "
              f"the sandbox adds {with_box - without:+.2f} s per notebook "
              f"({100 * (with_box - without) / without:+.0f}%)")  # fmt: skip
    ok = len(results) == SIZE and not wrong and seconds < TARGET_S
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
