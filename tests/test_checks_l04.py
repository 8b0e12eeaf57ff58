"""The lesson 04 checks: right answers pass, wrong ones fail kindly, placeholders say so."""

import math

import pipeprograms as pipes
import pytest
import roundprograms as rp
from checkskit import STUDENTS

from course_utils.checks import CheckFailed, NotAnswered, Variant
from course_utils.checks import l04 as check
from course_utils.checks.wire import Replay, call_outcome, decode, encode
from course_utils.pipeline import CostModel, make_schedule, simulate


def one_f_one_b(p, m, d):
    warmup = min(p - 1 - d, m)
    first = [f"{d}F{i}" for i in range(warmup)]
    steady = []
    for i in range(m - warmup):
        steady += [f"{d}F{warmup + i}", f"{d}B{i}"]
    return first, steady, [f"{d}B{i}" for i in range(m - warmup, m)]


def gpipe_order(p, m, d):
    return [f"{d}F{i}" for i in range(m)], [], [f"{d}B{i}" for i in range(m)]


def warmup_ignores_small_m(p, m, d):
    warmup = p - 1 - d  # forgets min(..., m): forwards of micro-batches that do not exist
    first = [f"{d}F{i}" for i in range(warmup)]
    steady = [a for i in range(m - warmup) for a in (f"{d}F{warmup + i}", f"{d}B{i}")]
    return first, steady, [f"{d}B{i}" for i in range(max(0, m - warmup), m)]


def one_short_warmup(p, m, d):
    warmup = max(0, min(p - 2 - d, m))
    first = [f"{d}F{i}" for i in range(warmup)]
    steady = [a for i in range(m - warmup) for a in (f"{d}F{warmup + i}", f"{d}B{i}")]
    return first, steady, [f"{d}B{i}" for i in range(m - warmup, m)]


def newest_backward_first(p, m, d):
    order = _flat(one_f_one_b)(p, m, d)
    backs = iter(reversed([a for a in order if "B" in a]))
    order = [next(backs) if "B" in a else a for a in order]
    return [], order, []


def wrong_stage(p, m, d):
    parts = one_f_one_b(p, m, d)
    return tuple([a.replace(f"{d}", f"{d + 1}", 1) for a in part] for part in parts)


def forward_only(p, m, d):
    return [f"{d}F{i}" for i in range(m)], [], []


def phases_cut_wrong(p, m, d):  # the right order, with the first steady forward in the warm-up
    first, steady, cool = one_f_one_b(p, m, d)
    return first + steady[:1], steady[1:], cool


def stub(p, m, d):
    raise NotImplementedError()


def crashes(p, m, d):
    return one_f_one_b(p, m, d) if p > 1 else 1 / 0


def not_actions(p, m, d):
    return ["forward"] * m, [], ["backward"] * m


def two_lists(p, m, d):
    first, steady, cool = one_f_one_b(p, m, d)
    return first, steady + cool


def library(p, m, d):  # one call of the course's schedule: the flat order, not the phases
    return [str(a) for a in make_schedule("1f1b", p, m).devices[d]]


RIGHT = {
    1: ([12] * 5, [5, 4, 3, 2, 1]),
    2: (one_f_one_b,),
    3: (27, 27.0, 1 / 3),
    4: (rp.zb_h1,),
    5: ("b", "c"),
    6: ("B", " c "),
    7: (pipes.one_f_one_b,),
}


WRONG = [  # (exercise, arguments, words the hint must contain)
    (1, ([5] * 5, [5, 4, 3, 2, 1]), "starts backwards"),
    (1, ([5, 4, 3, 2, 1], [5, 4, 3, 2, 1]), "starts backwards"),
    (1, ([8] * 5, [5, 4, 3, 2, 1]), "every forward"),
    (1, ([12] * 5, [12] * 5), "copies it"),
    (1, ([12] * 5, [1, 2, 3, 4, 5]), "waits longest"),
    (1, ([12] * 5, [4, 3, 2, 1, 0]), "one short"),
    (1, ([12] * 5, [6, 5, 4, 3, 2]), "one too many"),
    (1, ([12] * 5, [5] * 5), "fewer warm-up"),
    (1, ([12] * 5, [5, 5, 3, 2, 1]), "For device d"),
    (1, ([12] * 4, [5, 4, 3, 2, 1]), "should have 5 items"),
    (1, ([12] * 5, [5, 4, 3, 2, -1]), "cannot be negative"),
    (1, ([12] * 5, [5, 4, 3, 2, 1.5]), "whole number"),
    (1, ("12 12 12 12 12", [5, 4, 3, 2, 1]), "should be a list"),
    (3, (18, 27, 1 / 3), "busy time"),
    (3, (30, 27, 1 / 3), "one slot too many"),
    (3, (35, 27, 1 / 3), "fill and"),
    (3, (27, 18, 1 / 3), "too short"),
    (3, (27, 30, 1 / 3), "one slot too many"),
    (3, (27, 33, 1 / 3), "compare the two"),
    (3, (27, 27, 0.5), "relative to the busy"),
    (3, (27, 27, 0.25), "idle time of a device"),
    (3, (27, 27, 0.33), "close: give 3 significant figures"),
    (3, (27, 27, 0.3), "close: give 3 significant figures"),
    (3, (27, 27, 33.3), "percentage"),
    (3, (27, 27, 9), "between 0 and 1"),
    (3, (27, 27, math.nan), "NaN"),
    (3, ("27", 27, 1 / 3), "without quotes"),
    (4, (rp.w_with_i,), "computed W with it"),
    (4, (rp.w_first,), "before its I"),
    (4, (rp.no_retain,), "retain_graph=True"),
    (4, (rp.w_right_after,), "1F1B with its backward cut in two"),
    (4, (rp.w_at_the_end,), "a W put off longer than the gaps it fills"),
    (4, (rp.whole_backward,), "a whole backward"),
    (4, (rp.waits_first_zb,), "Follow micro-batch 0 through your program"),
    (4, (rp.mixed_zb,), "every rank runs its forwards in micro-batch order"),
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
    (2, (library,), "returned one flat list of actions"),
    (2, (lambda p, m, d: 5,), "`the result of one_f_one_b(4, 8, 0)` should be a list"),
    (2, (two_lists,), "returned 2 items. Return three lists"),
    (2, (not_actions,), "which is not an action"),
    (2, (phases_cut_wrong,), "has the right order, cut into phases at the wrong places"),
    (2, (forward_only,), "runs one forward and one backward for each of the 8 micro-batches"),
    (2, (wrong_stage,), "does not contain exactly one F and one B of stage"),
    (2, (gpipe_order,), "forwards before its first backward: too many"),
    (2, (one_short_warmup,), "forwards before its first backward: too few"),
    (2, (newest_backward_first,), "starts well but goes wrong at position"),
    *((7, (wrong,), words) for wrong, words in {**pipes.MISTAKES_7, **pipes.OTHERS_7}.items()),
]


def _flat(fn):
    def flat(p, m, d):
        return [a for part in fn(p, m, d) for a in part]

    return flat


def test_build_exercise_catches_wrong_functions():
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
    with pytest.raises(CheckFailed, match="cut into phases at the wrong places"):
        check.exercise_2(phases_cut_wrong)
    with pytest.raises(CheckFailed, match="flat list"):
        check.exercise_2(library)
    with pytest.raises(CheckFailed, match="returned 2 items"):
        check.exercise_2(two_lists)
    with pytest.raises(NotAnswered):
        check.exercise_2(stub)
    with pytest.raises(CheckFailed, match="ZeroDivisionError"):
        check.exercise_2(crashes)
    with pytest.raises(CheckFailed, match="not an action"):
        check.exercise_2(not_actions)
    with pytest.raises(CheckFailed, match="should be a function"):
        check.exercise_2("F F F B F B")


def test_build_exercise_phases_agree_with_the_course_schedule():
    for p in range(1, 9):
        for m in range(1, 12):
            for d in range(p):
                flat = _flat(check.phases)(p, m, d)
                assert flat == [str(a) for a in make_schedule("1f1b", p, m).devices[d]]


def test_build_exercise_accepts_action_values(capsys):
    from course_utils.actions import Action

    def as_actions(p, m, d):
        return tuple([Action.parse(a) for a in part] for part in one_f_one_b(p, m, d))

    check.exercise_2(as_actions)
    assert capsys.readouterr().out.startswith("✅")


def test_build_exercise_is_judged_on_replayed_calls(capsys):
    """The grader draws the cases, the learner's kernel answers them, the check replays."""
    variant = Variant("s7", cases_seed="grader")
    cases = check.cases_2(variant)["one_f_one_b"]
    assert cases == check.cases_2(Variant("s7", cases_seed="grader"))["one_f_one_b"]
    outcomes = [call_outcome(one_f_one_b, decode(encode(tuple(c))), limit_s=5) for c in cases]
    check.exercise_2(Replay("one_f_one_b", cases, outcomes), variant=variant)
    assert capsys.readouterr().out.startswith("✅")


def right_for(v):
    """The right answers of exercises 1, 3, 4 computed from the student's own numbers."""
    g1, g3 = check.given_1(v), check.given_3(v)
    p, m = g1["p"], g1["m"]
    p3, m3 = g3["p"], g3["m"]
    span = (m3 + p3 - 1) * (g3["t_f"] + g3["t_b"])
    return {
        1: ([m] * p, [min(m, p - d) for d in range(p)]),
        3: (span, span, (p3 - 1) / (m3 + p3 - 1)),
        4: (rp.zb_h1,),
        7: (pipes.one_f_one_b,),
    }


@pytest.mark.parametrize("student", ["default", *STUDENTS])
def test_given_numbers_agree_with_the_simulator(student):
    v = Variant(student)
    g3 = check.given_3(v)
    for name in ("gpipe", "1f1b"):
        timeline = simulate(make_schedule(name, g3["p"], g3["m"]), CostModel(g3["t_f"], g3["t_b"]))
        assert timeline.makespan == pytest.approx(right_for(v)[3][0])
