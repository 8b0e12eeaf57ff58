"""The gradebook: one row per student, a score and a percent column per lesson, as an LMS
imports it (`--lms canvas`, the default, or `--lms moodle`).

    write_gradebook(results, Path("gradebook.csv"), roster, solutions, lms="canvas")

Canvas (Grades -> Import), as Canvas's `GradebookImporter` reads a file:

    Student,ID,SIS User ID,SIS Login ID,Section,Lesson 03 score,Lesson 03 percent
    Points Possible,,,,,9,100
    Alice Smith,12345,alice,asmith@uni.edu,,9,100.0
    Bob Jones,12346,bob,bjones@uni.edu,,4.5,50.0

The first five columns are those Canvas finds a student by, in its order: `ID` (Canvas's user
id, the roster's `lms_id`), `SIS User ID` (the roster's `id`), `SIS Login ID` (the roster's
`login`), then the name. The row whose first cell says "Points Possible" gives each column
Canvas does not know (a new assignment) its points: the lesson's points for the score, 100
for the percent.

Moodle (Grades -> Import -> CSV file), as its `gradeimport_csv` reads a file: one row per
student, a column that identifies them, mapped in the import to a user field ("Map from" a
column, "Map to" email address, username, ID number or user id), and grade columns, each
mapped to a grade item or "new grade item":

    Full name,ID number,Email address,Lesson 03 score (out of 9),Lesson 03 percent
    Alice Smith,alice,asmith@uni.edu,9,100.0
    Dave Lee,dave,dlee@uni.edu,-,-

No row of points possible: Moodle would take it for a student. A grade item's maximum is its
own (100 for a new one, the percent column's scale), and "-" is Moodle's "no grade". The
login column is headed "Email address" when every login is one, else "Username".

A lesson's score is the points the counted notebook earned plus the instructor's review
(`GradeResult.final`), within 0 and the lesson's points (its solution's exercises, each worth
what its check declares); a notebook that could not be graded scores 0 (plus its review); a
student with no notebook of a lesson gets empty cells (Moodle: "-"), which both LMSs leave as
they were. Where a student handed in more than one notebook of a lesson, the one `keep` left
counted is taken (`grade --keep`: the latest by default; rows nobody chose between, as from
the API, count their best). Rows `keep` never counts (not on the roster, a folder whose number
and name disagree, not kept) are left out. No cell can be taken for a formula (`neutral.cell`:
a name "=HYPERLINK(...)" is written "'=HYPERLINK(...)").
"""

from __future__ import annotations

import csv
from pathlib import Path

from course_utils.grading.grader import GradeResult, tidy
from course_utils.grading.keep import counted
from course_utils.grading.neutral import cell
from course_utils.grading.roster import LMS, Student

IDENTITY = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]  # Canvas's
POINTS_POSSIBLE = "Points Possible"
MOODLE_NO_GRADE = "-"


def lesson_totals(lessons: list[int], solutions: Path) -> dict[int, float]:
    """The points each lesson is worth: its solution's exercises, each worth what its check
    declares."""
    import importlib

    import nbformat

    from course_utils.grading.grader import exercises_of, solution_for
    from course_utils.grading.judge import worth

    totals = {}
    for n in lessons:
        module = importlib.import_module(f"course_utils.checks.l{n:02d}")
        found = exercises_of(nbformat.read(solution_for(n, solutions), as_version=4))
        totals[n] = tidy(sum(worth(module, ex.k)[0] for ex in found))
    return totals


def login_header(roster: list[Student]) -> str | None:
    """Moodle's name for the roster's login column: "Email address" when every login is one,
    else "Username" (None: the roster has no login)."""
    logins = [s.login for s in roster if s.login]
    if not logins:
        return None
    return "Email address" if all("@" in x for x in logins) else "Username"


def notes(roster: list[Student] | None, lms: str) -> list[str]:
    """What to know before importing the gradebook into `lms`: students it may not find."""
    if lms != "moodle" or not roster or login_header(roster) is None:
        return []
    without = [s.id for s in roster if not s.login]
    if not without:
        return []
    return [
        f"{len(without)} students have no login in the roster ({', '.join(without[:5])}"
        f'{", ..." if len(without) > 5 else ""}): in Moodle\'s import map "ID number", or give '
        "them one (Moodle gives a row whose identifier is empty the grades of the row above)"
    ]


def write_gradebook(
    results: list[GradeResult],
    path: Path,
    roster: list[Student] | None,
    solutions: Path,
    lms: str = "canvas",
) -> int:
    """Write the gradebook for `lms`; returns its number of student rows. Without a roster,
    the students are those found (by id), in the order found. Students not on the roster are
    left out: an LMS would not know them (their rows are in the per-notebook CSV)."""
    if lms not in LMS:
        raise ValueError(f"lms must be one of {LMS}, got {lms!r}")
    lessons = sorted({r.lesson for r in results if r.lesson})
    totals = lesson_totals(lessons, solutions)
    if roster is None:
        order = list(dict.fromkeys(r.student for r in results))
        roster = [Student(s, next(r.name for r in results if r.student == s) or s) for s in order]
    best: dict[tuple[str, int], float] = {}
    for r in results:
        if r.lesson and counted(r):
            k = (r.student, r.lesson)
            best[k] = max(best.get(k, 0), r.final(totals[r.lesson]))
    empty = MOODLE_NO_GRADE if lms == "moodle" else ""
    rows: list[list[object]] = []
    for s in roster:
        cells: list[object] = []
        for n in lessons:
            if (s.id, n) in best:
                score = best[(s.id, n)]
                cells += [score, round(100 * score / totals[n], 1) if totals[n] else empty]
            else:
                cells += [empty, empty]
        if lms == "canvas":
            rows.append([s.name, s.lms_id, s.id, s.login, "", *cells])
        else:
            login = [s.login] if login_header(roster) else []
            rows.append([s.name, s.id, *login, *cells])
    if lms == "canvas":
        columns = [f"Lesson {n:02d} {what}" for n in lessons for what in ("score", "percent")]
        head: list[list[object]] = [[*IDENTITY, *columns]]
        head.append(
            [POINTS_POSSIBLE, "", "", "", ""] + [x for n in lessons for x in (totals[n], 100)]
        )
    else:
        columns = [
            c for n in lessons for c in (f"Lesson {n:02d} score (out of {totals[n]})",
                                         f"Lesson {n:02d} percent")
        ]  # fmt: skip
        named = [x for x in [login_header(roster)] if x]
        head = [["Full name", "ID number", *named, *columns]]
    with path.open("w", newline="", encoding="utf-8", errors="backslashreplace") as f:
        writer = csv.writer(f)
        writer.writerows([cell(c) for c in line] for line in head + rows)
    return len(roster)
