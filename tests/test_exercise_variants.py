"""No student's numbers turn an exercise into a look-up in its lesson (issue 50).

Exercise 2.2 once drew "the action that ends: 2F1", which lesson 02's recap answers word for
word. Here every exercise that asks about a pipeline the lessons work out is compared, for the
default student and 300 named ones, with the worked examples of its lesson, read from
notebooks/NN_*.ipynb as follows:

- schedules: every `make_schedule(NAME, P, M[, chunks=V])` in a code cell whose P, M (and V)
  are whole numbers written there, or names bound to them in that cell or an earlier one
  (`P, M = 4, 8`); NAME is "*" (any schedule) where the code chooses it in a loop;
  lessons 02 to 05 simulate them with F = 1 and B = 2 (their `CostModel`), so an exercise
  with those costs and that schedule on the same (P, M, V) is a look-up;
- snapshots: every "when `sFk` ends" (or "`sFk` ends") in a markdown cell: the moment a
  Predict exercise like 2.2 asks about.

An exercise's key says which of these it would copy (None where its numbers differ from the
lesson's costs, so no worked example can answer it).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from functools import cache
from pathlib import Path

import pytest

from course_utils.checks import DEFAULT, Variant, l02, l03, l04, l05

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
STUDENTS = [DEFAULT] + [Variant(f"student {i}") for i in range(300)]


def cells(lesson: int) -> list[tuple[str, str]]:
    (path,) = NOTEBOOKS.glob(f"{lesson:02d}_*.ipynb")
    nb = json.loads(path.read_text(encoding="utf-8"))
    return [(c["cell_type"], "".join(c["source"])) for c in nb["cells"]]


def _ints(tree: ast.AST) -> dict[str, int]:
    """Names bound to whole numbers in a cell: `P = 4`, `P, M = 4, 8`."""
    bound: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
            pairs = (
                zip(target.elts, value.elts, strict=False)
                if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple)
                else [(target, value)]
            )
            for name, v in pairs:
                if isinstance(name, ast.Name) and isinstance(v, ast.Constant):
                    if isinstance(v.value, int):
                        bound[name.id] = v.value
    return bound


@cache
def schedules(lesson: int) -> frozenset[tuple]:
    """(name, p, m, chunks or None) of every schedule the lesson's code builds by number; the
    name is "*" where the code chooses it (`make_schedule(name, P, M)` in a loop)."""
    found = set()
    bound: dict[str, int] = {}  # a kernel keeps its names from cell to cell
    for kind, source in cells(lesson):
        if kind != "code":
            continue
        shell = ("%", "!")  # IPython's magics and shell lines, `x = !cmd` too
        code = "\n".join(
            ln
            for ln in source.splitlines()
            if not ln.lstrip().startswith(shell) and "= !" not in ln
        )
        tree = ast.parse(code)
        bound.update(_ints(tree))

        def number(node: ast.AST) -> int | None:
            if isinstance(node, ast.Constant) and isinstance(node.value, int):
                return node.value
            return bound.get(node.id) if isinstance(node, ast.Name) else None

        for node in ast.walk(tree):
            func = getattr(node, "func", None)
            if not (isinstance(node, ast.Call) and getattr(func, "id", "") == "make_schedule"):
                continue
            if len(node.args) < 3:
                continue
            name = node.args[0].value if isinstance(node.args[0], ast.Constant) else "*"
            p, m = number(node.args[1]), number(node.args[2])
            chunks = next((number(k.value) for k in node.keywords if k.arg == "chunks"), None)
            if p is not None and m is not None:
                found.add((name, p, m, chunks))
    return frozenset(found)


@cache
def snapshots(lesson: int) -> frozenset[tuple[int, int]]:
    """(stage, micro-batch) of every forward whose end the lesson's text works through."""
    text = "\n".join(source for kind, source in cells(lesson) if kind == "markdown")
    ends = re.finditer(r"`(\d+)F(\d+)`\s+ends|when\s+`(\d+)F(\d+)`", text)
    return frozenset((int(m[1] or m[3]), int(m[2] or m[4])) for m in ends)


def lesson_costs(g) -> bool:
    """The lessons' F = 1, B = 2, under whichever names the exercise gives them."""
    f = g.get("F", g.get("t_f", 1))
    return f == 1 and g.get("B", g.get("t_b", 2)) == 2 and "t_i" not in g


def pipe(*names: str, chunks: bool = False) -> Callable:
    def key(g) -> list[tuple] | None:
        if not lesson_costs(g):
            return None
        return [(n, g["p"], g["m"], g["v"] if chunks else None) for n in names]

    return key


# (lesson, exercise): (given_K, what of the lesson it would copy)
EXERCISES = {
    (2, 1): (l02.given_1, pipe("gpipe")),
    (2, 4): (l02.given_4, pipe("gpipe")),
    (3, 1): (l03.given_1, pipe("gpipe")),
    (4, 1): (l04.given_1, pipe("gpipe", "1f1b")),
    (4, 3): (l04.given_3, pipe("gpipe", "1f1b")),
    (5, 2): (l05.given_2, pipe("interleaved", chunks=True)),
    (5, 3): (l05.given_3, pipe("interleaved", "breadth-first", chunks=True)),
    (5, 7): (l05.given_7, pipe("interleaved", chunks=True)),
}


@pytest.mark.parametrize("lesson, k", sorted(EXERCISES), ids=lambda x: str(x))
def test_no_variant_draws_a_schedule_the_lesson_works_out(lesson, k):
    given, key = EXERCISES[(lesson, k)]
    worked = schedules(lesson)
    assert worked, f"lesson {lesson:02d}: no schedule found (the extraction is broken)"
    copies = set()
    for student in STUDENTS:
        for example in key(given(student)) or []:
            if example in worked or ("*", *example[1:]) in worked:
                copies.add((student.student, example))
    assert not copies, f"exercise {lesson}.{k} draws the lesson's worked examples: {copies}"


def test_no_variant_of_2_2_asks_for_the_moment_lesson_02_works_through():
    worked = snapshots(2)
    assert (2, 1) in worked  # the recap's "when `2F1` ends": the extraction finds it
    drawn = {(g["stage"], g["microbatch"]) for g in map(l02.given_2, STUDENTS)}
    assert len(drawn) > 1 and not drawn & worked, drawn & worked


def test_the_extraction_finds_the_lessons_examples():
    """What the scan reads, on examples we know are there."""
    assert ("gpipe", 2, 2, None) in schedules(2) and ("gpipe", 4, 8, None) in schedules(2)
    assert ("interleaved", 4, 8, 2) in schedules(5)
    assert ("*", 4, 8, None) in schedules(4)  # `P, M = 4, 8`, then make_schedule(name, P, M)
