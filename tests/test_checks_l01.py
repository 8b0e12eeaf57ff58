"""The lesson 01 checks: right answers pass, wrong ones fail kindly, placeholders say so."""

import math

import pytest
import rankprograms as programs

from course_utils.checks import CheckFailed, NotAnswered, Variant
from course_utils.checks import l01 as check


def solution_state(num_params, precision, optimizer):
    weights = {"fp32": 4, "mixed": 2}[precision]
    master = {"fp32": 0, "mixed": 4}[precision]
    moments = {"adam": 8, "momentum": 4, "sgd": 0}[optimizer]
    per = (weights, weights, master + moments)
    return dict(
        zip(("parameters", "gradients", "optimizer"), (num_params * b for b in per), strict=True)
    )


def off_for(key, precision=None, optimizer=None):
    """solution_state, wrong by 3 bytes per parameter in `key` for one precision/optimizer."""

    def state(num_params, p, o):
        out = solution_state(num_params, p, o)
        if precision in (None, p) and optimizer in (None, o):
            out[key] += 3 * num_params
        return out

    return state


def without_optimizer(num_params, precision, optimizer):
    out = solution_state(num_params, precision, optimizer)
    del out["optimizer"]
    return out


def per_parameter(num_params, precision, optimizer):
    return solution_state(1, precision, optimizer)


RIGHT = {
    1: (112,),
    2: (solution_state,),
    3: (8,),
    4: (0.25, 1.0),
    5: ("b", "a"),
    6: ("tensor", "pipeline"),
    7: (programs.naive,),
}


WRONG = [  # (exercise, arguments, words the hint must contain)
    (1, (28,), "only the parameters"),
    (1, (56,), "Adam"),
    (1, (84,), "two running averages"),
    (1, (14,), "plain fp32"),
    (1, (112e9,), "bytes; give GB"),
    (1, (112e3,), "looks like megabytes; give GB"),
    (1, (112e9 / 2**30,), "GiB; give GB"),
    (1, (110,), "3 significant figures"),
    (1, (3,), "bytes per parameter"),
    (1, ("112",), "without quotes"),
    (1, (math.nan,), "NaN"),
    (3, (6,), "leaves less than the 20 GB"),
    (3, (7,), "Too few"),  # 68.6 GB per GPU: too few, never "more than needed"
    (3, (1,), "16-bit weights"),
    (3, (4,), "more than 80 GB"),
    (3, (16,), "fewest"),
    (3, (9,), "fewer would too"),
    (3, (0,), "at least 1"),
    (3, (7.5,), "whole number"),
    (4, (0.75, 1.0), "idle fraction"),
    (4, (0.5, 1.0), "staircase"),
    (4, (25, 1.0), "percentage"),
    (4, (0.25, 4.0), "take turns"),
    (4, (0.25, 2.0), "`speedup` is not"),
    (4, (1.5, 1.0), "between 0 and 1"),
    (5, ("a", "a"), "still take turns"),
    (5, ("c", "a"), "microseconds"),
    (5, ("b", "b"), "fix"),
    (5, ("b", "d"), "Balanced stages"),
    (5, ("e", "a"), "should be one of"),
    (6, ("pipeline", "pipeline"), "single layer"),
    (6, ("tensor", "tensor"), "scenario_b"),
    (6, (1, "pipeline"), "should be one of"),
    (2, (off_for("parameters"),), "Which number format holds the weights"),
    (2, (off_for("gradients"),), "Gradients have the same format as the weights"),
    (2, (off_for("optimizer", "mixed", "adam"),), "also keeps an fp32 master copy; Adam keeps"),
    (2, (off_for("optimizer", "fp32", "momentum"),), "no separate master copy; SGD with momentum"),
    (2, (off_for("optimizer", "fp32", "sgd"),), "plain SGD keeps no numbers of its own"),
    (2, (lambda n, p, o: [n],), "should be a dict with the keys"),
    (2, (without_optimizer,), "has no key 'optimizer'"),
    (2, (per_parameter,), "is the bytes of one parameter"),
    (5, ("d", "a"), "no optimizer step at all"),
    (5, ("b", "c"), "A larger batch makes every bar longer"),
    *((7, (wrong,), words) for wrong, words in programs.MISTAKES.items()),
    (7, (programs.output_backward,), "Only the loss is a single number"),
    (7, (programs.no_backward_on_rank_0,), "rank 0's gradients are None"),
    (7, (programs.zeros_back,), "rank 0's gradients are all zero"),
    (7, (programs.doubled_loss,), "rank 1's gradients are not those of one device"),
    (7, (programs.unmarked,), "with ctx.forward(0):"),
    (7, (programs.sent_twice,), "one activation forward and one gradient back"),
    (7, (programs.to_itself,), "the other ranks are"),
    (7, (42,), "should be a function"),
]


def test_too_few_devices_is_never_called_more_than_needed():
    g = check.given_3()
    fewest = check.fewest_stages(g["billions"], g["gpu_gb"], g["reserve_gb"])
    for devices in range(1, fewest):
        with pytest.raises(CheckFailed) as info:
            check.exercise_3(devices)
        assert "Too few" in str(info.value) and "more than needed" not in str(info.value)


def test_build_exercise_catches_wrong_functions():
    def mixed_as_fp32(n, precision, optimizer):
        return solution_state(n, "fp32", optimizer)

    def always_adam(n, precision, optimizer):
        return solution_state(n, precision, "adam")

    def no_master_copy(n, precision, optimizer):
        state = solution_state(n, precision, optimizer)
        state["optimizer"] -= 4 * n if precision == "mixed" else 0
        return state

    def broken(n, precision, optimizer):
        return {"parameters": 1 / 0}

    def no_dict(n, precision, optimizer):
        return 16 * n

    def stub(n, precision, optimizer):
        raise NotImplementedError()

    with pytest.raises(CheckFailed, match="optimizer|parameters"):
        check.exercise_2(mixed_as_fp32)
    with pytest.raises(CheckFailed, match="momentum|plain SGD"):
        check.exercise_2(always_adam)
    with pytest.raises(CheckFailed, match="master copy"):
        check.exercise_2(no_master_copy)
    with pytest.raises(CheckFailed, match="ZeroDivisionError"):
        check.exercise_2(broken)
    with pytest.raises(CheckFailed, match="should be a dict"):
        check.exercise_2(no_dict)
    with pytest.raises(NotAnswered):
        check.exercise_2(stub)
    with pytest.raises(CheckFailed, match="should be a function"):
        check.exercise_2(42)


def test_build_exercise_names_unit_slips():
    def in_gb(n, precision, optimizer):
        return {k: v / 1e9 for k, v in solution_state(n, precision, optimizer).items()}

    def per_parameter(n, precision, optimizer):
        return solution_state(1, precision, optimizer)

    with pytest.raises(CheckFailed, match="GB; give bytes"):
        check.exercise_2(in_gb)
    with pytest.raises(CheckFailed, match="is the bytes of one parameter; give the bytes of all"):
        check.exercise_2(per_parameter)


def test_build_exercise_is_tried_on_every_format_and_optimizer():
    cases = check.cases_2(Variant("default", cases_seed=3))["model_state_bytes"]
    combos = {(precision, optimizer) for _, precision, optimizer in cases}
    assert combos == {(p, o) for p in ("fp32", "mixed") for o in ("adam", "momentum", "sgd")}
    assert cases == check.cases_2(Variant("default", cases_seed=3))["model_state_bytes"]


def test_build_exercise_names_missing_key():
    def missing(n, precision, optimizer):
        state = solution_state(n, precision, optimizer)
        del state["optimizer"]
        return state

    with pytest.raises(CheckFailed, match="no key 'optimizer'"):
        check.exercise_2(missing)


def right_for(variant):
    """The right answers of exercises 1, 3 and 4 from the student's own numbers (and 7's
    program, the same for everybody, tried on their own model)."""
    g1, g3, g4 = check.given_1(variant), check.given_3(variant), check.given_4(variant)
    fewest = math.ceil(g3["billions"] * 16 / (g3["gpu_gb"] - g3["reserve_gb"]) - 1e-9)
    return {1: (g1["billions"] * 16,), 3: (fewest,), 4: (1 / g4["p"], 1.0), 7: (programs.naive,)}


def test_the_program_is_tried_on_the_learners_model_then_on_secret_ones():
    mine = check.cases_7(Variant("alice", cases_seed=1))["naive_program"]
    again = check.cases_7(Variant("alice", cases_seed=1))["naive_program"]
    secret = check.cases_7(Variant("alice", cases_seed=2))["naive_program"]
    g = check.given_7(Variant("alice"))
    (first,) = mine[0]
    assert (first.batch, first.hidden, first.devices) == (g["batch"], g["hidden"], 2)
    assert mine == again and mine[1:] != secret[1:] and mine[0] == secret[0]


def test_each_mistake_fails_on_the_first_case_with_its_own_hint_only():
    hints = {}
    for wrong, words in programs.MISTAKES.items():
        with pytest.raises(CheckFailed) as info:
            check.exercise_7(wrong)
        hints[wrong.__name__] = str(info.value)
        assert words in hints[wrong.__name__]
    for name, message in hints.items():  # no two mistakes share their hint
        others = [w for wrong, w in programs.MISTAKES.items() if wrong.__name__ != name]
        assert not any(w in message for w in others), (name, message)


def test_a_stub_is_not_answered_and_a_forged_record_is_not_a_run():
    from course_utils.checks.wire import Replay, encode

    with pytest.raises(NotAnswered, match="NotImplementedError"):
        check.exercise_7(programs.stub)
    cases = check.cases_7()["naive_program"]
    forged = [{"result": encode({"passed": True, "score": 1})} for _ in cases]
    with pytest.raises(CheckFailed, match="did not come back as the record of a run"):
        check.exercise_7(Replay("naive_program", cases, forged))
