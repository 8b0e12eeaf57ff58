"""Every hint a check module can give is given by some wrong answer in the tests.

A hint is text a lesson's check module (`course_utils/checks/lNN.py`) writes into a failure
message. This test finds them itself, in each module's source: every string literal inside
the arguments of `fail(...)`, `CheckFailed(...)`, `expect_choice(...)`, `judge(...)` (its
hints: each hint with the wrong answer it names, or its one hint) and `each_call(...)` (the
hint for inputs too big to build), wherever they stand (an exercise's body or its `@exercise`
declaration), in a diagnosis's table (`@exercise(problem={...})`: a hint per wrong choice),
and inside a question's `slips=`,
following what can become text: the names
those arguments use (a local or module variable, a `for` loop's iterable, a list built with
`append`) and the module's private helpers whose results they are (`_moe_slips(...)`). A
literal's longest piece between format fields (at least 12 characters, with a space) is its
fingerprint.

The same holds for `checks/builds.py`, which judges the per-rank programs of lessons 08 to
10 for their modules, against those lessons' wrong answers.

Then it runs every wrong answer of the lesson's test file (`WRONG` in
tests/test_checks_lNN.py, which the contract test also runs), collects the failure messages,
and requires each fingerprint to appear in at least one of them. A hint that no answer
reaches is one no learner will ever see: either its condition is shadowed by an earlier one
(8.1's stage-1 mixed-precision hint was, behind stage 2's fp32 count), or a wrong answer
that shows it is missing from the tests. Messages built by the shared helpers of
`course_utils.checks` (not answered, not a number, unit slips) are tested in
test_checks_framework.py and are not collected here.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import io
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from checkskit import run
from test_checks_contract import LESSON_PARAMS

from course_utils.checks import CheckFailed

HINT_CALLS = {"fail", "CheckFailed", "expect_choice", "judge", "each_call"}
MIN_FINGERPRINT = 12


@dataclass(frozen=True)
class Hint:
    line: int
    fingerprint: str


def _pieces(text: str) -> list[str]:
    """The literal pieces of a message template, between its `{...}` fields."""
    return [p.strip() for p in re.split(r"\{[^{}]*\}", text) if p.strip()]


def _assignments(scope: ast.AST) -> dict[str, list[ast.AST]]:
    """What each name is bound to in `scope`: assignments, `for` loops' iterables, and what
    `name.append(...)` / `name.extend(...)` add to a list."""
    bound: dict[str, list[ast.AST]] = {}
    for node in ast.walk(scope):
        pairs: list[tuple[ast.AST, ast.AST]] = []
        if isinstance(node, ast.Assign):
            pairs = [(t, node.value) for t in node.targets]
        elif isinstance(node, ast.AnnAssign | ast.AugAssign) and node.value is not None:
            pairs = [(node.target, node.value)]
        elif isinstance(node, ast.For):
            pairs = [(node.target, node.iter)]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("append", "extend", "insert")
        ):
            pairs = [(node.func.value, arg) for arg in node.args]
        for target, value in pairs:
            for name in ast.walk(target):
                if isinstance(name, ast.Name):
                    bound.setdefault(name.id, []).append(value)
    return bound


def _body_without_docstring(fn: ast.FunctionDef) -> list[ast.stmt]:
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        return body[1:]
    return body


def hints_of(path: Path) -> list[Hint]:
    """Every hint the check module at `path` can write, found in its source.

    From a hint call's arguments the scan follows what can become text: literals and
    f-strings, conditional expressions, `+` and `%`, the items of lists, tuples and dicts
    (keys too: a dict may map a message to its test), subscripts and method calls on those
    (`{...}[choice]`, `hints.get(...)`, `"...".format(...)`), names bound to such values,
    and the private helpers of the module whose results they are. It does not follow
    computations (`len(...)`, comprehensions over data): those make numbers and lists, not
    sentences. A fingerprint has at least 12 characters and a space: identifiers such as a
    function's name in "shard(...) returned" are not hints.
    """
    tree = ast.parse(path.read_text())
    module_names = _assignments(tree)
    helpers = {
        fn.name: fn
        for fn in tree.body
        if isinstance(fn, ast.FunctionDef) and fn.name.startswith("_")
    }
    found: dict[tuple[int, str], Hint] = {}
    seen: set[tuple[int, int]] = set()

    def record(node: ast.Constant) -> None:
        pieces = [p for p in _pieces(node.value) if len(p) >= MIN_FINGERPRINT and " " in p]
        if pieces:
            hint = Hint(node.lineno, max(pieces, key=len))
            found[(hint.line, hint.fingerprint)] = hint

    def visit(node: ast.AST | None, local: dict[str, list[ast.AST]], depth: int = 0) -> None:
        if node is None or depth > 6 or (id(node), id(local)) in seen:
            return
        seen.add((id(node), id(local)))
        again = depth + 1
        if isinstance(node, ast.Constant):
            if isinstance(node.value, str):
                record(node)
        elif isinstance(node, ast.JoinedStr):
            for part in node.values:
                visit(part.value if isinstance(part, ast.FormattedValue) else part, local, again)
        elif isinstance(node, ast.Name):
            for value in local.get(node.id, []) + module_names.get(node.id, []):
                visit(value, local, again)
        elif isinstance(node, ast.IfExp):
            visit(node.body, local, again)
            visit(node.orelse, local, again)
        elif isinstance(node, ast.BoolOp):
            for value in node.values:
                visit(value, local, again)
        elif isinstance(node, ast.BinOp):
            visit(node.left, local, again)
            visit(node.right, local, again)
        elif isinstance(node, ast.List | ast.Tuple | ast.Set):
            for elt in node.elts:
                visit(elt, local, again)
        elif isinstance(node, ast.Dict):
            for item in [*node.keys, *node.values]:
                visit(item, local, again)
        elif isinstance(node, ast.Subscript | ast.Starred | ast.Attribute):
            visit(node.value, local, again)
        elif isinstance(node, ast.Call):
            if isinstance(node.func, ast.Attribute):  # text.format(...), hints.get(k, "")
                visit(node.func.value, local, again)
                for arg in node.args:
                    visit(arg, local, again)
            elif isinstance(node.func, ast.Name) and node.func.id in helpers:
                helper = helpers[node.func.id]
                inner = _assignments(helper)
                for stmt in ast.walk(ast.Module(_body_without_docstring(helper), [])):
                    if isinstance(stmt, ast.Return):
                        visit(stmt.value, inner, again)

    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef):
            continue
        local = _assignments(fn)
        for call in ast.walk(fn):
            if not isinstance(call, ast.Call):
                continue
            name = getattr(call.func, "id", getattr(call.func, "attr", None))
            if name in HINT_CALLS:  # (`choices=` of `Fields.judge`: the options, not hints)
                for arg in [*call.args, *(k.value for k in call.keywords if k.arg != "choices")]:
                    visit(arg, local)
            for keyword in call.keywords:
                if keyword.arg == "slips":
                    visit(keyword.value, local)
                if name == "exercise" and isinstance(keyword.value, ast.Dict):  # a diagnosis
                    visit(keyword.value, local)
    return sorted(found.values(), key=lambda h: (h.line, h.fingerprint))


def messages_of(n: int) -> list[str]:
    """The failure messages of lesson n's wrong answers (tests/test_checks_lNN.py WRONG)."""
    tests = importlib.import_module(f"test_checks_l{n:02d}")
    out = []
    for k, args, _ in tests.WRONG:
        with contextlib.redirect_stdout(io.StringIO()):
            try:
                run(tests.check, k, args)
            except CheckFailed as exc:
                out.append(str(exc))
    return out


@pytest.mark.parametrize("n", LESSON_PARAMS)
def test_every_hint_of_a_check_module_is_reached_by_a_wrong_answer(n):
    module = importlib.import_module(f"course_utils.checks.l{n:02d}")
    hints = hints_of(Path(module.__file__))
    assert len(hints) >= 10  # the scan sees the module's hints
    said = "\n".join(messages_of(n))
    unreached = [f"line {h.line}: {h.fingerprint!r}" for h in hints if h.fingerprint not in said]
    assert not unreached, (
        f"lesson {n:02d}: hints no wrong answer in tests/test_checks_l{n:02d}.py reaches "
        f"(add one to WRONG, or remove the dead hint):\n" + "\n".join(unreached)
    )


def test_every_hint_of_the_per_rank_builds_is_reached_by_a_wrong_answer():
    """`checks.builds` judges the per-rank programs of lessons 08, 09 and 10 for their check
    modules: its hints are reached by those lessons' wrong answers."""
    from course_utils.checks import builds

    hints = hints_of(Path(builds.__file__))
    assert len(hints) >= 30  # the scan sees the module's hints
    said = "\n".join(m for n in (8, 9, 10) for m in messages_of(n))
    unreached = [f"line {h.line}: {h.fingerprint!r}" for h in hints if h.fingerprint not in said]
    assert not unreached, "checks/builds.py: hints no wrong answer reaches:\n" + "\n".join(
        unreached
    )


def test_the_scan_finds_hints_in_every_place_a_module_keeps_them(tmp_path):
    source = '''
def _slips(k):
    """A docstring is not a hint."""
    text = "a helper's slip that must be reached"
    return [(2.0, text)]


@exercise(y={"a": RIGHT, "b": "a diagnosis's hint for a wrong choice"}, z="whole number")
def exercise_1(x, y, f):
    judge(x, 1.0, "x", {"a hint keyed to its mistake": 2.0, "the fallback of a judge": OTHERWISE})
    judge(x, 1.0, "x", "a judge's one hint, as text", upside_down="a ratio's right way up")
    for _ in each_call(f, [(1,)], [(1,)], "the hint for inputs too big"):
        pass
    hints = {"b": "a hint in a dict of choices, reached"}
    for message, f in {"a wrong formula named in a loop": 1}.items():
        fail(f"{x} {message}")
    fail(f"{x} an f-string piece, long enough")
    expect_choice(x, "a", hints, "`x` = {got!r} is not it: {hint}.")
    any_call(x, 1.0, "x", slips=_slips(2))  # slips= is followed in any call
    raise CheckFailed("raised directly, also a hint")
    passed("a success message is not a hint")
'''
    path = tmp_path / "lxx.py"
    path.write_text(source)
    found = {h.fingerprint for h in hints_of(path)}
    assert found == {
        "a diagnosis's hint for a wrong choice",
        "a hint keyed to its mistake",
        "a judge's one hint, as text",
        "a ratio's right way up",
        "the hint for inputs too big",
        "the fallback of a judge",
        "a helper's slip that must be reached",
        "a hint in a dict of choices, reached",
        "a wrong formula named in a loop",
        "an f-string piece, long enough",
        "is not it:",
        "raised directly, also a hint",
    } - {"is not it:"}  # 11 characters: too short to fingerprint
