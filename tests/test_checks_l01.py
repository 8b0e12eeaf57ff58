"""The lesson 01 checks: right answers pass, wrong ones fail kindly, placeholders say so."""

import math

import pytest

from course_utils.checks import CheckFailed, NotAnswered
from course_utils.checks import l01 as check


def solution_state(num_params, precision):
    per = {"fp32": (4, 4, 8), "mixed": (2, 2, 12)}[precision]
    return dict(
        zip(("parameters", "gradients", "optimizer"), (num_params * b for b in per), strict=True)
    )


RIGHT = {
    1: (112,),
    2: (solution_state,),
    3: (8,),
    4: (0.25, 1.0),
    5: ("b", "a"),
    6: ("tensor", "pipeline"),
}


WRONG = [  # (exercise, arguments, words the hint must contain)
    (1, (28,), "only the parameters"),
    (1, (56,), "Adam"),
    (1, (84,), "two running averages"),
    (1, (112e9,), "unit"),
    (1, (3,), "bytes per parameter"),
    (1, ("112",), "without quotes"),
    (1, (math.nan,), "NaN"),
    (3, (6,), "activations"),
    (3, (2,), "16-bit weights"),
    (3, (16,), "fewest"),
    (3, (7.5,), "whole number"),
    (4, (0.75, 1.0), "idle fraction"),
    (4, (0.5, 1.0), "staircase"),
    (4, (0.25, 4.0), "speedup"),
    (4, (1.5, 1.0), "between 0 and 1"),
    (5, ("a", "a"), "imbalance"),
    (5, ("b", "b"), "fix"),
    (5, ("e", "a"), "should be one of"),
    (6, ("pipeline", "pipeline"), "single layer"),
    (6, ("tensor", "tensor"), "scenario_b"),
    (6, (1, "pipeline"), "should be one of"),
]


def test_build_exercise_catches_wrong_functions():
    def mixed_as_fp32(n, precision):
        return solution_state(n, "fp32")

    def broken(n, precision):
        return {"parameters": 1 / 0}

    def no_dict(n, precision):
        return 16 * n

    def stub(n, precision):
        raise NotImplementedError()

    with pytest.raises(CheckFailed, match="optimizer|parameters"):
        check.exercise_2(mixed_as_fp32)
    with pytest.raises(CheckFailed, match="ZeroDivisionError"):
        check.exercise_2(broken)
    with pytest.raises(CheckFailed, match="should return a dict"):
        check.exercise_2(no_dict)
    with pytest.raises(NotAnswered):
        check.exercise_2(stub)
    with pytest.raises(CheckFailed, match="should be a function"):
        check.exercise_2(42)


def test_build_exercise_names_missing_key():
    def missing(n, precision):
        state = solution_state(n, precision)
        del state["optimizer"]
        return state

    with pytest.raises(CheckFailed, match="no key 'optimizer'"):
        check.exercise_2(missing)
