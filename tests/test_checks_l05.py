"""The lesson 05 checks: right answers pass, wrong ones fail kindly, placeholders say so."""

import math

import pipeprograms as pipes
import pytest
from checkskit import STUDENTS

from course_utils.actions import Action
from course_utils.checks import CheckFailed, NotAnswered, Variant
from course_utils.checks import l05 as check
from course_utils.checks.wire import Replay, call_outcome, decode, encode
from course_utils.pipeline import CostModel, make_schedule, simulate


def looping_placement(p, v):
    return [list(range(d, p * v, p)) for d in range(p)]


# The course's breadth-first order: each stage's backwards last in, first out.
BREADTH_FIRST = [
    ["0F0", "0F1", "2F0", "2F1", "2B1", "2B0", "0B1", "0B0"],
    ["1F0", "1F1", "3F0", "3F1", "3B1", "3B0", "1B1", "1B0"],
]
# What exercise 5.4 asks for: micro-batches backwarded first in, first out, as fast.
BREADTH_FIRST_FIFO = [
    ["0F0", "0F1", "2F0", "2F1", "2B0", "2B1", "0B0", "0B1"],
    ["1F0", "1F1", "3F0", "3F1", "3B0", "3B1", "1B0", "1B1"],
]


def blocks(p, v):  # consecutive stages on one device
    return [list(range(d * v, (d + 1) * v)) for d in range(p)]


def device_of_stage(p, v):  # the other direction: what one library call gives
    return make_schedule("breadth-first", p, 1, chunks=v).device_of_stage()


def too_short(p, v):
    return [[d] for d in range(p - 1)] if p > 1 else []


def off_by_one(p, v):
    return [list(range((d + 1) % p, p * v, p)) for d in range(p)]


def missing_stage(p, v):
    return [list(range(d, p * v - 1, p)) for d in range(p)]


def decreasing(p, v):
    return [sorted(range(d, p * v, p), reverse=True) for d in range(p)]


def crashes(p, v):
    return looping_placement(p, v) if v > 1 else 1 / 0


def stub(p, v):
    raise NotImplementedError()


RIGHT = {
    1: (looping_placement,),
    2: (7 / 64, 53.25),
    3: ("same", "depth-first", 24),
    4: (BREADTH_FIRST_FIFO,),
    5: ("b", "b", 2),
    6: ("breadth-first", "depth-first", "b"),
    7: (pipes.interleaved,),
}


def fifo_breadth_first(p, v, m):
    """Exercise 5.4's answer for any shape: breadth-first, backwards first in, first out."""
    devices = []
    for d in range(p):
        stages = [c * p + d for c in range(v)]
        forwards = [f"{s}F{i}" for s in stages for i in range(m)]
        devices.append(forwards + [f"{s}B{i}" for s in reversed(stages) for i in range(m)])
    return devices


def test_other_right_forms_pass(capsys):
    check.exercise_1(lambda p, v: tuple(tuple(range(d, p * v, p)) for d in range(p)))
    check.exercise_2(0.109375, 53.25)
    check.exercise_3(" Same ", "DEPTH-FIRST", 24.0)
    check.exercise_4([[Action.parse(a) for a in acts] for acts in BREADTH_FIRST_FIFO])
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


def _swap(device, i, j):
    out = list(device)
    out[i], out[j] = out[j], out[i]
    return out


SCHEDULE_WRONG = [
    # the course's order: last in, first out
    (BREADTH_FIRST, "last in, first out"),
    # a missing action
    ([BREADTH_FIRST_FIFO[0][:-1], BREADTH_FIRST_FIFO[1]], "0B1 is missing"),
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
    # forwards of device 1 in reverse micro-batch order: valid, breadth-first, but slower
    (
        [BREADTH_FIRST_FIFO[0], ["1F1", "1F0", "3F1", "3F0", *BREADTH_FIRST_FIFO[1][4:]]],
        "takes",
    ),
    # not actions
    ([["0F0", "zero"], BREADTH_FIRST[1]], "not an action"),
    ([BREADTH_FIRST[0]], "should have 2 items"),
    ("0F0 0F1", "should be a list"),
    (
        [[*BREADTH_FIRST[0][:4], "2I1", "2W1", *BREADTH_FIRST[0][5:]], BREADTH_FIRST[1]],
        "only forwards",
    ),  # fmt: skip
]

WRONG = [  # (exercise, arguments, words the hint must contain)
    (2, (7 / 16, 53.25), "without chunks"),
    (2, (7 / 71, 53.25), "whole step"),
    (2, (31 / 64, 53.25), "last DEVICE"),
    (2, (0.5, 53.25), "not right yet"),
    (2, (7 / 64, 48), "ideal time"),
    (2, (7 / 64, 69), "unchunked"),
    (2, (7 / 64, 60), "`step_time` is not"),
    (2, (0.11, 53.25), "close: give 3 significant figures"),
    (2, (10.9375, 53.25), "percentage"),
    (2, (math.nan, 53.25), "NaN"),
    (2, ("7/64", 53.25), "without quotes"),
    (3, ("depth-first", "depth-first", 24), "same p - 1 hops"),
    (3, ("breadth-first", "depth-first", 24), "same p - 1 hops"),
    (3, ("same", "breadth-first", 24), "first backward"),
    (3, ("same", "same", 24), "first backward"),
    (3, ("same", "depth-first", 12), "whole micro-batches"),
    (3, ("same", "depth-first", 11), "depth-first peak"),
    (3, ("same", "depth-first", 48), "not right"),
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
    (1, (blocks,), "gives each device a block of consecutive stages"),
    (1, (device_of_stage,), "returned the device of each stage: that is the other direction"),
    (1, (lambda p, v: [s % p for s in range(p * v)],), "that is the other direction"),
    (1, (too_short,), "entries; it needs one per device (4)"),
    (1, (off_by_one,), "which is not looping placement"),
    (1, (missing_stage,), "does not hand out each of the 8 stages 0..7 exactly once"),
    (1, (decreasing,), "list each device's stages in increasing order"),
    (1, (lambda p, v: [[0, 1], "x", [], []],), "`looping_placement(4, 2)[1]` should be a list"),
    *[(4, (schedule,), needle) for schedule, needle in SCHEDULE_WRONG],
    *((7, (wrong,), words) for wrong, words in {**pipes.MISTAKES_57, **pipes.OTHERS_57}.items()),
    (7, pipes.reordered(check, 7, "interleaved_program", pipes.interleaved), "1F1B's is"),
]


def test_placement_exercise_catches_wrong_functions():
    with pytest.raises(CheckFailed, match="like cards"):
        check.exercise_1(blocks)
    with pytest.raises(CheckFailed, match="other direction"):
        check.exercise_1(device_of_stage)
    with pytest.raises(CheckFailed, match="other direction"):
        check.exercise_1(lambda p, v: [s % p for s in range(p * v)])
    with pytest.raises(CheckFailed, match="one per device"):
        check.exercise_1(too_short)
    with pytest.raises(CheckFailed, match="not looping placement|exactly once"):
        check.exercise_1(off_by_one)
    with pytest.raises(CheckFailed, match="exactly once"):
        check.exercise_1(missing_stage)
    with pytest.raises(CheckFailed, match="increasing order"):
        check.exercise_1(decreasing)
    with pytest.raises(CheckFailed, match="ZeroDivisionError"):
        check.exercise_1(crashes)
    with pytest.raises(CheckFailed, match="should be a list"):
        check.exercise_1(lambda p, v: "0101")
    with pytest.raises(NotAnswered):
        check.exercise_1(stub)
    with pytest.raises(CheckFailed, match="should be a function"):
        check.exercise_1([0, 1, 2, 3, 0, 1, 2, 3])


def test_placement_exercise_is_judged_on_replayed_calls(capsys):
    variant = Variant("s7", cases_seed="grader")
    cases = check.cases_1(variant)["looping_placement"]
    assert cases == check.cases_1(Variant("s7", cases_seed="grader"))["looping_placement"]
    outcomes = [call_outcome(looping_placement, decode(encode(tuple(c))), 5) for c in cases]
    check.exercise_1(Replay("looping_placement", cases, outcomes), variant=variant)
    assert capsys.readouterr().out.startswith("✅")


@pytest.mark.parametrize("schedule, needle", SCHEDULE_WRONG)
def test_schedule_exercise_catches_wrong_schedules(schedule, needle):
    with pytest.raises(CheckFailed) as info:
        check.exercise_4(schedule)
    assert not isinstance(info.value, NotAnswered)
    assert needle in str(info.value)


def right_for(variant):
    """Exercises 2-5's right answers from the student's own numbers."""
    p, m, chunks = check.given_2(variant).values()
    bubble = (p - 1) / (chunks * m)
    p3, v3, m3 = check.given_3(variant).values()
    _, v4, m4 = check.given_4(variant).values()
    m5, transfer = check.given_5(variant).values()
    spans = {
        c: simulate(make_schedule("interleaved", 4, m5, chunks=c), CostModel(p2p=transfer)).makespan
        for c in (1, 2, 4, 8)
    }
    return {
        2: (bubble, 3 * m * (1 + bubble)),
        3: ("same", "depth-first", m3 * v3),
        4: (fifo_breadth_first(2, v4, m4),),
        5: ("b", "b", min(spans, key=spans.get)),
        7: (pipes.interleaved,),
    }


@pytest.mark.parametrize("student", ["default", *STUDENTS])
def test_given_numbers_agree_with_the_simulator(student):
    v = Variant(student)
    p, m, chunks = check.given_2(v).values()
    span = simulate(make_schedule("interleaved", p, m, chunks=chunks)).makespan
    assert span == pytest.approx(right_for(v)[2][1])
    p3, v3, m3 = check.given_3(v).values()
    depth, breadth = (
        simulate(make_schedule(n, p3, m3, chunks=v3)) for n in ("interleaved", "breadth-first")
    )
    assert depth.makespan == pytest.approx(breadth.makespan)  # "same" bubble
    assert depth.peak_activations[0] < breadth.peak_activations[0] == m3 * v3
    m5, transfer = check.given_5(v).values()
    slow = CostModel(p2p=transfer)
    one_f = simulate(make_schedule("1f1b", 4, m5), slow).makespan
    assert simulate(make_schedule("interleaved", 4, m5, chunks=8), slow).makespan > one_f
