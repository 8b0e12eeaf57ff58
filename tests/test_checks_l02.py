"""The lesson 02 checks: right answers pass, wrong ones fail kindly, placeholders say so."""

import math

import pytest

from course_utils.checks import CheckFailed, NotAnswered
from course_utils.checks import l02 as check


def gpipe_schedule(p, m):
    return [[f"{d}F{k}" for k in range(m)] + [f"{d}B{k}" for k in range(m)] for d in range(p)]


RIGHT = {
    1: (["0F0", "0F1", "1F0", "1F1", "1B0", "0B0", "1B1", "0B1"],),
    2: ("0F4", "1F3"),
    3: (gpipe_schedule,),
    4: (33, 96 / 33),
    5: ("a", "b"),
    6: (0.25,),
}


def test_ties_may_be_listed_either_way(capsys):
    check.exercise_1(["0F0", "1F0", "0F1", "1F1", "1B0", "1B1", "0B0", "0B1"])
    assert "✅" in capsys.readouterr().out


WRONG = [  # (exercise, arguments, words the hint must contain)
    (1, (["0F0", "1F0", "0F1", "1F1", "0B0", "1B0", "1B1", "0B1"],), "1B0 starts first"),
    (1, (["0F0", "0F1", "1F0", "1F1", "1B0", "0B0", "1B1"],), "missing"),
    (1, (["0F0", "0F0", "1F0", "1F1", "1B0", "0B0", "1B1", "0B1"],), "twice"),
    (1, (["0F0", "0F1", "1F0", "1F1", "1B0", "0B0", "1B1", "2B1"],), "does not happen"),
    (1, (["0X0"],), "action written like"),
    (1, ("0F0 0F1",), "should be a list"),
    (2, ("0F3", "1F3"), "behind"),
    (2, ("0F5", "1F3"), "ahead"),
    (2, ("0B0", "1F3"), "no backward"),
    (2, ("0F", "1F3"), "needs a micro-batch number"),
    (2, ("1F4", "1F3"), "action of stage 0"),
    (4, (24, 4.0), "busy time"),
    (4, (96, 1.0), "naive"),
    (4, (30, 3.0), "Draw the forward half"),
    (4, (33, 3.0), "speedup"),
    (4, (math.nan, 3.0), "NaN"),
    (5, ("b", "b"), "most grey"),
    (5, ("a", "a"), "slow stage"),
    (5, ("a", "z"), "should be one of"),
    (6, (1 / 32,), "mean"),
    (6, (1.0,), "4 times"),
    (6, (4,), "below 1"),
    (6, ("0.25",), "without quotes"),
]


def test_build_exercise_catches_wrong_schedules():
    def one_f_one_b_like(p, m):
        return [
            [a for k in range(m) for a in (f"{d}F{k}", f"{d}B{k}")] for d in range(p)
        ]  # F then B per micro-batch: valid for p=1 only, deadlocks or is not GPipe

    def missing_backward(p, m):
        return [[f"{d}F{k}" for k in range(m)] for d in range(p)]

    def wrong_count(p, m):
        return gpipe_schedule(p, m)[:-1]

    def crashes(p, m):
        return [[f"{d}F{k}" for k in range(m)] for d in range(p + "x")]

    def stub(p, m):
        raise NotImplementedError()

    with pytest.raises(CheckFailed, match="backward before its last forward|deadlock"):
        check.exercise_3(one_f_one_b_like)
    with pytest.raises(CheckFailed, match="missing"):
        check.exercise_3(missing_backward)
    with pytest.raises(CheckFailed, match="one per device"):
        check.exercise_3(wrong_count)
    with pytest.raises(CheckFailed, match="TypeError"):
        check.exercise_3(crashes)
    with pytest.raises(NotAnswered):
        check.exercise_3(stub)
