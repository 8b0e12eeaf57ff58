"""The lesson 12 checks: right answers pass, wrong ones fail kindly, placeholders say so."""

import math

import pytest

from course_utils import plan
from course_utils.checks import CheckFailed, NotAnswered
from course_utils.checks import l12 as check


def min_gpus_to_fit(params, gpu_memory_gib, reserve_gib):
    return math.ceil(16 * params / ((gpu_memory_gib - reserve_gib) * plan.GIB))


def best(hardware):
    return plan.search(plan.MODEL_PRESETS["30B"], 32, 256, hardware)["feasible"][0].config


RIGHT = {
    1: (3,),
    2: (min_gpus_to_fit, "c"),
    3: ("b", "b"),
    4: ("tp_comm", "b"),
    5: (*check.cross_cluster_times(), "pp"),
    6: (best(check.OLD_HARDWARE), best(check.NEW_HARDWARE)),
    7: ("activations", 2**16, "b"),
}


def stub(*args):
    raise NotImplementedError()


def one_byte(params, gpu_memory_gib, reserve_gib):
    return math.ceil(params / ((gpu_memory_gib - reserve_gib) * plan.GIB))


def no_reserve(params, gpu_memory_gib, reserve_gib):
    return math.ceil(16 * params / (gpu_memory_gib * plan.GIB))


def floor_division(params, gpu_memory_gib, reserve_gib):
    return math.floor(16 * params / ((gpu_memory_gib - reserve_gib) * plan.GIB))


def broken(params, gpu_memory_gib, reserve_gib):
    return params / 0


DP, PP = check.cross_cluster_times()
OLD, NEW = RIGHT[6]


WRONG = [  # (exercise, arguments, words the hint must contain)
    (1, (2,), "60 GiB budget"),
    (1, (0,), "unsharded"),
    (1, (5,), "0, 1, 2 or 3"),
    (1, (2.5,), "whole number"),
    (1, ("three",), "without quotes"),
    (1, (math.nan,), "NaN"),
    (2, (one_byte, "c"), "bytes per parameter"),
    (2, (no_reserve, "c"), "reserve"),
    (2, (floor_division, "c"), "round up"),
    (2, (broken, "c"), "ZeroDivisionError"),
    (2, (min_gpus_to_fit, "a"), "ZeRO-3 already"),
    (2, (min_gpus_to_fit, "z"), "should be one of"),
    (2, (15, "c"), "should be a function"),
    (3, ("a", "a"), "middle of the step"),
    (3, ("b", "a"), "fix does not remove"),
    (3, ("d", "b"), "no data parallelism"),
    (4, ("compute", "b"), "grew the most"),
    (4, ("tp_comm", "a"), "extra GPUs"),
    (4, ("network", "b"), "should be one of"),
    (5, (2 * DP, PP, "pp"), "twice too big"),
    (5, (DP, PP / 2, "pp"), "backward pass"),
    (5, (DP, PP * 8, "pp"), "1/tp slice"),
    (5, (DP, PP, "dp"), "fewer bytes"),
    (5, (math.inf, PP, "pp"), "infinite"),
    (6, (NEW, NEW), "does not fit"),
    (6, ({"tp": 8}, NEW), "32 GPUs"),
    (6, (OLD, plan.replace_config(NEW, recompute="full")), "not the fastest"),
    (6, ("tp=2", NEW), "plan.Config"),
    (6, (OLD, plan.replace_config(NEW, tp=3, dp=1)), "not a valid layout"),
    (7, ("model states", 2**16, "b"), "Which total got smaller"),
    (7, ("both", 2**16, "b"), "Which total got smaller"),
    (7, ("activations", 2**10, "b"), "too small"),
    (7, ("activations", 2**20, "b"), "bigger than needed"),
    (7, ("activations", 16, "b"), "exponent"),
    (7, ("activations", 1000, "b"), "power of two"),
    (7, ("activations", 2**16, "d"), "65504"),
]


def test_a_function_still_raising_its_stub_is_not_answered():
    with pytest.raises(NotAnswered, match="NotImplementedError"):
        check.exercise_2(stub, "c")


def test_hints_do_not_give_the_answers_away():
    for k, args in [(1, (2,)), (5, (2 * DP, PP, "pp")), (7, ("activations", 2**10, "b"))]:
        with pytest.raises(CheckFailed) as info:
            getattr(check, f"exercise_{k}")(*args)
        message = str(info.value)
        assert "65536" not in message and "ZeRO-3 leaves" not in message
        assert f"{DP:.3f}" not in message
