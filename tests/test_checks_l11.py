"""The lesson 11 checks: right answers pass, wrong ones fail kindly, placeholders say so."""

import layoutprograms as progs
import pytest
import zbvprograms as zbv
from checkskit import STUDENTS

from course_utils.checks import Variant
from course_utils.checks import l11 as check
from course_utils.pipeline import simulate
from course_utils.pipeline.vshape import (
    chunk_costs,
    dualpipe_v_formula_holds,
    dualpipe_v_idle,
    zb_v,
    zb_v_formula_holds,
)


def extra_culprit_time() -> float:
    g = check.given_5(Variant("default"))
    right = simulate(zb_v(g["p"], g["m"]), chunk_costs(g["F"], g["I"], g["W"]))
    return check.their_timeline().makespan - right.makespan


RIGHT = {
    1: ([[0, 7], [1, 6], [2, 5], [3, 4]], 0),
    2: (zbv.RIGHT,),
    3: (progs.v_gpipe,),
    4: (6, 14, 12),
    5: (2, extra_culprit_time(), "a"),
    6: (7.2, 2.4, 9),
}

WRONG = [
    (1, ([[0, 4], [1, 5], [2, 6], [3, 7]], 0), "looping placement"),
    (1, ([[7, 0], [6, 1], [5, 2], [4, 3]], 0), "increasing order"),
    (1, ([[0, 7], [1, 6], [2, 5], [3, 4]], 3), "bottom of the V"),
    (1, ([[0, 7], [1, 6], [2, 5]], 0), "one per device"),
    (1, ([[0, 1], [2, 3], [4, 5], [6, 7]], 0), "not a V"),
    (2, (zbv.WHOLE,), "a whole backward"),
    (2, (zbv.W_IN_I,), "computed W with it"),
    (2, (zbv.W_FIRST,), "before its I"),
    (2, (zbv.EAGER_W,), "Every W ran straight after its I"),
    (2, (zbv.W_AT_END,), "left all its W's to the end"),
    (2, (zbv.TURN_MESSAGE,), "the turn is no message"),
    (2, (zbv.NO_STASH,), "take turns on it"),
    (2, ("zb_v_program",), "should be a function"),
    (3, (progs.looping,), "looping placement"),
    (3, (progs.turn_sent,), "the turn is no message"),
    (3, (progs.down_first,), "up chunk's backwards before its down chunk's"),
    (3, (progs.not_detached,), "got no gradient from its up chunk"),
    (3, (lambda ctx: 42,), "marked no forward"),
    (3, ("v_gpipe_program",), "should be a function"),
    (4, (3, 14, 12), "forward only"),
    (4, (6, 14, 14), "stays inside a device"),
    (4, (6, 12, 12), "two neighbouring stages"),
    (4, (6, 16, 12), "one boundary too many"),
    (5, (0, 3.0, "a"), "ZB-V's own order"),
    (5, (2, 6.0, "a"), "subtract ZB-V's makespan"),
    (5, (2, 3.0, "b"), "does not shrink with m"),
    (5, (2, 3.0, "d"), "already does"),
    (5, (9, 3.0, "a"), "device number"),
    (6, (3.0, 2.4, 9), "ZB-V's idle time"),
    # the course's early-send variant, (p-1)(F+I-W): the lesson's reference sends at slot end
    (6, (4.2, 2.4, 9), "early-send variant"),
    (6, (14.4, 2.4, 9), "PP/2 - 1 is p - 1"),
    (6, (6.0, 2.4, 9), "(PP/2 - 1)(F&B + B - 3W)"),
    (6, (7.2, 1 / 2.4, 9), "upside down"),
    (6, (7.2, 4.2, 9), "difference"),
    (6, (7.2, 3.0, 9), "divide DualPipeV's idle time by ZB-V's"),
    (6, (6.0, 2.0, 9), "divides your `dualpipe_idle`"),
    (6, (7.2, 2.4, 8), "ZB-V's peak"),
    (6, (7.2, 2.4, 10), "fullest moment"),
    # 11.5: picking device 0 for its W-after-I habit is answered with what proves nothing
    (5, (0, 3.0, "a"), "ZB-V's own device 0 runs every W that way"),
    (1, ([[0, 1, 7], [6], [2, 5], [3, 4]], 0), "every device holds exactly two stages"),
    (1, ([[0, 7], [1, 6], [2, 5], [3, 3]], 0), "exactly once"),
    (1, ([[0, 7], [1, 6], [2, 5], [3, 4]], 2), "which device holds the last stage"),
    (4, (5, 14, 12), "Count the boundaries between neighbouring stages"),
    (5, (2, 54.0, "a"), "is their makespan"),
    (5, (2, 1.0, "a"), "their makespan minus the makespan of zb_v"),
    (5, (2, 3.0, "c"), "Looping placement changes where the stages live"),
]


def test_the_default_numbers_are_the_lessons():
    assert extra_culprit_time() == pytest.approx(3.0)
    assert check.given_2() == {"p": 3, "m": 6} and check.given_6() == {
        "p": 4,
        "m": 8,
        "F": 1.0,
        "I": 1.0,
        "W": 0.6,
    }


def right_for(v: Variant) -> dict:
    """Each exercise with per-student numbers: its right answer for student v, computed here."""
    p1 = check.given_1(v)["p"]
    p4 = check.given_4(v)["p"]
    g5 = check.given_5(v)
    theirs = check.their_timeline(v)
    right5 = simulate(zb_v(g5["p"], g5["m"]), chunk_costs(g5["F"], g5["I"], g5["W"]))
    culprit = next(
        d
        for d, row in enumerate(check.their_schedule(v).devices)
        if list(row) != list(zb_v(g5["p"], g5["m"]).devices[d])
    )
    g6 = check.given_6(v)
    idle6 = dualpipe_v_idle(g6["p"], g6["F"], g6["I"], g6["W"])
    zbv6 = (g6["p"] - 1) * g6["I"]
    return {
        1: ([[d, 2 * p1 - 1 - d] for d in range(p1)], 0),
        2: (zbv.RIGHT,),  # one program for every student, run on their own V
        3: (progs.v_gpipe,),  # one program for every student, run on their own V
        4: (2 * (p4 - 1), 2 * (2 * p4 - 1), 4 * (p4 - 1)),
        5: (culprit, theirs.makespan - right5.makespan, "a"),
        6: (idle6, idle6 / zbv6, 2 * g6["p"] + 1),
    }


def test_every_variant_keeps_the_exercises_sensible():
    seen = {k: set() for k in (1, 2, 4, 5, 6)}  # 2: the V's shape
    for student in ["default", *STUDENTS, "erin"]:
        v = Variant(student)
        for k in seen:
            seen[k].add(repr(getattr(check, f"given_{k}")(v)))
        g6 = check.given_6(v)
        assert zb_v_formula_holds(*g6.values()) and dualpipe_v_formula_holds(*g6.values())
        answers = right_for(v)
        assert answers[5][1] > 0  # the culprit really costs time
        assert 0 < answers[5][0] < check.given_5(v)["p"]
    assert all(len(s) >= 3 for s in seen.values())
    ratios = {right_for(Variant(s))[6][1] for s in ["default", *STUDENTS, "erin"]}
    assert len(ratios) >= 3  # the comparison is not always the same answer


def test_11_2_card_shows_the_runs_idle_time_beside_the_formula():
    """The printed run answers the old question (ZB-V's bubble) from the learner's own order;
    an order with every W left to the end shows more idle time than the formula."""
    from course_utils.checks.pipeline_cases import VSplitCase, zb_v_card

    case = VSplitCase(devices=3, chunks=2, microbatches=5, batch=5, hidden=8, depth=6, seed=3)
    right = zb_v_card(case.run(zbv.RIGHT), case).splitlines()
    assert right[2].split()[1:4] == ["[2.0,", "2.0,", "2.0]"] and "(p-1) I = 2 units" in right[4]
    late = zb_v_card(case.run(zbv.W_AT_END), case).splitlines()
    assert late[2].split()[1] != "[2.0," and "34 units" in late[2]
