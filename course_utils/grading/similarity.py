"""Copy detection: answer cells that are identical, or identical after renaming, across students.

Per-student numbers stop a copied *number*, not a copied *method*. For every exercise this
compares the students' answer code in two ways:

- **identical**: the same text, ignoring blank lines and trailing spaces;
- **identical after renaming**: the same program once comments and docstrings are dropped
  and every name the answer defines or uses is renamed in order of first appearance
  (`ast`): `def f(p, m): return (p-1)/(m+p-1)` and `def bubble(stages, mb): return
  (stages-1)/(mb+stages-1)` are the same.

Reported as pairs of students. Left out: unanswered exercises (the stub), answers too short
to say anything (fewer than MIN_NODES syntax nodes: `x = 63`), and an answer shared by more
than a third of the students who answered (and more than three): that is what the exercise
leads everyone to, not a copy. A pair is a reason to look, not a verdict.

No answer can stop the report: one the renaming cannot take (600 `+` terms nest deeper than
Python's recursion limit) is compared as written, and a notebook that cannot be read at all
is left out; either is named in the report's lines. Names and paths are shown `visible`
and written through `neutral.cell`.
"""

from __future__ import annotations

import ast
import builtins
import csv
import itertools
from dataclasses import dataclass
from pathlib import Path

import nbformat

from course_utils.grading.neutral import cell as csv_cell
from course_utils.grading.neutral import visible

MIN_NODES = 15
BUILTINS = set(dir(builtins))


@dataclass
class Pair:
    exercise: str  # "3.2"
    first: str  # student
    second: str
    how: str  # "identical" or "identical after renaming"
    group: int  # how many students share this answer
    notebooks: tuple[str, str]


def _code(source: str) -> str:
    """A cell's Python without IPython's magics and shell lines."""
    return "\n".join(ln for ln in source.splitlines() if not ln.lstrip().startswith(("%", "!")))


def _text(cells: list[str]) -> str:
    lines = [ln.rstrip() for c in cells for ln in c.splitlines()]
    return "\n".join(ln for ln in lines if ln)


class _Renamer(ast.NodeTransformer):
    def __init__(self) -> None:
        self.names: dict[str, str] = {}

    def new(self, name: str) -> str:
        if name in BUILTINS:
            return name
        return self.names.setdefault(name, f"v{len(self.names)}")

    def visit_Name(self, node: ast.Name) -> ast.AST:
        node.id = self.new(node.id)
        return node

    def visit_arg(self, node: ast.arg) -> ast.AST:
        node.arg, node.annotation = self.new(node.arg), None
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        node.name, node.returns = self.new(node.name), None
        self._drop_docstring(node)
        self.generic_visit(node)
        return node

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.AST:
        node.name = self.new(node.name)
        self._drop_docstring(node)
        self.generic_visit(node)
        return node

    def visit_alias(self, node: ast.alias) -> ast.AST:
        if node.asname:
            node.asname = self.new(node.asname)
        return node

    @staticmethod
    def _drop_docstring(node) -> None:
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            if isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]


class TooDeep(ValueError):
    """An answer nested too deeply to compare after renaming (it is compared as written)."""


def canonical(cells: list[str]) -> tuple[str, int] | None:
    """The answer's program with names renamed, and its size in syntax nodes; None if it
    does not parse (then only the text is compared). Raises TooDeep when the program parses
    but nests deeper than the renaming can follow."""
    try:
        tree = ast.parse("\n".join(_code(c) for c in cells))
    except (SyntaxError, ValueError):  # ValueError: a null byte
        return None
    except (RecursionError, MemoryError) as exc:
        raise TooDeep(type(exc).__name__) from None
    try:
        tree = _Renamer().visit(tree)
        size = sum(1 for _ in ast.walk(tree))
        return ast.dump(tree, annotate_fields=False), size
    except (RecursionError, MemoryError) as exc:
        raise TooDeep(type(exc).__name__) from None


def answer_cells(nb: nbformat.NotebookNode, solution: nbformat.NotebookNode, lesson: int):
    """{K: [source of each answer cell of exercise K]}: the code cells of the exercise's part
    of the notebook that are not one of the solution's locked or check cells."""
    from course_utils.grading.grader import source_fingerprint
    from course_utils.grading.make_exercises import ANY_STUDENT
    from course_utils.grading.notebook_tools import is_check_cell, tags
    from course_utils.grading.sandbox import exercise_of_cells

    locked = {
        source_fingerprint(ANY_STUDENT.sub('for_student("default")', c.source))
        for c in solution.cells
        if is_check_cell(c) or "locked" in tags(c)
    }
    found: dict[int, list[str]] = {}
    for cell, k in zip(nb.cells, exercise_of_cells(nb, lesson), strict=True):
        if k is None or cell.cell_type != "code" or not cell.source.strip():
            continue
        mine = source_fingerprint(ANY_STUDENT.sub('for_student("default")', cell.source))
        if mine not in locked and not is_check_cell(cell):
            found.setdefault(k, []).append(cell.source)
    return found


def similar_pairs(
    notebooks: list[tuple[str, str, int]], solutions: Path
) -> tuple[list[Pair], list[str]]:
    """Pairs for `notebooks` = [(student, path, lesson)], and a line per answer left out:
    because most of the class shares it, because it could only be compared as written, or
    because its notebook could not be read."""
    from course_utils.grading.grader import solution_for
    from course_utils.grading.notebook_tools import strip_solutions

    pairs: list[Pair] = []
    common: list[str] = []
    for lesson in sorted({n[2] for n in notebooks}):
        solution = nbformat.read(solution_for(lesson, solutions), as_version=4)
        stub = nbformat.from_dict(solution)
        for cell in stub.cells:
            cell.source = strip_solutions(cell.source, cell.cell_type)
        blanks = {k: _text(v) for k, v in answer_cells(stub, solution, lesson).items()}
        answers: dict[int, list[tuple[str, str, str, tuple[str, int] | None]]] = {}
        for student, path, nb_lesson in notebooks:
            if nb_lesson != lesson:
                continue
            try:
                nb = nbformat.read(path, as_version=4)
                found = answer_cells(nb, solution, lesson)
            except Exception as exc:  # changed since it was graded, or cells of no kind known
                common.append(
                    f"{visible(student)}: {visible(path)} left out "
                    f"(it could not be read: {type(exc).__name__})"
                )
                continue
            for k, cells in found.items():
                text = _text(cells)
                if not text or text == blanks.get(k):
                    continue
                try:
                    shape = canonical(cells)
                except TooDeep:
                    shape = None
                    common.append(
                        f"{lesson}.{k}: {visible(student)}'s answer nests too deeply to compare "
                        "after renaming: compared as written"
                    )
                answers.setdefault(k, []).append((student, path, text, shape))
        for k, given in sorted(answers.items()):
            pairs += _pairs(f"{lesson}.{k}", given, common)
    return pairs, common


def _pairs(exercise: str, answers, common: list[str]) -> list[Pair]:
    groups: dict[object, list] = {}
    for item in answers:
        student, path, text, shape = item
        if shape is not None and shape[1] < MIN_NODES:
            continue
        groups.setdefault(shape[0] if shape else ("text", text), []).append(item)
    limit = max(3, len(answers) / 3)
    found = []
    for members in groups.values():
        students = {m[0] for m in members}
        if len(students) < 2:
            continue
        if len(students) > limit:
            common.append(
                f"{exercise}: {len(students)} of {len(answers)} answers are the same program "
                "(the common answer: not reported as pairs)"
            )
            continue
        for a, b in itertools.combinations(members, 2):
            if a[0] != b[0]:
                how = "identical" if a[2] == b[2] else "identical after renaming"
                found.append(Pair(exercise, a[0], b[0], how, len(students), (a[1], b[1])))
    return found


def write_pairs(pairs: list[Pair], path: Path) -> None:
    with path.open("w", newline="", encoding="utf-8", errors="backslashreplace") as f:
        writer = csv.writer(f)
        writer.writerow(["exercise", "student", "other student", "how", "students sharing it",
                         "notebook", "other notebook"])  # fmt: skip
        for p in pairs:
            row = [p.exercise, p.first, p.second, p.how, p.group, *p.notebooks]
            writer.writerow([csv_cell(c) for c in row])


def pairs_table(pairs: list[Pair]) -> str:
    if not pairs:
        return "no answer cells are identical across students"
    lines = [f"{'exercise':<9} {'students':<40} how"]
    for p in pairs:
        lines.append(f"{p.exercise:<9} {visible(p.first + ' & ' + p.second):<40} {p.how}")
    return "\n".join(lines)
