"""Submissions for the grader's tests, made from lesson 03's real notebooks.

`solved()` is the solution (every answer right), `BLANK` the exercise version (nothing
answered); `with_code`, `wrong_answers` and `cell` edit them the way a learner (or a
cheat) would; `grade_folder` grades {student: notebook} as a class, two at a time.

Where no sandbox can be made (no bubblewrap: a fresh machine) the grader's verdicts are
still tested, without one: `SANDBOX` is False there, and `NO_SANDBOX` the command line's
flag for it. Honest, blank, wrong and tampered notebooks only: a test whose notebook attacks
the grader, or that is about the sandbox, is marked `needs_bwrap` (tests/conftest.py) and
never runs unsandboxed.
"""

from __future__ import annotations

import copy
from pathlib import Path

import nbformat

from course_utils.grading import isolation
from course_utils.grading.batch import grade_all

SANDBOX = isolation.problem() is None
NO_SANDBOX = [] if SANDBOX else ["--no-sandbox"]
ROOT = Path(__file__).resolve().parents[1]
NAME = "03_bubble_tradeoff.ipynb"
SOLVED = nbformat.read(ROOT / "solutions" / NAME, as_version=4)
BLANK = nbformat.read(ROOT / "exercises" / NAME, as_version=4)
ALL = [f"3.{k}" for k in range(1, 7)]
# Code that forks a child which tries to leave its session: `setsid_errno` is 0 if it could,
# else the errno it got (EPERM, 1, under the sandbox's filter). Needs `os` imported.
SETSID_PROBE = """
child = os.fork()
if child == 0:
    try:
        os.setsid()
        os._exit(0)
    except OSError as exc:
        os._exit(exc.errno)
setsid_errno = os.waitstatus_to_exitcode(os.waitpid(child, 0)[1])
"""


def solved() -> nbformat.NotebookNode:
    return copy.deepcopy(SOLVED)


def blank() -> nbformat.NotebookNode:
    return copy.deepcopy(BLANK)


def cell(nb, cell_id: str):
    return next(c for c in nb.cells if c.get("id") == cell_id)


def with_code(nb, cell_id: str, code: str, before: bool = False):
    """Add learner code to a cell (after its own code, or before it)."""
    c = cell(nb, cell_id)
    c.source = f"{code}\n{c.source}" if before else f"{c.source}\n{code}"
    return nb


def wrong_answers(nb):
    """Every answer of the solution replaced by a wrong one (a Build function included)."""
    cell(nb, "answer-03-1").source = "bubble_fraction = 0.5"
    cell(nb, "answer-03-2").source = "def gpipe_bubble(p, m):\n    return 0.5"
    cell(nb, "answer-03-3").source = "microbatches = 2"
    cell(nb, "answer-03-4").source = "budget = 1\ndef rounds_program(ctx, budget):\n    pass"
    cell(nb, "answer-03-5").source = 'left_cause = "d"\nright_cause = "d"'
    cell(nb, "answer-03-6").source = "efficiency = 0.1\nbusiest_device = 0"
    return nb


def personal(nb, student: str) -> nbformat.NotebookNode:
    """`nb` written out for `student` (their name in the setup cell: their numbers)."""
    from course_utils.grading.make_exercises import for_student

    return nbformat.reads(for_student(nbformat.writes(nb), student), as_version=4)


def data(nb) -> bytes:
    return nbformat.writes(nb).encode()


def passed(result) -> list[str]:
    return [e.id for e in result.exercises if e.passed]


def grade_folder(tmp_path: Path, submissions: dict[str, nbformat.NotebookNode], **kwargs):
    """Grade {student: notebook} as a class (each in its own sub-folder), 2 at a time."""
    for student, nb in submissions.items():
        (tmp_path / student).mkdir(parents=True, exist_ok=True)
        (tmp_path / student / NAME).write_bytes(data(nb))
    results = grade_all([tmp_path], jobs=2, **{"sandbox": SANDBOX, **kwargs})
    return {r.student: r for r in results}
