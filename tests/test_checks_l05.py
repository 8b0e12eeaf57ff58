"""The lesson 05 checks: right answers pass, wrong ones fail kindly, placeholders say so."""

import math

import pytest

from course_utils.checks import CheckFailed, NotAnswered
from course_utils.checks import l05 as check


def looping_placement(p, v):
    return [s % p for s in range(p * v)]


BREADTH_FIRST = [
    ["0F0", "0F1", "2F0", "2F1", "2B1", "2B0", "0B1", "0B0"],
    ["1F0", "1F1", "3F0", "3F1", "3B1", "3B0", "1B1", "1B0"],
]
# Micro-batches backwarded first-in first-out on both devices: also breadth-first, as fast.
BREADTH_FIRST_FIFO = [
    ["0F0", "0F1", "2F0", "2F1", "2B0", "2B1", "0B0", "0B1"],
    ["1F0", "1F1", "3F0", "3F1", "3B0", "3B1", "1B0", "1B1"],
]

RIGHT = {
    1: (looping_placement,),
    2: (7 / 64, 53.25),
    3: ("same", "depth-first", 16),
    4: (BREADTH_FIRST,),
    5: ("b", "b", 2),
    6: ("breadth-first", "depth-first", "b"),
}


def test_other_right_forms_pass(capsys):
    check.exercise_1(lambda p, v: tuple(range(p)) * v)
    check.exercise_2(0.109375, 53.25)
    check.exercise_3(" Same ", "DEPTH-FIRST", 16.0)
    check.exercise_4(BREADTH_FIRST_FIFO)
    check.exercise_6("Breadth-First", "depth-first", "B")
    out = capsys.readouterr().out
    assert out.count("✅") == 5


def test_partly_answered_is_not_answered():
    with pytest.raises(NotAnswered, match="step_time"):
        check.exercise_2(7 / 64, None)
    with pytest.raises(NotAnswered, match="breadth_first_peak"):
        check.exercise_3("same", "depth-first", None)
    with pytest.raises(NotAnswered, match="reason_a"):
        check.exercise_6("breadth-first", "depth-first", None)


WRONG = [  # (exercise, arguments, words the hint must contain)
    (2, (7 / 16, 53.25), "without chunks"),
    (2, (7 / 71, 53.25), "whole step"),
    (2, (31 / 64, 53.25), "last DEVICE"),
    (2, (0.5, 53.25), "not right yet"),
    (2, (7 / 64, 48), "ideal time"),
    (2, (7 / 64, 69), "unchunked"),
    (2, (7 / 64, 60), "`step_time` is not"),
    (2, (math.nan, 53.25), "NaN"),
    (2, ("7/64", 53.25), "without quotes"),
    (3, ("depth-first", "depth-first", 16), "same p - 1 hops"),
    (3, ("breadth-first", "depth-first", 16), "same p - 1 hops"),
    (3, ("same", "breadth-first", 16), "first backward"),
    (3, ("same", "same", 16), "first backward"),
    (3, ("same", "depth-first", 8), "whole micro-batches"),
    (3, ("same", "depth-first", 11), "depth-first peak"),
    (3, ("same", "depth-first", 32), "not right"),
    (3, ("same", "depth-first", 16.5), "whole number"),
    (3, ("neither", "depth-first", 16), "should be one of"),
    (5, ("a", "b", 2), "bubble formula"),
    (5, ("c", "b", 2), "Memory"),
    (5, ("d", "b", 2), "equal stages"),
    (5, ("b", "a", 2), "More chunks"),
    (5, ("b", "c", 2), "More devices"),
    (5, ("b", "d", 2), "GPipe"),
    (5, ("b", "b", 4), "not the fastest"),
    (5, ("b", "b", 1), "not the fastest"),
    (5, ("b", "b", 3), "1, 2, 4 or 8"),
    (5, ("e", "b", 2), "should be one of"),
    (6, ("depth-first", "depth-first", "b"), "gradient reduction start early"),
    (6, ("breadth-first", "breadth-first", "b"), "activation memory"),
    (6, ("breadth-first", "depth-first", "a"), "same bubble"),
    (6, ("breadth-first", "depth-first", "c"), "MORE activations"),
    (6, ("breadth-first", "depth-first", "d"), "same transfers"),
    (6, ("gpipe", "depth-first", "b"), "should be one of"),
]


def test_placement_exercise_catches_wrong_functions():
    def blocks(p, v):  # consecutive stages on one device
        return [s // v for s in range(p * v)]

    def too_short(p, v):
        return list(range(p))

    def off_by_one(p, v):
        return [(s + 1) % p for s in range(p * v)]

    def out_of_range(p, v):
        return [s % (p + 1) for s in range(p * v)]

    def crashes(p, v):
        return [s % p for s in range(p * v)] if v > 1 else 1 / 0

    def stub(p, v):
        raise NotImplementedError()

    with pytest.raises(CheckFailed, match="like cards"):
        check.exercise_1(blocks)
    with pytest.raises(CheckFailed, match="one per stage"):
        check.exercise_1(too_short)
    with pytest.raises(CheckFailed, match="not looping placement"):
        check.exercise_1(off_by_one)
    with pytest.raises(CheckFailed, match="outside"):
        check.exercise_1(out_of_range)
    with pytest.raises(CheckFailed, match="ZeroDivisionError"):
        check.exercise_1(crashes)
    with pytest.raises(CheckFailed, match="should be a list"):
        check.exercise_1(lambda p, v: "0101")
    with pytest.raises(NotAnswered):
        check.exercise_1(stub)
    with pytest.raises(CheckFailed, match="should be a function"):
        check.exercise_1([0, 1, 2, 3, 0, 1, 2, 3])


def _swap(device, i, j):
    out = list(device)
    out[i], out[j] = out[j], out[i]
    return out


@pytest.mark.parametrize(
    "schedule, needle",
    [
        # a missing action
        ([BREADTH_FIRST[0][:-1], BREADTH_FIRST[1]], "0B0 is missing"),
        # forwards of stage 2 before those of stage 0 on device 0: it can never finish
        (
            [BREADTH_FIRST[0][2:4] + BREADTH_FIRST[0][:2] + BREADTH_FIRST[0][4:], BREADTH_FIRST[1]],
            "deadlock",
        ),  # fmt: skip
        # contiguous placement: stages 0, 1 on device 0 and 2, 3 on device 1
        (
            [
                ["0F0", "0F1", "1F0", "1F1", "1B1", "1B0", "0B1", "0B0"],
                ["2F0", "2F1", "3F0", "3F1", "3B1", "3B0", "2B1", "2B0"],
            ],
            "looping placement",
        ),
        # depth-first on device 1: 3B0 before 3F1
        (
            [BREADTH_FIRST[0], ["1F0", "1F1", "3F0", "3B0", "3F1", "3B1", "1B0", "1B1"]],
            "depth-first",
        ),
        # forwards interleaving stages by micro-batch on device 0 (valid, not breadth-first)
        ([_swap(BREADTH_FIRST[0], 1, 2), BREADTH_FIRST[1]], "mixes its stages"),
        # backward orders that do not match across devices: valid but slower
        ([BREADTH_FIRST[0], BREADTH_FIRST_FIFO[1]], "takes 10.5 units"),
        # not actions
        ([["0F0", "zero"], BREADTH_FIRST[1]], "not an action"),
        ([BREADTH_FIRST[0]], "should have 2 items"),
        ("0F0 0F1", "should be a list"),
        (
            [[*BREADTH_FIRST[0][:4], "2I1", "2W1", *BREADTH_FIRST[0][5:]], BREADTH_FIRST[1]],
            "only forwards",
        ),  # fmt: skip
    ],
)
def test_schedule_exercise_catches_wrong_schedules(schedule, needle):
    with pytest.raises(CheckFailed) as info:
        check.exercise_4(schedule)
    assert not isinstance(info.value, NotAnswered)
    assert needle in str(info.value)
