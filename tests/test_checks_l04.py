"""The lesson 04 checks: right answers pass, wrong ones fail kindly, placeholders say so."""

import math

import pytest

from course_utils.checks import CheckFailed, NotAnswered
from course_utils.checks import l04 as check


def one_f_one_b(p, m, d):
    warmup = min(p - 1 - d, m)
    order = [f"{d}F{i}" for i in range(warmup)]
    for i in range(m - warmup):
        order += [f"{d}F{warmup + i}", f"{d}B{i}"]
    return order + [f"{d}B{i}" for i in range(m - warmup, m)]


RIGHT = {
    1: ([12] * 5, [5, 4, 3, 2, 1]),
    2: (one_f_one_b,),
    3: (27, 27.0, 1 / 3),
    4: (16.5, 7.5),
    5: ("b", "c"),
    6: ("B", " c "),
}


WRONG = [  # (exercise, arguments, words the hint must contain)
    (1, ([5] * 5, [5, 4, 3, 2, 1]), "starts backwards"),
    (1, ([5, 4, 3, 2, 1], [5, 4, 3, 2, 1]), "starts backwards"),
    (1, ([8] * 5, [5, 4, 3, 2, 1]), "every forward"),
    (1, ([12] * 5, [12] * 5), "copies it"),
    (1, ([12] * 5, [1, 2, 3, 4, 5]), "waits longest"),
    (1, ([12] * 5, [4, 3, 2, 1, 0]), "one short"),
    (1, ([12] * 5, [5] * 5), "fewer warm-up"),
    (1, ([12] * 5, [5, 5, 3, 2, 1]), "For device d"),
    (1, ([12] * 4, [5, 4, 3, 2, 1]), "should have 5 items"),
    (1, ([12] * 5, [5, 4, 3, 2, -1]), "cannot be negative"),
    (1, ([12] * 5, [5, 4, 3, 2, 1.5]), "whole number"),
    (1, ("12 12 12 12 12", [5, 4, 3, 2, 1]), "should be a list"),
    (3, (18, 27, 1 / 3), "busy time"),
    (3, (30, 27, 1 / 3), "fill and"),
    (3, (27, 18, 1 / 3), "too short"),
    (3, (27, 30, 1 / 3), "compare the two"),
    (3, (27, 27, 0.5), "relative to the busy"),
    (3, (27, 27, 0.25), "idle time of a device"),
    (3, (27, 27, 9), "between 0 and 1"),
    (3, (27, 27, math.nan), "NaN"),
    (3, ("27", 27, 1 / 3), "without quotes"),
    (4, (12, 7.5), "leaves out W"),
    (4, (10, 7.5), "p - 1"),
    (4, (16.5, 16.5), "fills part"),
    (4, (16.5, 12), "moved out"),
    (4, (16.5, 6), "too optimistic"),
    (4, (16.5, 0), "too optimistic"),
    (4, (16.5, 9), "formula"),
    (5, ("a", "c"), "costs time"),
    (5, ("c", "c"), "size of the parameters"),
    (5, ("d", "c"), "same height"),
    (5, ("b", "a"), "same bytes"),
    (5, ("b", "b"), "twice the layers"),
    (5, ("b", "d"), "replica"),
    (5, ("b", "e"), "should be one of"),
    (5, ("b", 3), "should be one of"),
    (6, ("a", "c"), "smaller, not larger"),
    (6, ("c", "c"), "own I"),
    (6, ("d", "c"), "deadlock"),
    (6, ("b", "a"), "needs its own I"),
    (6, ("b", "b"), "still wait"),
    (6, ("b", "d"), "brings back"),
]


def test_build_exercise_catches_wrong_functions():
    def gpipe_order(p, m, d):
        return [f"{d}F{i}" for i in range(m)] + [f"{d}B{i}" for i in range(m)]

    def warmup_ignores_small_m(p, m, d):
        warmup = p - 1 - d  # forgets min(..., m): forwards of micro-batches that do not exist
        order = [f"{d}F{i}" for i in range(warmup)]
        for i in range(m - warmup):
            order += [f"{d}F{warmup + i}", f"{d}B{i}"]
        return order + [f"{d}B{i}" for i in range(max(0, m - warmup), m)]

    def one_short_warmup(p, m, d):
        warmup = max(0, min(p - 2 - d, m))
        order = [f"{d}F{i}" for i in range(warmup)]
        for i in range(m - warmup):
            order += [f"{d}F{warmup + i}", f"{d}B{i}"]
        return order + [f"{d}B{i}" for i in range(m - warmup, m)]

    def newest_backward_first(p, m, d):
        order = one_f_one_b(p, m, d)
        backs = [a for a in order if "B" in a]
        backs_iter = iter(reversed(backs))
        return [next(backs_iter) if "B" in a else a for a in order]

    def wrong_stage(p, m, d):
        return [a.replace(f"{d}", f"{d + 1}", 1) for a in one_f_one_b(p, m, d)]

    def forward_only(p, m, d):
        return [f"{d}F{i}" for i in range(m)]

    def stub(p, m, d):
        raise NotImplementedError()

    def crashes(p, m, d):
        return one_f_one_b(p, m, d) if p > 1 else 1 / 0

    def not_actions(p, m, d):
        return ["forward"] * (2 * m)

    with pytest.raises(CheckFailed, match="too many"):
        check.exercise_2(gpipe_order)
    with pytest.raises(CheckFailed, match="returned"):
        check.exercise_2(warmup_ignores_small_m)
    with pytest.raises(CheckFailed, match="too few"):
        check.exercise_2(one_short_warmup)
    with pytest.raises(CheckFailed, match="goes wrong at position"):
        check.exercise_2(newest_backward_first)
    with pytest.raises(CheckFailed, match="exactly one F and one B of stage"):
        check.exercise_2(wrong_stage)
    with pytest.raises(CheckFailed, match="returned .* actions"):
        check.exercise_2(forward_only)
    with pytest.raises(NotAnswered):
        check.exercise_2(stub)
    with pytest.raises(CheckFailed, match="ZeroDivisionError"):
        check.exercise_2(crashes)
    with pytest.raises(CheckFailed, match="not an action"):
        check.exercise_2(not_actions)
    with pytest.raises(CheckFailed, match="should be a function"):
        check.exercise_2("F F F B F B")


def test_build_exercise_accepts_action_values():
    from course_utils.pipeline.schedules import make_schedule

    def from_course(p, m, d):
        return list(make_schedule("1f1b", p, m).devices[d])

    check.exercise_2(from_course)
