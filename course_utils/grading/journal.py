"""The per-notebook CSV, written row by row as notebooks finish, so a batch can be resumed.

    journal = Journal(Path("grades.csv"))
    done = journal.previous()            # {notebook: result} of an earlier, perhaps killed, run
    journal.open(columns, kept)          # header + the rows kept from that run
    journal.add(result)                  # one row, on disk as soon as the notebook is graded
    journal.close(all_results)           # the whole table again, in the order found

Beside `grades.csv` it keeps `grades.jsonl`: each row's full result (every exercise's
message, the notes), one JSON object per line, which is what a rerun reads back to skip the
notebooks already graded (same file, same bytes, same numbers, same lesson) and what the
gradebook, the feedback and the statistics are made from. Whether a row still holds is the
resume key's to say (`resume.py`); a row without a score (the grading failed: a kernel that
never started, a worker that was killed) is graded again. A journal opened to `merge` (one
notebook regraded with `grade FILE --student NAME --csv grades.csv`) keeps the earlier rows
of every other notebook, so the class's table gains the row instead of being replaced by it.
Every cell of the CSV is written through `neutral.cell`, so none can be taken for a
spreadsheet formula. A `missing` row has no score and no total; a notebook that could not be
graded scores 0 of no total.
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import TextIO

from course_utils.grading.grader import GradeResult
from course_utils.grading.neutral import cell


def header(exercise_ids: list[str]) -> list[str]:
    return [
        "student", "name", "notebook", "lesson", "variant", "status", "score", "total",
        *exercise_ids, "tampered", "problem",
    ]  # fmt: skip


def status(result: GradeResult) -> str:
    """'graded', 'not graded', or what is special about the row ('missing', 'default
    numbers', 'name cell edited', 'not on the roster', ...)."""
    if result.flags:
        return "; ".join(result.flags)
    return "not graded" if result.problem else "graded"


def row(result: GradeResult, exercise_ids: list[str]) -> list[object]:
    marks = {e.id: int(e.passed) for e in result.exercises}
    tampered = "; ".join(f"{t['cell']} {t['status']}" for t in result.tampering)
    missing = "missing" in result.flags
    cells = [
        result.student, result.name, result.notebook, result.lesson or "", result.variant,
        status(result), "" if missing else result.score, result.total or "",
        *(marks.get(i, "") for i in exercise_ids), tampered, result.problem or "",
    ]  # fmt: skip
    return [cell(c) for c in cells]


def exercise_order(ids: set[str]) -> list[str]:
    return sorted(ids, key=lambda s: tuple(map(int, s.split("."))))


def write_csv(results: list[GradeResult], path: Path, exercise_ids: list[str] | None = None):
    """One row per notebook: student, name, notebook, lesson, variant, status, score, total,
    a 1/0 column per exercise, the locked cells changed or removed, and why a notebook was
    not graded. Written to a temporary file first, then renamed: never half a table."""
    ids = exercise_ids or exercise_order({e.id for r in results for e in r.exercises})
    partial = path.with_name(path.name + ".partial")
    with partial.open("w", newline="", encoding="utf-8", errors="backslashreplace") as f:
        writer = csv.writer(f)
        writer.writerow([cell(c) for c in header(ids)])
        writer.writerows(row(r, ids) for r in results)
    os.replace(partial, path)


class Journal:
    def __init__(self, csv_path: Path, merge: bool = False) -> None:
        self.csv_path = csv_path
        self.jsonl_path = csv_path.with_suffix(".jsonl")
        self.merge = merge
        self.ids: list[str] = []
        self._earlier: list[GradeResult] = []
        self._csv: TextIO | None = None
        self._jsonl: TextIO | None = None

    def previous(self) -> dict[str, GradeResult]:
        """{notebook: its row} of the rows with a score from an earlier run (a torn last line
        is ignored); whether one still holds is its resume key's to say."""
        found: dict[str, GradeResult] = {}
        if not self.jsonl_path.is_file():
            return found
        for line in self.jsonl_path.read_text(encoding="utf-8").splitlines():
            try:
                result = GradeResult.from_dict(json.loads(line))
            except (ValueError, KeyError, TypeError):
                continue
            self._earlier.append(result)
            if result.problem is None and result.sha256 and "missing" not in result.flags:
                found[result.notebook] = result
        return found

    def _others(self, results: list[GradeResult]) -> list[GradeResult]:
        """Merging: the earlier rows of other notebooks (not a `missing` row of a student
        and lesson that has a notebook now)."""
        if not self.merge:
            return []
        mine = {r.notebook for r in results if r.notebook}
        have = {(r.student, r.lesson) for r in results}
        return [
            r
            for r in self._earlier
            if (r.notebook and r.notebook not in mine)
            or (not r.notebook and (r.student, r.lesson) not in have)
        ]

    def open(self, exercise_ids: list[str], kept: list[GradeResult]) -> None:
        """Start both files afresh with the rows kept from the earlier run (merging: and
        the earlier rows of the other notebooks)."""
        others = self._others(kept)
        earlier_ids = {e.id for r in others for e in r.exercises}
        self.ids = exercise_order(set(exercise_ids) | earlier_ids) if others else exercise_ids
        rows = others + kept
        write_csv(rows, self.csv_path, self.ids)
        partial = self.jsonl_path.with_name(self.jsonl_path.name + ".partial")
        partial.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in rows), encoding="utf-8")
        os.replace(partial, self.jsonl_path)
        self._csv = self.csv_path.open("a", newline="", encoding="utf-8", errors="backslashreplace")
        self._jsonl = self.jsonl_path.open("a", encoding="utf-8")

    def add(self, result: GradeResult) -> None:
        assert self._csv is not None and self._jsonl is not None, "open() the journal first"
        csv.writer(self._csv).writerow(row(result, self.ids))
        self._jsonl.write(json.dumps(result.to_dict()) + "\n")
        for f in (self._csv, self._jsonl):
            f.flush()
            os.fsync(f.fileno())

    def close(self, results: list[GradeResult]) -> None:
        """The finished table, in the order the notebooks were found (then roster rows)."""
        for f in (self._csv, self._jsonl):
            if f is not None:
                f.close()
        self._csv = self._jsonl = None
        results = self._others(results) + results
        write_csv(results, self.csv_path, self.ids or None)
        partial = self.jsonl_path.with_name(self.jsonl_path.name + ".partial")
        partial.write_text(
            "".join(json.dumps(r.to_dict()) + "\n" for r in results), encoding="utf-8"
        )
        os.replace(partial, self.jsonl_path)
