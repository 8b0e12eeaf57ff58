"""The lesson 05 checks: right answers pass, wrong ones fail kindly, placeholders say so."""

import math

import layoutprograms as progs
import pipeprograms as pipes
import pytest
from checkskit import STUDENTS

from course_utils.checks import CheckFailed, NotAnswered, Variant
from course_utils.checks import l05 as check
from course_utils.checks.wire import Replay, call_outcome, decode, encode
from course_utils.pipeline import CostModel, make_schedule, simulate


def looping_placement(p, v):
    return [list(range(d, p * v, p)) for d in range(p)]


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
    4: (progs.breadth_first,),
    5: ("b", "b", 2),
    6: ("breadth-first", "depth-first", "b"),
    7: (pipes.interleaved,),
}


def test_other_right_forms_pass(capsys):
    check.exercise_1(lambda p, v: tuple(tuple(range(d, p * v, p)) for d in range(p)))
    check.exercise_2(0.109375, 53.25)
    check.exercise_3(" Same ", "DEPTH-FIRST", 24.0)
    check.exercise_6("Breadth-First", "depth-first", "B")
    out = capsys.readouterr().out
    assert out.count("✅") == 4


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
    (2, (0.5, 72), "follows from your `bubble_vs_ideal`"),
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
    (4, (progs.depth_first,), "the depth-first habit"),
    (4, (progs.mixed,), "mixes its stages"),
    (4, (progs.lowest_first,), "from its highest stage down"),
    (4, ([["0F0"]],), "should be a function"),
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


def right_for(variant):
    """Exercises 2-5's right answers from the student's own numbers."""
    p, m, chunks = check.given_2(variant).values()
    bubble = (p - 1) / (chunks * m)
    p3, v3, m3 = check.given_3(variant).values()
    m5, transfer = check.given_5(variant).values()
    spans = {
        c: simulate(make_schedule("interleaved", 4, m5, chunks=c), CostModel(p2p=transfer)).makespan
        for c in (1, 2, 4, 8)
    }
    return {
        2: (bubble, 3 * m * (1 + bubble)),
        3: ("same", "depth-first", m3 * v3),
        4: (progs.breadth_first,),  # one program, run on each student's own pipeline
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
