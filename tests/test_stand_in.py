"""No callable of the stand-in check modules hands out an answer (issue 37, attack 6).

While a notebook is graded its kernel sees `course_utils.checks` replaced by the stand-in
(`grading/stand_in.py`). It used to keep the lesson's own material functions, and with them
whatever they called: `l11._culprit(check.variant)` returned Exercise 11.5's answer. Now each
lesson module is data the grader computed. This test takes every lesson's stand-in, written
for one student as the grader writes it, calls every callable in it with that student's
numbers (every way they could be passed), and compares each result with the real answers:

- every expected value the lesson's checks compare an answer with (`judge`'s and
  `expect_choice`'s), recorded while each check's judging code runs on stand-in answers;
- what every function of the real module that the stand-in does not offer (`_culprit`,
  `_bubble`, `_plan`, ...) returns for the same numbers.

The same scan of the real lesson 11 module finds `_culprit`: the test can fail.
"""

from __future__ import annotations

import importlib.util
import inspect
import math
import sys
from pathlib import Path
from types import ModuleType

import nbformat
import pytest

from course_utils import checks
from course_utils.checks import Given, Variant
from course_utils.checks import fields as fields_module
from course_utils.grading import stand_in
from course_utils.grading.grader import solution_for

ROOT = Path(__file__).resolve().parents[1]
LESSONS = list(range(1, 14))
STUDENT = "s7"


class Anything:
    """An answer of every shape: whatever the judging code does with it works."""

    def __getattr__(self, name):
        return self

    def __call__(self, *a, **k):
        return self

    def __getitem__(self, key):
        return self

    def __iter__(self):
        return iter(())

    def __len__(self):
        return 0

    def __float__(self):
        return 0.0

    def __int__(self):
        return 0

    def __index__(self):
        return 0

    def __bool__(self):
        return True

    def __eq__(self, other):
        return False

    __hash__ = object.__hash__
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = __call__
    __truediv__ = __rtruediv__ = __pow__ = __neg__ = __abs__ = __call__


def lesson(n: int) -> ModuleType:
    return importlib.import_module(f"course_utils.checks.l{n:02d}")


def expected_values(module: ModuleType, variant: Variant) -> list:
    """What the module's checks compare answers with, for `variant` (see the docstring)."""
    wants: list = []

    def record_judge(value, want, *args, **kwargs):
        wants.append(want)
        return True

    def record_choice(got, right, *args, **kwargs):
        wants.append(right)

    saved = {name: getattr(module, name, None) for name in ("judge", "expect_choice")}
    module.judge, module.expect_choice = record_judge, record_choice  # type: ignore[attr-defined]
    saved_checks = (checks.judge, checks.expect_choice, fields_module.judge)
    checks.judge, checks.expect_choice = record_judge, record_choice  # type: ignore[assignment]
    fields_module.judge = record_judge  # type: ignore[assignment]  (what Fields.judge calls)
    try:
        for name in dir(module):
            if not (name.startswith("exercise_") and name.removeprefix("exercise_").isdigit()):
                continue
            check = getattr(module, name)
            judging = check.__wrapped__
            names = list(inspect.signature(judging).parameters)
            given = getattr(module, f"given_{name.removeprefix('exercise_')}", None)
            read: dict = {n: Anything() for n in names if n not in ("g", "variant")}
            if "g" in names and given is not None:
                read["g"] = Given(given(variant))
            if "variant" in names:
                read["variant"] = variant
            try:
                judging(**read)
            except Exception:  # the judging code went as far as stand-in answers take it
                pass
    finally:
        for name, value in saved.items():
            if value is not None:
                setattr(module, name, value)
        checks.judge, checks.expect_choice, fields_module.judge = saved_checks
    return [w for w in wants if not isinstance(w, Anything) and not callable(w)]


def argument_sets(numbers: dict, variant: Variant) -> list[tuple[tuple, dict]]:
    """Every way a callable might take a student's numbers."""
    values = [v for g in numbers.values() for v in g.values()]
    sets: list[tuple[tuple, dict]] = [((), {}), ((variant,), {}), ((), {"variant": variant})]
    sets += [((v,), {}) for v in values] + [((v, variant), {}) for v in values]
    for g in numbers.values():
        sets += [((), dict(g)), (tuple(g.values()), {}), ((g,), {}), ((Given(g),), {})]
    return sets


def results_of(callables: dict, numbers: dict, variant: Variant) -> list[tuple[str, object]]:
    found = []
    for name, function in callables.items():
        for args, kwargs in argument_sets(numbers, variant):
            try:
                found.append((name, function(*args, **kwargs)))
            except Exception:
                continue
    return found


def same(got, want) -> bool:
    if isinstance(got, bool) or isinstance(want, bool) or got is None:
        return got is want
    if isinstance(got, int | float) and isinstance(want, int | float):
        return math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12)
    try:
        return bool(got == want) and type(got) is type(want)
    except Exception:
        return False


def leaks(found: list[tuple[str, object]], answers: list) -> list[str]:
    return [
        f"{name}(...) -> {value!r:.80}"
        for name, value in found
        for want in answers
        if same(value, want)
    ]


def grader_only(module: ModuleType, offered: set[str]) -> dict:
    """The real module's own functions that the stand-in does not offer."""
    return {
        name: fn
        for name, fn in vars(module).items()
        if inspect.isfunction(fn)
        and fn.__module__ == module.__name__
        and name not in offered
        and not name.startswith(("exercise_", "cases_", "given_"))
    }


def stand_in_module(folder: Path, n: int) -> ModuleType:
    name = f"course_utils.checks.l{n:02d}"  # its own name: for_student finds it by it
    spec = importlib.util.spec_from_file_location(name, folder / f"l{n:02d}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    saved = sys.modules.get(name)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        if saved is not None:
            sys.modules[name] = saved
    return module


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory) -> dict[int, ModuleType]:
    """Each lesson's stand-in module as the grader writes it for STUDENT."""
    made = {}
    for n in LESSONS:
        folder = tmp_path_factory.mktemp(f"stand-in-{n:02d}")
        solution = nbformat.read(solution_for(n, ROOT / "solutions"), as_version=4)
        stand_in.write(folder / "checks", solution, lesson(n), Variant(STUDENT))
        made[n] = stand_in_module(folder / "checks", n)
    return made


@pytest.mark.parametrize("n", LESSONS)
def test_no_stand_in_callable_returns_an_answer(n, stand_ins):
    variant = Variant(STUDENT)
    real = lesson(n)
    module = stand_ins[n]
    callables = {
        name: value
        for name, value in vars(module).items()
        if callable(value) and not isinstance(value, type) and name != "__getattr__"
    }
    numbers = {k: dict(getattr(real, k)(variant)) for k in dir(real) if k.startswith("given_")}
    offered = set(callables)
    answers = expected_values(real, variant)
    answers += [value for _, value in results_of(grader_only(real, offered), numbers, variant)]
    assert answers, "no real answer was found to compare with: the test would prove nothing"
    found = results_of(callables, numbers, variant)
    # What the module's __getattr__ gives for every name the real module has: the checks
    # answer nothing, everything else raises.
    for name in vars(real):
        try:
            value = module.__getattr__(name)
        except AttributeError as exc:
            assert stand_in.KEPT_BY_GRADER in str(exc)
            continue
        found += [(name, value(*args, **kw)) for args, kw in argument_sets(numbers, variant)]
    assert leaks(found, answers) == []
    # Every callable it offers is data's: the lesson's own code is not in the file.
    text = (module.__file__ and Path(module.__file__).read_text()) or ""
    assert "def exercise_" not in text and "import course_utils.checks.l" not in text


def test_the_scan_finds_the_callable_that_used_to_hand_out_11_5s_answer():
    # The real lesson 11 module, scanned the same way: `_culprit(variant)` is an answer.
    variant = Variant(STUDENT)
    real = lesson(11)
    numbers = {k: dict(getattr(real, k)(variant)) for k in dir(real) if k.startswith("given_")}
    answers = expected_values(real, variant)
    found = results_of({"_culprit": real._culprit}, numbers, variant)
    assert any(line.startswith("_culprit(") for line in leaks(found, answers))


def test_the_stand_in_gives_the_grader_s_material_and_numbers_as_data(stand_ins):
    variant = Variant(STUDENT)
    l11, l12, l08 = stand_ins[11], stand_ins[12], stand_ins[8]
    assert l11.their_schedule(variant) == lesson(11).their_schedule(variant)
    assert l11.their_schedule(Variant("anyone")) == lesson(11).their_schedule(variant)
    assert l12.moe_layout(4, variant) == lesson(12).moe_layout(4, variant)
    first, second = l08.their_timeline(variant), l08.their_timeline(variant)
    assert first is not second  # a fresh copy each time: a notebook may change its own
    assert first.makespan == lesson(8).their_timeline(variant).makespan
    assert l08.their_timeline(variant, prefetch=1).makespan < first.makespan
    with pytest.raises(ValueError, match="only these calls are prepared"):
        l12.moe_layout(3, variant)
    assert l11.given_5() == dict(lesson(11).given_5(variant))
    assert not hasattr(stand_ins[3], "their_schedule")  # lesson 11's material is only l11's
    with pytest.raises(AttributeError, match=stand_in.KEPT_BY_GRADER):
        l11._culprit  # noqa: B018
