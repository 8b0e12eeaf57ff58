"""Benchmark: a class of 30 notebooks graded at -j 2, each kernel in its sandbox, per lesson.

Target (issues 24, 40 and 41): under 4 minutes on 2 cores, for each class. Three classes:

- lesson 06 (issue 24);
- lesson 01 (issue 40), whose Exercise 1.7 runs the learner's per-rank program on the
  device threads in the kernel (`run_ranks`) and judges the run's evidence in the grader;
- lesson 04 (issue 41), whose Exercise 4.7 does the same with a 1F1B program on three
  pipelines (memory and order judged too).

A class is the lesson's solution, its blank exercise version and partial answers (one Build
left blank: 6.1, 1.7, 4.7), plus two broken files (truncated JSON, not a notebook), in 30
sub-folders: the batch must give 30 rows, the solved ones full marks. Then, for lesson 06's
class, the sandbox's own cost: six of the notebooks graded one at a time, alternately with
and without the sandbox (so a busy machine slows both alike), and the mean difference per
notebook. Exits 1 if a class takes 4 minutes or more or a row is wrong.

    .venv/bin/python benchmarks/bench_grading.py          # every class
    .venv/bin/python benchmarks/bench_grading.py 04       # lesson 04's class only
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
CLASSES = {  # lesson: (notebook, the answer cell a partial submission leaves blank)
    "06": ("06_data_parallelism.ipynb", "answer-06-1"),
    "01": ("01_naive_model_parallelism.ipynb", "answer-01-7"),
    "04": ("04_1f1b_zero_bubble.ipynb", "answer-04-7"),
}
SIZE = 30
TARGET_S = 240.0


def make_class(folder: Path, name: str, left_blank: str) -> dict[str, str]:
    """The class in `folder`; returns {student: "solved" | "blank" | "partial" | "broken"}."""
    solved = nbformat.read(ROOT / "solutions" / name, as_version=4)
    blank = nbformat.read(ROOT / "exercises" / name, as_version=4)
    blank_cells = {c.get("id"): c for c in blank.cells}
    kinds = {}
    for i in range(SIZE - 2):
        kind = ("solved", "blank", "partial")[i % 3]
        nb = blank if kind == "blank" else nbformat.reads(nbformat.writes(solved), as_version=4)
        if kind == "partial":
            for c in nb.cells:
                if c.get("id") == left_blank:
                    c.source = blank_cells[left_blank].source
        (folder / f"student{i:02d}").mkdir()
        nbformat.write(nb, folder / f"student{i:02d}" / name)
        kinds[f"student{i:02d}"] = kind
    for i, text in enumerate((nbformat.writes(solved)[:400], "not a notebook"), start=1):
        (folder / f"broken{i}").mkdir()
        (folder / f"broken{i}" / name).write_text(text)
        kinds[f"broken{i}"] = "broken"
    return kinds


def grade_class(lesson: str, sandbox_cost: bool) -> bool:
    name, left_blank = CLASSES[lesson]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "class"
        folder.mkdir()
        kinds = make_class(folder, name, left_blank)
        start = time.perf_counter()
        results = grade_all([folder], jobs=2)
        seconds = time.perf_counter() - start
        print(f"lesson {lesson}, -j 2, sandboxed: {seconds:.1f} s for {len(results)} rows "
              f"(target: under {TARGET_S:.0f} s)", flush=True)  # fmt: skip
        total = max(r.total for r in results)
        _, nn, k = left_blank.split("-")  # the exercise left blank, and the points it is worth
        worth = {e.id: e.points for r in results for e in r.exercises}[f"{int(nn)}.{int(k)}"]
        wrong = [
            r.student
            for r in results
            if (kinds[r.student] == "solved" and r.score != total)
            or (kinds[r.student] in ("blank", "broken") and r.score != 0)
            or (kinds[r.student] == "partial" and r.score != total - worth)
        ]
        if wrong:
            print(f"wrong scores: {wrong}")
        if sandbox_cost:
            sample = [folder / s for s in sorted(kinds) if kinds[s] in ("solved", "blank")][:6]
            times: dict[bool, list[float]] = {True: [], False: []}
            for path in sample:
                for sandbox in (True, False):
                    t0 = time.perf_counter()
                    grade_all([path], sandbox=sandbox)
                    times[sandbox].append(time.perf_counter() - t0)
            with_box, without = statistics.mean(times[True]), statistics.mean(times[False])
            print(f"one notebook at a time: {with_box:.2f} s in the sandbox, {without:.2f} s "
                  f"without: the sandbox adds {with_box - without:+.2f} s per notebook "
                  f"({100 * (with_box - without) / without:+.0f}%)")  # fmt: skip
    return len(results) == SIZE and not wrong and seconds < TARGET_S


def main(lessons: list[str]) -> int:
    unknown = [x for x in lessons if x not in CLASSES]
    if unknown:
        print(f"lessons must be among {', '.join(CLASSES)}, got {', '.join(unknown)}")
        return 2
    ok = [grade_class(lesson, sandbox_cost=lesson == "06") for lesson in lessons]
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or list(CLASSES)))
