"""The lesson 03 checks: right answers pass, wrong ones fail kindly, placeholders say so."""

import math

import pytest
import roundprograms as rp

from course_utils.checks import CheckFailed, NotAnswered, Variant
from course_utils.checks import l03 as check
from course_utils.pipeline import CostModel, make_schedule, simulate


def gpipe_bubble(p, m):
    return (p - 1) / (m + p - 1)


_P1, _M1 = check.given_1(Variant("alice")).values()
assert _P1 / (_M1 + _P1) != (_P1 - 1) / _M1


def _simulating(p, m):  # right, but it builds the schedule: a million stages take forever
    if p > 10**5:
        raise MemoryError("a million stages do not fit")
    return (p - 1) / (m + p - 1)


RIGHT = {
    1: (0.2,),
    2: (gpipe_bubble,),
    3: (63,),
    4: (4, rp.rounds),
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
    (4, (53, rp.rounds), "forgets the 74 GB of model state"),
    (4, (49, rp.rounds), "left for activations"),
    (4, (7, rp.rounds), "fit beside the model state"),
    (4, (4, rp.all_at_once), "one GPipe step"),
    (4, (4, rp.cleared), "cleared between rounds"),
    (4, (4, rp.waits_first_rounds), "Follow one round through your program"),
    (4, (4, rp.mixed_rounds), "each rank takes the rounds"),
    (5, ("b", "b"), "how many devices"),
    (5, ("a", "a"), "keeps shrinking"),
    (5, ("a", "c"), "fixed"),
    (5, ("a", 2), "should be one of"),
    (6, (48 / 90, 1), "least grey"),
    (6, (48 / 90, 5), "0, 1 or 2"),
    (6, (42 / 90, 2), "bubble"),
    (6, (4 / 6, 2), "not equal"),
    (6, (0.9, 2), "total busy time"),
    (1, (1.5,), "is a fraction of the step: a number between 0 and 1, not 1.5"),
    # the default's p / (m + p) equals (p-1)/m (m = p(p-1)); another student's does not
    (1, (_P1 / (_M1 + _P1), Variant("alice")), "Count the fill slots again"),
    (2, (lambda p, m: (p - 1) / m,), "gives (p-1)/m"),
    (2, (lambda p, m: 1 / (m + p),), "should be 0: a single device never waits"),
    # pi/10 is no ratio of small whole numbers: never right, never (p-1)/m, on any drawn case
    (2, (lambda p, m: math.pi / 10 if p > 1 else 0.0,), "which is not the idle share of the step"),
    (2, (_simulating,), "also tries a million stages"),
    (3, (70,), "makes (p-1)/m = 10%"),
    (5, ("a", "d"), "the work is equal"),
]


def right_for(variant):
    """The right answers of exercises 1, 3, 4 and 6 from the student's own numbers."""
    p1, m1 = check.given_1(variant).values()
    p3, target = check.given_3(variant).values()
    m6, heavy = check.given_6(variant).values()
    costs = CostModel(stage_forward=[1, 1, heavy], stage_backward=[2, 2, 2 * heavy])
    timeline = simulate(make_schedule("gpipe", 3, m6), costs)
    busy = [timeline.busy(d) for d in range(3)]
    return {
        1: (gpipe_bubble(p1, m1),),
        3: (math.ceil((p3 - 1) * (1 - target) / target - 1e-9),),
        4: (check.room(check.given_4(variant)), rp.rounds),
        6: (sum(busy) / (3 * timeline.makespan), busy.index(max(busy))),
    }


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
