"""The check modules as a learner's kernel sees them while it is graded: numbers, no answers.

Inside the sandbox `course_utils/checks/` is replaced by a folder written here. It holds the
framework (`checks/__init__.py`: `Variant`, `for_student`, the messages' helpers) and `wire.py`
as they are, since neither knows an answer, and for each lesson a *cut* of `lNN.py` with only
what a notebook legitimately uses while it runs:

- `for_student`, and `given_K` answering with the numbers the grader drew for this student
  (as data: the code that draws them may look at the answer, e.g. to pick numbers whose
  answer is interesting, so it stays in the grader);
- the functions the lesson's solution notebook calls on the module (`l08.their_timeline`,
  `l12.moe_layout`, ...: the material an exercise is about), with the module-level names they
  need, found by reading the code (`ast`).

The `exercise_K` checks, the reference implementations and the expected answers are not
there: an answer that hands back `l03._bubble` or `l07._tp_counts` raises, in the
learner's own kernel, an AttributeError saying the checks belong to the grader.
`check.exercise_K(...)` in a learner's cell does nothing there (it prints that the grader
judges the answer), so a cell that calls it still runs to its end. (What a Diagnose
exercise's material needs to build its fault, e.g. which device `l11.their_schedule` slows
down, is reachable through that function: the material is the question.)
"""

from __future__ import annotations

import ast
import json
import re
import shutil
from pathlib import Path

import course_utils.checks as real_checks

CHECKS = Path(real_checks.__file__).parent
USES = re.compile(r"\bl(\d\d)\.([A-Za-z_]\w*)")
GIVEN = re.compile(r"given_\d+")
KEPT_BY_GRADER = "belongs to the course's checks"  # in the error a learner's kernel sees

AFTER = """

def __getattr__(name: str):
    # Only while graded: the checks live in the grader, where this notebook cannot reach them.
    if name.startswith("exercise_"):
        def judged_by_the_grader(*args, **kwargs):
            print(f"({__name__.rsplit('.', 1)[-1]}.{name}: your answer is judged by the grader)")

        return judged_by_the_grader
    raise AttributeError(
        f"{__name__}.{name} belongs to the course's checks, which the grader keeps to itself "
        "while your notebook is graded: compute the answer in your own code"
    )
"""


def material_names(solutions: Path) -> dict[int, set[str]]:
    """{lesson: names its solution notebook uses from `course_utils.checks.lNN`}."""
    import nbformat

    found: dict[int, set[str]] = {}
    for path in sorted(solutions.glob("[0-9][0-9]_*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                for lesson, name in USES.findall(cell.source):
                    found.setdefault(int(lesson), set()).add(name)
    return found


def _defined(node: ast.stmt) -> set[str]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {node.name}
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, ast.AnnAssign):
        targets = [node.target]
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}


def _used(node: ast.stmt) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def cut(source: str, keep: set[str]) -> str:
    """The module `source` with its imports, `for_student`, the definitions named in `keep`
    and every module-level definition those use, in their original order; never its
    `given_K` (the stand-in answers those from data)."""
    tree = ast.parse(source)
    definitions = [(node, _defined(node)) for node in tree.body]
    definitions = [(n, names) for n, names in definitions if not any(map(GIVEN.fullmatch, names))]
    wanted = keep | {"for_student"}
    while True:  # what the wanted definitions use, until nothing new is needed
        more = set(wanted)
        for node, names in definitions:
            if names & wanted:
                more |= _used(node)
        if more == wanted:
            break
        wanted = more
    body = [
        node
        for node, names in definitions
        if isinstance(node, ast.Import | ast.ImportFrom) or names & wanted
    ]
    kept = ast.Module(body=body, type_ignores=[])
    return ast.unparse(kept) + "\n"


GIVEN_FROM_DATA = """

def _given(k: int):
    def given(v=None) -> dict:
        from course_utils.checks.wire import decode

        return decode(json.loads(_NUMBERS)[str(k)])

    given.__name__ = f"given_{k}"
    return given


_NUMBERS = @NUMBERS@
for _k in json.loads(_NUMBERS):
    globals()[f"given_{_k}"] = _given(int(_k))
"""


def write(folder: Path, solutions: Path, lesson: int, given: dict[int, object]) -> Path:
    """Write the stand-in `checks` package into `folder` (created) and return it. `given`
    holds the graded lesson's numbers for this student ({K: encoded given_K(variant)})."""
    folder.mkdir(parents=True, exist_ok=True)
    # programs, rank_cases: a graded kernel runs rank programs on their cases (the references
    # the grader judges them against, `rank_references`, stay out)
    for name in ("__init__.py", "wire.py", "programs.py", "rank_cases.py"):
        shutil.copyfile(CHECKS / name, folder / name)
    material = material_names(solutions)
    for path in sorted(CHECKS.glob("l[0-9][0-9].py")):
        number = int(path.stem[1:])
        header = (
            f'"""Lesson {number:02d}: the numbers and material a graded notebook may use '
            '(written by course_utils.grading.stand_in)."""\n'
        )
        text = cut(path.read_text(encoding="utf-8"), material.get(number, set()))
        numbers = json.dumps({str(k): v for k, v in given.items()} if number == lesson else {})
        data = "import json\n" + GIVEN_FROM_DATA.replace("@NUMBERS@", repr(numbers))
        (folder / path.name).write_text(header + text + data + AFTER, encoding="utf-8")
    return folder
