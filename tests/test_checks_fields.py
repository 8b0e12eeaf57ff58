"""A multi-answer exercise names every wrong answer at once (issue 50: 6.6 with three wrong
answers named only `cause`).

For every exercise of every lesson with two answers or more (tests/test_checks_lNN.py's RIGHT),
each answer that is a number or a word is made wrong on its own, with the others right: the
first candidate the check rejects naming that answer (`name`) is kept. Then all of them wrong
together must fail once, naming every one.
"""

from __future__ import annotations

import inspect
import math

import pytest
from checkskit import run
from test_checks_contract import LESSONS, lesson

from course_utils.checks import CheckFailed, NotAnswered

WORDS = ["a", "b", "c", "d", "same", "depth-first", "breadth-first", "all-reduce", "all-gather"]


def candidates(value, lesson_words: set[str]) -> list:
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [value + 1, value - 1, value * 2 + 3]
    if isinstance(value, float):
        return [value * 1.37 + 0.01, value * 2 + 1] if math.isfinite(value) else []
    if isinstance(value, str):  # another digit in an action ("0F6" -> "0F7"), another word
        digits = [value[:-1] + str((int(value[-1]) + 1) % 10)] if value[-1:].isdigit() else []
        return [w for w in [*digits, *WORDS, *sorted(lesson_words)] if w != value]
    return []  # lists, functions, dicts: judged as a whole elsewhere


def answer_names(check, k: int) -> list[str]:
    fn = getattr(check, f"exercise_{k}")
    return [p for p in inspect.signature(fn).parameters if p != "variant"]


def message(check, k, answers) -> str | None:
    try:
        run(check, k, answers)
    except NotAnswered:
        return None
    except CheckFailed as exc:
        return str(exc)
    return None


def wrong_one_at_a_time(check, k, right) -> dict[int, object]:
    """{answer index: a wrong value the check names that answer for}."""
    names = answer_names(check, k)
    words = {a for answers in lesson_rights(check) for a in answers if isinstance(a, str)}
    found = {}
    for i, value in enumerate(right):
        for wrong in candidates(value, words):
            said = message(check, k, [*right[:i], wrong, *right[i + 1 :]])
            if said and f"`{names[i]}`" in said:
                found[i] = wrong
                break
    return found


def lesson_rights(check):
    return [a for n in LESSONS for c, r in [lesson(n)] if c is check for a in r.values()]


MULTI = [(n, k) for n in LESSONS for k, answers in sorted(lesson(n)[1].items()) if len(answers) > 1]


# Every multi-answer exercise judges each answer in its own field (`Fields`), a Diagnose's
# tables included (`exercise` judges every table, then the rest of the check): issue 50.
@pytest.mark.parametrize("n, k", MULTI, ids=[f"{n}.{k}" for n, k in MULTI])
def test_every_wrong_answer_is_named_at_once(n, k):
    check, rights = lesson(n)
    right = list(rights[k])
    wrong = wrong_one_at_a_time(check, k, right)
    if len(wrong) < 2:
        pytest.skip(f"{n}.{k}: fewer than two answers this test can make wrong on their own")
    answers = [wrong.get(i, v) for i, v in enumerate(right)]
    said = message(check, k, answers) or ""
    names = answer_names(check, k)
    missing = [names[i] for i in wrong if f"`{names[i]}`" not in said]
    assert not missing, f"exercise {n}.{k}: {missing} not named in: {said}"


# Multi-answer exercises not shared answer by answer: 1.6 and 12.5 (all or nothing as
# declared), the Builds 3.4, 4.4, 6.5, 9.4 (a Build's parts are its cases), and 7.4: one layout
# in three numbers, judged by constraints that tie them together (tp x pp x dp = the GPUs).
ALL_OR_NOTHING = {(1, 6), (3, 4), (4, 4), (6, 5), (9, 4), (12, 5), (7, 4)}
FIELDS = [(n, k) for n, k in MULTI if (n, k) not in ALL_OR_NOTHING]


@pytest.mark.parametrize("n, k", FIELDS, ids=[f"{n}.{k}" for n, k in FIELDS])
def test_a_multi_answer_exercise_earns_a_part_per_right_answer(n, k):
    """Partial credit per answer (scoring.py): one wrong answer of n leaves n - 1 parts right,
    said on the failure's last line; a Build's parts are its cases (tests/test_points.py)."""
    check, rights = lesson(n)
    fn = getattr(check, f"exercise_{k}")
    assert fn.partial, f"exercise {n}.{k} judges its answers one by one but earns all or nothing"
    if hasattr(check, f"cases_{k}"):
        return
    right = list(rights[k])
    total = len(right)
    for i, wrong in wrong_one_at_a_time(check, k, right).items():
        with pytest.raises(CheckFailed) as caught:
            run(check, k, [*right[:i], wrong, *right[i + 1 :]])
        assert caught.value.parts == (total - 1, total), (n, k, i, str(caught.value))
        share = round(fn.points * (total - 1) / total, 2)
        last = str(caught.value).splitlines()[-1]
        assert last.startswith(f"Partly right: {total - 1} of {total} parts ({share:g} of"), last


def test_an_unanswered_answer_is_said_before_any_wrong_one_is_judged():
    from course_utils.checks import l05

    for answers in (("a", "b", None), ("a", None, 2), (None, "c", 8)):
        with pytest.raises(NotAnswered):
            l05.exercise_5(*answers)
