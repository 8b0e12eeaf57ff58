"""Which of a student's notebooks counts: duplicates, late files, folders that disagree, `--keep`.

    flag_choices(results, "latest", order)   # every row's flags say what it is and if it counts
    book = [r for r in results if counted(r)]  # what the gradebook and the statistics take
    for line in summary(results, "latest"): print(line)

A class download can hold several notebooks of one lesson for one student (two files in one
Moodle submission, a Canvas resubmission beside the first), files an LMS marked late (Canvas
writes `LATE` into the name; Moodle's names carry no such mark) and folders whose number is one
student's while their name is another's. Each gets a flag in its row (the CSV's `status`, the
JSON's `flags`, the feedback page) and a line in the summary, and one rule chooses the
notebook the gradebook takes for each student and lesson (`--keep`):

- `latest` (the default): the last one handed in, as the LMS would show it (Canvas: the
  larger file id; otherwise the later modification time, then the later name);
- `best`: the highest score, the instructor's review included (ties: the latest);
- `on-time`: the latest one not marked late; a student with only late work gets nothing
  (an empty cell, like a missing notebook).

Rows that never count: `missing`, `not on the roster` (the LMS would not know them), and
`number and name disagree` (whose it is is for you to say: rename the folder or fix the
roster's `lms_id`, then run again; until then neither student gets that grade).
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the command line imports this before anything slow
    from course_utils.grading.grader import GradeResult

KEEP = ("latest", "best", "on-time")
DEFAULT_KEEP = "latest"
LATE = "late"
DUPLICATE = "duplicate"
NOT_KEPT = "not kept"
DISAGREE = "number and name disagree"
NOT_ON_ROSTER = "not on the roster"
MISSING = "missing"
NEVER_COUNTED = (MISSING, NOT_ON_ROSTER, DISAGREE)
# Flags that say where a file lies in the download and which file counts: made again on
# every run (a rerun reuses a graded row, never these), unlike the grader's own flags.
PLACE_FLAGS = (NOT_ON_ROSTER, LATE, DISAGREE, DUPLICATE, NOT_KEPT)
PLACE_NOTE = "in the download: "  # notes about the file's place start so (made each run too)


def counted(result: GradeResult) -> bool:
    """Whether the row is the one the gradebook and the class statistics take."""
    return not any(f in result.flags for f in (*NEVER_COUNTED, NOT_KEPT))


def clear_place(result: GradeResult) -> None:
    """Forget what an earlier run said about the file's place (it is said again)."""
    result.flags = [f for f in result.flags if f not in PLACE_FLAGS]
    result.notes = [n for n in result.notes if not n.startswith(PLACE_NOTE)]


def flag_choices(results: list[GradeResult], keep: str, order: dict[str, tuple]) -> None:
    """Flag each student's duplicates and the rows `keep` leaves out ("not kept").
    `order[notebook]` sorts a student's files from first handed in to last."""
    groups: dict[tuple[str, int | None], list[GradeResult]] = defaultdict(list)
    for r in results:
        if r.notebook and not any(f in r.flags for f in NEVER_COUNTED):
            groups[(r.student, r.lesson)].append(r)
    for rows in groups.values():
        rows.sort(key=lambda r: order.get(r.notebook, ()))
        if len(rows) > 1:
            for r in rows:
                r.flags.append(DUPLICATE)
        chosen: GradeResult | None
        if keep == "best":
            chosen = max(rows, key=lambda r: (r.final(), order.get(r.notebook, ())))
        elif keep == "on-time":
            on_time = [r for r in rows if LATE not in r.flags]
            chosen = on_time[-1] if on_time else None
        else:
            chosen = rows[-1]
        for r in rows:
            if r is not chosen:
                r.flags.append(NOT_KEPT)


def summary(results: list[GradeResult], keep: str) -> list[str]:
    """One line per kind of row that needs a look (duplicates, late work, folders whose
    number and name disagree), each naming the files; empty when there is none."""
    lines = []
    duplicates = [r for r in results if DUPLICATE in r.flags]
    if duplicates:
        students = len({(r.student, r.lesson) for r in duplicates})
        lines.append(
            f"{_many(len(duplicates), 'notebook')} are more than one of a student's for a "
            f"lesson ({_many(students, 'student')}): the gradebook takes the {_rule(keep)} "
            f"(--keep {keep})"
        )
        lines += [f"  {_kept(r)} {r.notebook}" for r in duplicates]
    late = [r for r in results if LATE in r.flags]
    if late:
        counted_late = sum(1 for r in late if counted(r))
        lines.append(
            f"{_many(len(late), 'notebook')} marked late by the LMS; {counted_late} of them count "
            f"(--keep {keep}{': late work does not count' if keep == 'on-time' else ''})"
        )
        lines += [f"  {_kept(r)} {r.notebook}" for r in late]
    disagree = [r for r in results if DISAGREE in r.flags]
    if disagree:
        lines.append(
            f"{_many(len(disagree), 'folder')} with one student's number and another's name: "
            "graded, but neither student's gradebook cell takes them (rename the folder or fix "
            "the roster's lms_id, then run again)"
        )
        for r in disagree:
            said = [n.removeprefix(PLACE_NOTE) for n in r.notes if n.startswith(PLACE_NOTE)]
            lines.append(f"  {r.notebook}: {'; '.join(said)}")
    return lines


def _many(n: int, thing: str) -> str:
    return f"{n} {thing}{'' if n == 1 else 's'}"


def _rule(keep: str) -> str:
    return {"best": "best one", "on-time": "latest one on time"}.get(keep, "latest one")


def _kept(result: GradeResult) -> str:
    return "counts:" if counted(result) else "ignored:"
