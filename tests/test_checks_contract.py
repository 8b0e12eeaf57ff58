"""What every lesson's checks promise, tested once for all lessons.

Each `tests/test_checks_lNN.py` holds RIGHT = {exercise number: right arguments}, WRONG =
[(exercise, wrong arguments, what the hint must say)] and the lesson's own special tests.
Here, for every lesson and exercise: the right answer passes with a ✅, all-None arguments
say "not answered yet", each wrong answer fails with its hint (and is not mistaken for an
unanswered one), and no exercise of a check module is left without a right answer to test.
"""

from __future__ import annotations

import importlib
import inspect
import re

import pytest

from course_utils.checks import CheckFailed, NotAnswered

LESSONS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]  # the lessons with exercises


def lesson(n: int):
    """(check module, RIGHT) of lesson n, from its test file."""
    tests = importlib.import_module(f"test_checks_l{n:02d}")
    return tests.check, tests.RIGHT


def wrong_answers(n: int) -> list:
    return importlib.import_module(f"test_checks_l{n:02d}").WRONG


CASES = [(n, k) for n in LESSONS for k in sorted(lesson(n)[1])]
WRONG = [(n, i) for n in LESSONS for i in range(len(wrong_answers(n)))]


@pytest.mark.parametrize("n, k", CASES, ids=[f"l{n:02d}-{k}" for n, k in CASES])
def test_right_answers_pass(n, k, capsys):
    check, right = lesson(n)
    getattr(check, f"exercise_{k}")(*right[k])
    assert capsys.readouterr().out.startswith("✅")


@pytest.mark.parametrize("n, k", CASES, ids=[f"l{n:02d}-{k}" for n, k in CASES])
def test_none_is_not_answered(n, k):
    check, right = lesson(n)
    with pytest.raises(NotAnswered, match=rf"Exercise {n}\.{k} is not answered yet"):
        getattr(check, f"exercise_{k}")(*[None] * len(right[k]))


@pytest.mark.parametrize("n, i", WRONG, ids=[f"l{n:02d}-{i}" for n, i in WRONG])
def test_wrong_answers_get_hints(n, i):
    k, args, needle = wrong_answers(n)[i]
    check, _ = lesson(n)
    with pytest.raises(CheckFailed) as info:
        getattr(check, f"exercise_{k}")(*args)
    assert not isinstance(info.value, NotAnswered)
    message = str(info.value)
    if isinstance(needle, re.Pattern):
        assert needle.search(message), (needle.pattern, message)
    else:
        assert needle in message, (needle, message)


@pytest.mark.parametrize("n", LESSONS)
def test_every_exercise_has_a_right_answer_to_test(n):
    check, right = lesson(n)
    exercises = {
        int(name.removeprefix("exercise_"))
        for name, fn in inspect.getmembers(check, inspect.isfunction)
        if name.startswith("exercise_") and fn.__module__ == check.__name__
    }
    assert exercises and exercises == set(right), (sorted(exercises), sorted(right))


@pytest.mark.parametrize("n", LESSONS)
def test_every_hint_reads_as_sentences(n):
    """A failure message is what a teacher would say: whole sentences, not fragments glued
    together (a question's slip used to read "`x` = 2 looks like it is in every routed
    token"). Each message ends a sentence; none keeps the old fragment pattern."""
    check, _ = lesson(n)
    for k, args, _ in wrong_answers(n):
        try:
            getattr(check, f"exercise_{k}")(*args)
        except CheckFailed as exc:
            text = str(exc).strip()
            assert re.search(r"[.?!][)`'\"]?$", text), text
            assert "looks like it is in" not in text, text


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
    getattr(check, f"exercise_{k}")(*args)
    assert capsys.readouterr().out.startswith("✅")
