"""For instructors: exercise notebooks generated from the solutions, and grading.

- `notebook_tools`  reading notebooks, answer and check cells, solution blocks
- `make_exercises`  exercises/ from solutions/, handouts per student (`--students`, `--roster`),
                    one lesson's laid out for an LMS (`--lesson`)
- `grader`          grade one notebook: run it apart, judge its answers here (`judge`)
- `sandbox`         run a notebook's cells in a kernel and capture its answers as data
- `isolation`       the bubblewrap sandbox each kernel runs in (`kernel_start` sets its limits)
- `stand_in`        the checks package as a sandboxed kernel sees it: numbers, no answers
- `batch`, `worker` a class, each notebook in a worker process (`python -m course_utils grade`)
- `roster`          students' names, the roster, whose file a Moodle/Canvas download is
- `keep`            duplicates, late work, disagreeing folders: which notebook counts (`--keep`)
- `resume`          the resume key: whether an earlier grade still holds
- `journal`         the per-notebook CSV, row by row, so a killed batch can be resumed
- `gradebook`, `feedback`, `stats`, `similarity`  what an instructor takes away from a batch
- `pytest_plugin`   `pytest --course-grade submissions/`: one test per exercise per student

The learner-facing checks themselves live in `course_utils.checks`. Importing this package
is cheap (the commands check their arguments before importing nbformat, which is slow).
"""

import sys
from pathlib import Path

# nbformat imports jsonschema, which compiles some 35 Lark grammars for the "iri" formats when
# the optional rfc3987-syntax is installed (Jupyter installs it): about 2 s in every process
# that reads a notebook, such as each grading worker (importing nbformat and nbclient took
# 2.2 s with the grammars, 0.3 s without, here). No notebook schema uses those formats, so
# the grading processes go without them (python-jsonschema/jsonschema#1428). A process that
# imported jsonschema before this package keeps them. (None in sys.modules is Python's way
# to make an import raise ImportError, which jsonschema expects of an optional module.)
sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]

REPO = Path(__file__).resolve().parents[2]
SOLUTIONS = REPO / "solutions"
EXERCISES = REPO / "exercises"


def solution_of(lesson: int, solutions: Path) -> Path | None:
    """The solution notebook of `lesson` in the folder `solutions` (`NN_*.ipynb`), if any."""
    found = sorted(solutions.glob(f"{lesson:02d}_*.ipynb"))
    return found[0] if found else None


def course_lessons() -> list[int]:
    """The lessons this course has exercises for: those with a check module (`checks/lNN.py`)."""
    import re

    checks = Path(__file__).resolve().parents[1] / "checks"
    found = (re.fullmatch(r"l(\d\d)\.py", p.name) for p in checks.iterdir())
    return sorted(int(m.group(1)) for m in found if m)


def missing_solution(lesson: int, solutions: Path) -> str | None:
    """Why `solutions` cannot grade `lesson` (None: it can): one line for the instructor."""
    if solution_of(lesson, solutions) is not None:
        return None
    known = course_lessons()
    if lesson not in known:
        have = f"{known[0]:02d}-{known[-1]:02d}" if known else "none"
        return f"lesson {lesson:02d} has no exercises in this course (lessons with them: {have})"
    return (
        f"the solutions folder {str(solutions)!r} has no notebook of lesson {lesson:02d} "
        f"({lesson:02d}_*.ipynb): give the solutions/ folder of a course checkout"
    )
