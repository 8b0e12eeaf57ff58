"""What every lesson's checks promise, tested once for all lessons.

The lessons are the check modules in course_utils/checks/ (every `lNN.py`). Each has a test
file, tests/test_checks_lNN.py, that declares:

- RIGHT = {exercise: the default student's right answers};
- WRONG = [(exercise, answers, what the hint must say)]; answers may end with the `Variant`
  they are for (another student's numbers);
- right_for(variant) -> {exercise: the right answers for that student's numbers}, for every
  exercise whose numbers differ between students (STUDENTS may name the students to try);

and the lesson's own special tests. Here, for every lesson and exercise: the right answer
passes with a ✅, all-None arguments say "not answered yet", each wrong answer fails with
its hint (and is not mistaken for an unanswered one), no exercise is left without a right
answer to test; every student passes with their own numbers, the default student's own are
RIGHT's, and a neighbour's answers fail wherever the right answers differ.
"""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest
from checkskit import STUDENTS, run

from course_utils import checks
from course_utils.checks import DEFAULT, CheckFailed, NotAnswered, Variant, same_to_3_figures

LESSONS = sorted(int(p.stem[1:]) for p in Path(checks.__file__).parent.glob("l[0-9][0-9].py"))


def lesson_tests(n: int):
    """Lesson n's test file (tests/test_checks_lNN.py), with its RIGHT, WRONG and right_for."""
    return importlib.import_module(f"test_checks_l{n:02d}")


def lesson(n: int):
    """(check module, RIGHT) of lesson n, from its test file."""
    tests = lesson_tests(n)
    return tests.check, tests.RIGHT


def students(n: int) -> list[Variant]:
    names = getattr(lesson_tests(n), "STUDENTS", STUDENTS)
    return [Variant(name, cases_seed=7) for name in names]


def same(a, b) -> bool:
    """The same answers, numbers to 3 significant figures (a copy of one passes for the other)."""
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    numbers = (int, float)
    if isinstance(a, numbers) and isinstance(b, numbers) and not isinstance(a, bool):
        return same_to_3_figures(float(a), float(b))
    return a == b


def slow(n: int) -> list:
    """`slow` for a lesson whose test file says SLOW: its checks start processes."""
    return [pytest.mark.slow] if getattr(lesson_tests(n), "SLOW", False) else []


LESSON_PARAMS = [pytest.param(n, marks=slow(n)) for n in LESSONS]
CASES = [
    pytest.param(n, k, marks=slow(n), id=f"l{n:02d}-{k}")
    for n in LESSONS
    for k in sorted(lesson(n)[1])
]
WRONG = [
    pytest.param(n, i, marks=slow(n), id=f"l{n:02d}-{i}")
    for n in LESSONS
    for i in range(len(lesson_tests(n).WRONG))
]


@pytest.mark.parametrize("n, k", CASES)
def test_right_answers_pass(n, k, capsys):
    check, right = lesson(n)
    run(check, k, right[k])
    assert capsys.readouterr().out.startswith("✅")


@pytest.mark.parametrize("n, k", CASES)
def test_none_is_not_answered(n, k):
    check, right = lesson(n)
    with pytest.raises(NotAnswered, match=rf"Exercise {n}\.{k} is not answered yet"):
        run(check, k, [None] * len(right[k]))


@pytest.mark.parametrize("n, i", WRONG)
def test_wrong_answers_get_hints(n, i):
    k, args, needle = lesson_tests(n).WRONG[i]
    check, _ = lesson(n)
    with pytest.raises(CheckFailed) as info:
        run(check, k, args)
    assert not isinstance(info.value, NotAnswered)
    message = str(info.value)
    if isinstance(needle, re.Pattern):
        assert needle.search(message), (needle.pattern, message)
    else:
        assert needle in message, (needle, message)


@pytest.mark.parametrize("n", LESSON_PARAMS)
def test_every_exercise_has_a_right_answer_to_test(n):
    check, right = lesson(n)
    exercises = {
        int(name.removeprefix("exercise_"))
        for name, fn in inspect.getmembers(check, inspect.isfunction)
        if name.startswith("exercise_") and fn.__module__ == check.__name__
    }
    assert exercises and exercises == set(right), (sorted(exercises), sorted(right))


@pytest.mark.parametrize("n", LESSON_PARAMS)
def test_every_hint_reads_as_sentences(n):
    """A failure message is what a teacher would say: whole sentences, not fragments glued
    together (a question's slip used to read "`x` = 2 looks like it is in every routed
    token"). Each message ends a sentence; none keeps the old fragment pattern."""
    check, _ = lesson(n)
    for k, args, _ in lesson_tests(n).WRONG:
        try:
            run(check, k, args)
        except CheckFailed as exc:
            text = str(exc).strip()
            assert re.search(r"[.?!][)`'\"]?$", text), text
            assert "looks like it is in" not in text, text


# -- per-student numbers ------------------------------------------------------------------


@pytest.mark.parametrize("n", LESSON_PARAMS)
def test_every_exercise_whose_numbers_vary_declares_its_right_answers_per_student(n):
    check, _ = lesson(n)
    declared = set(lesson_tests(n).right_for(DEFAULT))
    for name, given in inspect.getmembers(check, callable):
        if re.fullmatch(r"given_\d+", name):
            k = int(name.removeprefix("given_"))
            varies = any(given(v) != given(DEFAULT) for v in students(n))
            assert not varies or k in declared, f"exercise {n}.{k} varies: add it to right_for"


@pytest.mark.parametrize("n", LESSON_PARAMS)
def test_the_default_student_gets_the_lessons_answers(n):
    _, right = lesson(n)
    for k, answers in lesson_tests(n).right_for(DEFAULT).items():
        assert same(list(answers), list(right[k])), (k, answers, right[k])


PER_STUDENT = [
    pytest.param(n, v.student, marks=slow(n), id=f"l{n:02d}-{v.student}")
    for n in LESSONS
    for v in students(n)
]


@pytest.mark.parametrize("n, student", PER_STUDENT)
def test_every_student_passes_with_their_own_numbers(n, student, capsys):
    check, right = lesson(n)
    variant = Variant(student, cases_seed=7)
    theirs = lesson_tests(n).right_for(variant)
    for k in sorted(right):
        run(check, k, theirs.get(k, right[k]), variant)
        assert capsys.readouterr().out.startswith("✅"), (student, k)


@pytest.mark.parametrize("n", LESSON_PARAMS)
def test_a_neighbours_answers_fail(n):
    """The default student's answers fail for every student whose right answers differ (and
    some student's do: the numbers are there so that a copied answer fails)."""
    check, _ = lesson(n)
    mine = lesson_tests(n).right_for(DEFAULT)
    failed = set()
    for variant in students(n):
        for k, answers in lesson_tests(n).right_for(variant).items():
            if same(list(answers), list(mine[k])):
                continue  # the same right answer for both: a copy is right
            with pytest.raises(CheckFailed):
                run(check, k, mine[k], variant)
            failed.add(k)
    assert failed, f"lesson {n:02d}: every student has the default student's answers"


# Answers rounded to 3 significant figures pass everywhere, inside lists and tuples too
# (issue 23: 7.2's 37,700,000, 7.3's 23.8, 10.3's lists were rejected).
ROUNDED = [
    (7, 2, ("all-reduce", 37_700_000)),
    (7, 3, (23.8, 14.4, 5.0)),
    (10, 3, ([197_000, 307_000], [307_000, 197_000], 1_010_000)),
    (10, 3, ((197_000, 307_000), (307_000, 197_000), 1_010_000)),
]


@pytest.mark.parametrize("n, k, args", ROUNDED, ids=[f"l{n:02d}-{k}" for n, k, _ in ROUNDED])
def test_answers_to_3_significant_figures_pass(n, k, args, capsys):
    check, _ = lesson(n)
    run(check, k, args)
    assert capsys.readouterr().out.startswith("✅")
