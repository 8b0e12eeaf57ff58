"""The gradebook: one row per student, a score and a percent column per lesson, for an LMS.

    write_gradebook(results, Path("gradebook.csv"), roster)

    Student,ID,SIS User ID,SIS Login ID,Section,Lesson 03 score,Lesson 03 percent
    Alice Smith,12345,alice,,,6,100.0
    Bob Jones,12346,bob,,,4,66.7

The first five columns are the ones Canvas's gradebook import reads to find a student (name,
Canvas id = the roster's `lms_id`, SIS user id = the roster's `id`); Moodle's CSV import lets
you map any column to a user field and each lesson column to a grade item (INSTRUCTORS.md
walks through both). A lesson's score is the number of its exercises passed; a notebook that
could not be graded scores 0; a student with no notebook of a lesson gets empty cells, which
both LMSs leave as they were. Where a student handed in more than one notebook of a lesson,
the one `keep` left counted is taken (`grade --keep`: the latest by default; rows nobody
chose between, as from the API, count their best). Rows `keep` never counts (not on the
roster, a folder whose number and name disagree, not kept) are left out. No cell can be taken
for a formula (`neutral.cell`: a name "=HYPERLINK(...)" is written "'=HYPERLINK(...)").
"""

from __future__ import annotations

import csv
from pathlib import Path

from course_utils.grading.grader import GradeResult
from course_utils.grading.keep import counted
from course_utils.grading.neutral import cell
from course_utils.grading.roster import Student

IDENTITY = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]


def lesson_totals(lessons: list[int], solutions: Path) -> dict[int, int]:
    """How many exercises each lesson has (its solution's check cells)."""
    import nbformat

    from course_utils.grading.grader import exercises_of, solution_for

    return {
        n: len(exercises_of(nbformat.read(solution_for(n, solutions), as_version=4)))
        for n in lessons
    }


def write_gradebook(
    results: list[GradeResult],
    path: Path,
    roster: list[Student] | None,
    solutions: Path,
) -> int:
    """Write the gradebook; returns its number of student rows. Without a roster, the
    students are those found (by id), in the order found. Students not on the roster are
    left out: an LMS would not know them (their rows are in the per-notebook CSV)."""
    lessons = sorted({r.lesson for r in results if r.lesson})
    totals = lesson_totals(lessons, solutions)
    if roster is None:
        order = list(dict.fromkeys(r.student for r in results))
        roster = [Student(s, next(r.name for r in results if r.student == s) or s) for s in order]
    best: dict[tuple[str, int], int] = {}
    for r in results:
        if r.lesson and counted(r):
            k = (r.student, r.lesson)
            best[k] = max(best.get(k, 0), r.score)
    columns = [f"Lesson {n:02d} {what}" for n in lessons for what in ("score", "percent")]
    with path.open("w", newline="", encoding="utf-8", errors="backslashreplace") as f:
        writer = csv.writer(f)
        writer.writerow([cell(c) for c in IDENTITY + columns])
        for s in roster:
            cells: list[object] = []
            for n in lessons:
                if (s.id, n) in best:
                    score = best[(s.id, n)]
                    cells += [score, round(100 * score / totals[n], 1) if totals[n] else ""]
                else:
                    cells += ["", ""]
            writer.writerow([cell(c) for c in (s.name, s.lms_id, s.id, "", "", *cells)])
    return len(roster)
