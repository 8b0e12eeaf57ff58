"""The lesson 07 checks: right answers pass, wrong ones fail kindly, placeholders say so."""

import math

import dpprograms as dp
import pytest
import splitprograms as sp
from checkskit import STUDENTS

from course_utils.checks import NotAnswered, Variant
from course_utils.checks import l07 as check

TP8 = next(Variant(s) for s in ("s1", "s7", "alice", "bob") if check.given_2(Variant(s))["tp"] == 8)


def _size_2(v):
    g = check.given_2(v)
    return g["sequences"] * g["tokens"] * g["d_model"] * 2


RIGHT = {
    1: (sp.column,),
    2: ("all-reduce", 37_748_736),
    3: (23.75, 14.375, 5.0),
    4: (4, 2, 4),
    5: (sp.grid,),
    6: ("b", "b"),
    7: (2.5, 1 / 3),
    8: (dp.tp,),
}


@pytest.mark.parametrize("layout", [(8, 1, 4), (4, 2, 4), (2, 4, 4)])
def test_every_valid_layout_passes(layout, capsys):
    check.exercise_4(*layout)
    assert capsys.readouterr().out.startswith("✅")


def test_other_spellings_pass(capsys):
    check.exercise_2(" All-Reduce ", 37_748_736.0)
    check.exercise_7(2.5, 0.3333)
    check.exercise_3(23.75, 14.375, 5)
    assert capsys.readouterr().out.count("✅") == 3


@pytest.mark.parametrize("k", [k for k in sorted(RIGHT) if len(RIGHT[k]) > 1])
def test_partly_answered_is_not_answered(k):
    args = list(RIGHT[k])
    args[-1] = None
    with pytest.raises(NotAnswered):
        getattr(check, f"exercise_{k}")(*args)


S = 4 * 1024 * 3072 * 2  # the tensor of exercise 7.2, in bytes


WRONG = [  # (exercise, arguments, words the hint must contain)
    *((8, (wrong,), words) for wrong, words in dp.MISTAKES["tp"].items()),
    (8, (dp.tp_no_f,), "no all-reduce in the backward"),
    (8, (dp.tp_mean,), "the mean of the partial outputs"),
    (8, (dp.tp_skips_on_rank1,), "one in g's forward, one in f's backward"),
    (8, (dp.tp_f_forward_too,), "2 all-reduces in the forward"),
    (8, (dp.tp_relu,), "not the unsplit MLP's output"),
    (8, (dp.tp_f_mean,), "input gradient is not the unsplit MLP's"),
    (8, (dp.tp_detached_w1,), "gradient of its `w1`"),
    (8, ("tp_mlp",), "should be a function"),
    (2, ("all-gather", 1.5 * S), "partial sum"),
    (2, ("reduce-scatter", 1.5 * S), "whole Y"),
    (2, ("broadcast", 1.5 * S), "no single"),
    (2, ("none", 1.5 * S), "their sum"),
    (2, ("allreduce", 1.5 * S), "should be one of"),
    (2, ("all-reduce", S), "2(N-1)/N"),
    (2, ("all-reduce", 0.75 * S), "one of the two phases"),
    (2, ("all-reduce", 3 * S), "bytes per value"),
    (2, ("all-reduce", 6 * S), "per device"),
    (2, ("all-reduce", 37.7), "in bytes"),
    (2, ("all-reduce", 1e8), "sequences x tokens"),
    (2, ("all-reduce", math.nan), "NaN"),
    (2, ("all-reduce", "37748736"), "without quotes"),
    (3, (80, 14.375, 5), "plain data parallelism"),
    (3, (5, 14.375, 5), "value of ZeRO-3"),
    (3, (23.75e9, 14.375, 5), "looks like bytes"),
    (3, (23.75 / 1.073741824, 14.375, 5), "GiB"),
    (3, (3.75, 14.375, 5), "ZeRO-1 divides the optimizer state"),
    (3, (23.75, 23.75, 5), "value of ZeRO-1"),
    (3, (23.75, 13.75, 5), "ZeRO-2 divides the optimizer state and the gradients"),
    (3, (23.75, 14.375, 20), "ZeRO-3 divides everything (weights"),
    (4, (4, 2, 2), "use all of them"),
    (4, (16, 1, 2), "more than one node"),
    (4, (1, 32, 1), "does not divide the 48 layers"),
    (4, (2, 2, 8), "over the 40 GB budget"),
    (4, (1, 8, 4), "bubble"),
    (4, (4, 4, 2), "smallest tp x pp"),
    (4, (0, 8, 4), "at least 1"),
    (4, (4.5, 2, 4), "whole number"),
    (6, ("a", "b"), "bubble bars"),
    (6, ("c", "b"), "dp = 1"),
    (6, ("d", "b"), "went down"),
    (6, ("b", "a"), "not what grew"),
    (6, ("b", "c"), "even more nodes"),
    (6, ("b", "d"), "memory is not the problem"),
    (6, ("e", "b"), "should be one of"),
    (7, (8, 1 / 3), "without recomputation"),
    (7, (2.0, 1 / 3), "segment inputs"),
    (7, (0.5, 1 / 3), "alive again"),
    (7, (3.0, 1 / 3), "peak of the backward"),
    (7, (2.5, 4 / 3), "subtract"),
    (7, (2.5, 1.0), "double"),
    (7, (2.5, 0.5), "relative to what"),
    (7, (2.5, 0.1), "once more"),
    # with tp = 4, (N-1) x size is also twice the answer; another student's tp = 8 tells apart
    (2, ("all-reduce", 7 * _size_2(TP8), TP8), "what rank 0 sends in the naive all-reduce"),
]


def right_for(v: Variant) -> dict:
    """Each exercise with per-student numbers: its right answer for student v, computed here."""
    g2, g3, g7 = check.given_2(v), check.given_3(v), check.given_7(v)
    size = g2["sequences"] * g2["tokens"] * g2["d_model"] * 2
    psi, n = g3["params"], g3["dp"]
    k = g7["segments"]
    return {
        2: ("all-reduce", 2 * (g2["tp"] - 1) / g2["tp"] * size),
        3: ((4 * psi + 12 * psi / n) / 1e9, (2 * psi + 14 * psi / n) / 1e9, 16 * psi / n / 1e9),
        7: (k * g7["input_gb"] + g7["layers"] // k * g7["block_gb"], 1 / 3),
        8: (dp.tp,),  # the same program for everybody, tried on their numbers
        1: (sp.column,),
        5: (sp.grid,),
    }


def test_every_variant_keeps_the_exercises_sensible():
    seen = {k: set() for k in (2, 3, 7)}
    for student in ["default", *STUDENTS, "erin"]:
        v = Variant(student)
        for k in seen:
            seen[k].add(repr(getattr(check, f"given_{k}")(v)))
        g7 = check.given_7(v)
        assert g7["layers"] % g7["segments"] == 0  # whole segments
        assert (
            g7["segments"] * g7["input_gb"] + g7["layers"] // g7["segments"] * g7["block_gb"]
            < g7["layers"] * g7["block_gb"]
        )  # recomputation saves memory
        assert check.given_2(v)["tp"] > 1 and check.given_3(v)["dp"] > 1
    assert all(len(s) >= 3 for s in seen.values())


def test_build_inputs_follow_the_cases_seed():
    a, b = Variant("s7", cases_seed=3), Variant("s7", cases_seed=4)
    assert repr(check.cases_1(a)) == repr(check.cases_1(a))
    assert repr(check.cases_1(a)) != repr(check.cases_1(b))
    assert check.cases_5(a) == check.cases_5(a) != check.cases_5(b)
    cases = [case for (case,) in check.cases_1(a)["column_parallel"]]
    assert cases[0].d_out % cases[0].devices == 0  # the learner's: rows tell from columns
    assert all(case.d_out % case.devices for case in cases[1:])  # uneven blocks
