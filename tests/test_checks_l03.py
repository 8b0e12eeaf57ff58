"""The lesson 03 checks: right answers pass, wrong ones fail kindly, placeholders say so."""

import math

import pytest

from course_utils.checks import CheckFailed, NotAnswered
from course_utils.checks import l03 as check


def gpipe_bubble(p, m):
    return (p - 1) / (m + p - 1)


RIGHT = {
    1: (0.2,),
    2: (gpipe_bubble,),
    3: (63,),
    4: (20, 3 / 23),
    5: ("a", "b"),
    6: (48 / 90, 2),
}


WRONG = [  # (exercise, arguments, words the hint must contain)
    (1, (0.25,), "relative to the ideal"),
    (1, (0.5,), "count busy slots"),
    (1, (20,), "between 0 and 1"),
    (1, (math.nan,), "NaN"),
    (1, ("0.2",), "without quotes"),
    (3, (62,), "still above 10%"),
    (3, (64,), "the fewest"),
    (3, (63.5,), "whole number"),
    (3, (0,), "at least 1"),
    (4, (53, 0.1), "model state"),
    (4, (33, 0.1), "left for activations"),
    (4, (4, 0.1), "1F1B"),  # m = p: the 1F1B count
    (4, (10, 0.1), "at the peak"),
    (4, (20, 0.2), "bubble formula"),
    (5, ("b", "b"), "how many devices"),
    (5, ("a", "a"), "keeps shrinking"),
    (5, ("a", "c"), "fixed"),
    (5, ("a", 2), "should be one of"),
    (6, (48 / 90, 1), "least grey"),
    (6, (48 / 90, 5), "0, 1 or 2"),
    (6, (42 / 90, 2), "bubble"),
    (6, (4 / 6, 2), "not equal"),
    (6, (0.9, 2), "total busy time"),
]


def test_build_exercise_catches_wrong_functions():
    def relative(p, m):
        return (p - 1) / m

    def off_by_one(p, m):
        return p / (m + p)

    def crashes_on_one_device(p, m):
        return (p - 1) / (m + p - 1) if p > 1 else 1 / 0

    def stub(p, m):
        raise NotImplementedError()

    with pytest.raises(CheckFailed, match="relative to the busy time|should be 0"):
        check.exercise_2(relative)
    with pytest.raises(CheckFailed, match="should be 0|not the idle share"):
        check.exercise_2(off_by_one)
    with pytest.raises(CheckFailed, match="ZeroDivisionError"):
        check.exercise_2(crashes_on_one_device)
    with pytest.raises(NotAnswered):
        check.exercise_2(stub)
    with pytest.raises(CheckFailed, match="should be a function"):
        check.exercise_2("(p-1)/(m+p-1)")
