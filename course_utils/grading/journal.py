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
graded scores 0 of no total. Each exercise's column holds the points it earned (1 or 0 for an
exercise worth 1 point).

The manual review: the CSV ends with two columns for the instructor, `review` (points to add
to the notebook's score, or to take with a minus sign) and `review note` (why, shown on the
student's feedback page), and `final`, the score with the review, which the gradebook takes.
Fill them in (any spreadsheet; `;`-separated and decimal commas are read too) and run the
same command again: `previous` reads them back (`reviews`) with the rows, each row keeps its
review while its notebook is the same file, and every row written carries it again, so it
survives any number of reruns. A review of a row without a notebook (`missing`), or one that
is not a number, is not taken and is said so (`Reviews.problems`).
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from course_utils.grading.grader import GradeResult, tidy
from course_utils.grading.neutral import FORMULA_START, cell

REVIEW, NOTE, FINAL = "review", "review note", "final"
MAX_REVIEW = 1000.0  # points a review may add or take, at most
DECIMAL_COMMA = re.compile(r"[+-]?\d+,\d+")


def header(exercise_ids: list[str]) -> list[str]:
    return [
        "student", "name", "notebook", "lesson", "variant", "status", "score", "total",
        *exercise_ids, "tampered", "problem", REVIEW, NOTE, FINAL,
    ]  # fmt: skip


def status(result: GradeResult) -> str:
    """'graded', 'not graded', or what is special about the row ('missing', 'default
    numbers', 'name cell edited', 'not on the roster', ...)."""
    if result.flags:
        return "; ".join(result.flags)
    return "not graded" if result.problem else "graded"


def row(result: GradeResult, exercise_ids: list[str]) -> list[object]:
    marks = {e.id: e.earned for e in result.exercises}
    tampered = "; ".join(f"{t['cell']} {t['status']}" for t in result.tampering)
    missing = "missing" in result.flags
    review = "" if result.review is None else tidy(result.review)
    cells = [
        result.student, result.name, result.notebook, result.lesson or "", result.variant,
        status(result), "" if missing else result.score, result.total or "",
        *(marks.get(i, "") for i in exercise_ids), tampered, result.problem or "",
        review, result.review_note, "" if missing else result.final(),
    ]  # fmt: skip
    return [cell(c) for c in cells]


@dataclass
class Reviews:
    """The manual reviews an instructor wrote into a CSV the grader wrote: {notebook:
    (points, note)}, and what could not be taken (one line each)."""

    found: dict[str, tuple[float | None, str]] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def apply(self, result: GradeResult) -> None:
        """Give `result` its notebook's review (none if the CSV has none for it)."""
        result.review, result.review_note = self.found.get(result.notebook, (None, ""))


def _unquoted(text: str) -> str:
    """A cell as the instructor typed it: the `'` `neutral.cell` put before a formula-like
    text taken off again."""
    text = text.strip()
    return text[1:] if text.startswith("'") and text[1:].startswith(FORMULA_START) else text


def _points(text: str) -> float:
    text = _unquoted(text).removeprefix("'").strip()
    if DECIMAL_COMMA.fullmatch(text):
        text = text.replace(",", ".")
    value = float(text)  # ValueError for anything but a number
    if not math.isfinite(value) or abs(value) > MAX_REVIEW:
        raise ValueError(text)
    return value


def reviews(path: Path) -> Reviews:
    """The reviews in the CSV at `path` (none if there is no such file or column)."""
    found = Reviews()
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError):
        return found
    first = text.split("\n", 1)[0]
    delimiter = max(",;\t", key=first.count)  # a spreadsheet may save with ; or tabs
    lines = csv.DictReader(text.splitlines(), delimiter=delimiter)
    if REVIEW not in (lines.fieldnames or []):
        return found
    for number, line in enumerate(lines, start=2):
        value, note = (line.get(REVIEW) or "").strip(), _unquoted(line.get(NOTE) or "")
        if not value and not note:
            continue
        notebook = _unquoted(line.get("notebook") or "")
        where = f"{path.name} line {number}"
        if not notebook:
            who = line.get("student") or "?"
            found.problems.append(f"{where}: a review of {who}'s row with no notebook is not taken")
            continue
        points: float | None = None
        if value:
            try:
                points = _points(value)
            except ValueError:
                found.problems.append(
                    f"{where}: review {value!r} is not a number of points (e.g. 1.5 or -2, "
                    f"at most {MAX_REVIEW:g}): not taken"
                )
                continue
        found.found[notebook] = (points, note)
    return found


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
        self.reviews: Reviews | None = None  # the instructor's, read back by `previous`

    def previous(self) -> dict[str, GradeResult]:
        """{notebook: its row} of the rows with a score from an earlier run (a torn last line
        is ignored); whether one still holds is its resume key's to say."""
        found: dict[str, GradeResult] = {}
        self.reviews = reviews(self.csv_path)
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

    def _reviewed(self, results: list[GradeResult]) -> list[GradeResult]:
        """`results`, each with the review the CSV gave its notebook (when it was read)."""
        if self.reviews is not None:
            for result in results:
                if result.notebook:
                    self.reviews.apply(result)
        return results

    def open(self, exercise_ids: list[str], kept: list[GradeResult]) -> None:
        """Start both files afresh with the rows kept from the earlier run (merging: and
        the earlier rows of the other notebooks)."""
        others = self._others(kept)
        earlier_ids = {e.id for r in others for e in r.exercises}
        self.ids = exercise_order(set(exercise_ids) | earlier_ids) if others else exercise_ids
        rows = self._reviewed(others + kept)
        write_csv(rows, self.csv_path, self.ids)
        partial = self.jsonl_path.with_name(self.jsonl_path.name + ".partial")
        partial.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in rows), encoding="utf-8")
        os.replace(partial, self.jsonl_path)
        self._csv = self.csv_path.open("a", newline="", encoding="utf-8", errors="backslashreplace")
        self._jsonl = self.jsonl_path.open("a", encoding="utf-8")

    def add(self, result: GradeResult) -> None:
        assert self._csv is not None and self._jsonl is not None, "open() the journal first"
        self._reviewed([result])
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
        results = self._reviewed(self._others(results) + results)
        write_csv(results, self.csv_path, self.ids or None)
        partial = self.jsonl_path.with_name(self.jsonl_path.name + ".partial")
        partial.write_text(
            "".join(json.dumps(r.to_dict()) + "\n" for r in results), encoding="utf-8"
        )
        os.replace(partial, self.jsonl_path)
