"""Every course_utils function, class or option an exercise names is taught in a lesson at or
before it (issue 50: 2.5 named `partition(..., balance="cost")`, which no lesson used).

What an exercise names: in exercises/NN_*.ipynb, what the learner reads and writes (its
markdown and its answer cells; the locked cells that set up, draw and check are plumbing):
the names imported from course_utils that appear there, the course_utils functions and
classes called there in backticks (`simulate(`), and the string options written there as
`option="value"`; in course_utils/checks/lNN.py, the same calls and options in every string
(the hints). A name is taught when a
lesson notebooks/MM_*.ipynb with MM <= NN has it (the same word; an option with the same
value, either quotes).
"""

from __future__ import annotations

import ast
import json
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted(int(p.name[:2]) for p in (ROOT / "exercises").glob("[0-9][0-9]_*.ipynb"))
OPTION = re.compile(r"""\b([a-z_]+)=(["'])([A-Za-z][\w-]*)\2""")
CALL = re.compile(r"`(?!dist\.|torch\.)(?:[\w.]+\.)?([A-Za-z_]\w*)\(")  # not torch's own


def text_of(path: Path, kinds=("markdown", "code")) -> str:
    nb = json.loads(path.read_text(encoding="utf-8"))
    return "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] in kinds)


@cache
def taught(lesson: int) -> str:
    """The text of every lesson up to `lesson`, options written with double quotes."""
    paths = sorted(p for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    text = "\n".join(text_of(p) for p in paths if int(p.name[:2]) <= lesson)
    return OPTION.sub(lambda m: f'{m[1]}="{m[3]}"', text)


@cache
def course_names() -> frozenset[str]:
    """The functions and classes course_utils defines (outside its checks and grading)."""
    names = set()
    for path in (ROOT / "course_utils").rglob("*.py"):
        if {"checks", "grading"} & set(path.parts):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.ClassDef) and not node.name.startswith("_"):
                names.add(node.name)
    return frozenset(names)


def hint_strings(lesson: int) -> str:
    """Every string of lesson `lesson`'s check module (its hints and messages)."""
    path = ROOT / "course_utils" / "checks" / f"l{lesson:02d}.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return "\n".join(
        n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    )


def named(lesson: int) -> dict[str, str]:
    """{what the exercise names: where} for exercise notebook `lesson` and its hints."""
    (path,) = (ROOT / "exercises").glob(f"{lesson:02d}_*.ipynb")
    nb = json.loads(path.read_text(encoding="utf-8"))
    code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    # What the learner reads and writes: the text and the answer cells (the locked cells that
    # set up, draw and check are the course's plumbing, run as they are).
    asked = "\n".join(
        "".join(c["source"])
        for c in nb["cells"]
        if c["cell_type"] == "markdown" or "answer" in c["metadata"].get("tags", [])
    )
    own = {m[1] for c in code for m in re.finditer(r"^\s*def (\w+)", c, re.M)}  # the learner's
    found: dict[str, str] = {}
    imported = set()
    for cell in code:
        for m in re.finditer(r"from course_utils[\w.]* import ([^\n(]+|\([^)]*\))", cell):
            imported |= {n.strip(" ()\n") for n in m[1].split(",")} - {""}
    for name in imported - own:
        if not re.fullmatch(r"l\d\d", name) and re.search(rf"`{name}\b|\b{name}\(", asked):
            found[name] = "imported, and named in the exercise's text or an answer cell"
    sources = {
        "the exercise's text or an answer cell": asked,
        f"the hints of course_utils/checks/l{lesson:02d}.py": hint_strings(lesson),
    }
    for where, text in sources.items():
        for m in OPTION.finditer(text):
            found.setdefault(f'{m[1]}="{m[3]}"', where)
        for m in CALL.finditer(text):
            if m[1] in course_names() and m[1] not in own:
                found.setdefault(m[1], where)
    return found


# Introduced by the exercise itself, whose text says what it does and returns (a Build's
# helper): {(lesson, name): words of the exercise's text that explain it}.
EXPLAINED = {
    (2, "validate"): "runs `validate` on it, which returns a list of problems",
    (6, "chunk_bounds"): "with `chunk_bounds(L, N)`, a list of `(start, end)`",
    (13, "Worker"): "`Worker(file, function)`, starts two fresh Python processes",
}


@pytest.mark.parametrize("lesson", LESSONS)
def test_every_api_an_exercise_names_is_taught_by_then(lesson):
    lessons = taught(lesson)
    missing = {
        name: where
        for name, where in named(lesson).items()
        if (lesson, name) not in EXPLAINED
        and not re.search(
            rf"(?<![\w.]){re.escape(name)}" if "=" in name else rf"\b{name}\b", lessons
        )
    }
    assert not missing, (
        f"exercises {lesson:02d} name what no lesson up to {lesson:02d} has: {missing}"
    )


@pytest.mark.parametrize("lesson, name", sorted(EXPLAINED))
def test_what_an_exercise_introduces_itself_is_explained_there(lesson, name):
    (path,) = (ROOT / "exercises").glob(f"{lesson:02d}_*.ipynb")
    assert EXPLAINED[(lesson, name)] in " ".join(text_of(path, ("markdown",)).split())


def test_the_scan_sees_an_untaught_option():
    """The slip of issue 50 is caught: 2.5's old option b, against lessons 01-03."""
    old = '(balance by measured cost, e.g. `partition(model, 2, balance="cost")`)'
    found = {f'{m[1]}="{m[3]}"' for m in OPTION.finditer(old)} | {m[1] for m in CALL.finditer(old)}
    assert found == {'balance="cost"', "partition"} and "partition" in course_names()
    assert 'balance="params"' in taught(2) and 'balance="cost"' not in taught(3)
