"""Checks for the exercises of lesson 01 (why split a model; naive model parallelism).

Each `exercise_K` is called by the check cell of Exercise 1.K in
`exercises/01_naive_model_parallelism.ipynb`, with the learner's variant `v`: `given_K(v)`
draws the exercise's numbers (the default student gets the course's own), and every
expected answer is computed from them. `cases_2(v)` are the inputs the Build exercise's
function is tried on. Wrong answers get a hint, never the answer.

Memory is counted in decimal gigabytes (1 GB = 10^9 bytes), like GPU data sheets. Bytes per
parameter of model state follow ZeRO's accounting (Rajbhandari et al. 2019, arXiv
1910.02054; SC 2020); mixed precision is Micikevicius et al. 2017 (arXiv 1710.03740; ICLR
2018): 16-bit weights and gradients, and an fp32 master copy of the weights kept by the
optimizer.
"""

from __future__ import annotations

import math

from course_utils.checks import (
    DEFAULT,
    Variant,
    as_choice,
    as_int,
    check_function,
    expect_choice,
    expect_number,
    fail,
    is_right,
    passed,
)
from course_utils.checks import (
    for_student as _for_student,
)

GB = 1e9  # the course counts memory in decimal gigabytes, like GPU data sheets

# Bytes per parameter of the weights and gradients the passes use, per number format.
PASS_BYTES = {"fp32": 4, "mixed": 2}
# Numbers the optimizer keeps per parameter, each in fp32 (4 bytes): Adam its two moments
# m and v, SGD with momentum its momentum buffer, plain SGD nothing.
OPTIMIZER_NUMBERS = {"adam": 2, "momentum": 1, "sgd": 0}
MASTER_COPY = {"fp32": 0, "mixed": 4}  # mixed precision: fp32 master weights in the optimizer


def for_student(student: str = "default"):
    """This lesson's checks with `student`'s numbers (the notebook's first code cell)."""
    import sys

    return _for_student(sys.modules[__name__], student)


def state_bytes_per_parameter(precision: str, optimizer: str = "adam") -> dict[str, int]:
    """Bytes per parameter of each kind of model state (what exercise 1.2 asks to build)."""
    return {
        "parameters": PASS_BYTES[precision],
        "gradients": PASS_BYTES[precision],
        "optimizer": MASTER_COPY[precision] + 4 * OPTIMIZER_NUMBERS[optimizer],
    }


def _total_per_parameter(precision: str, optimizer: str = "adam") -> int:
    return sum(state_bytes_per_parameter(precision, optimizer).values())


# --------------------------------------------------------------------------- 1.1


def given_1(v: Variant = DEFAULT) -> dict:
    return {"billions": v.pick("1n", 7, [3, 6, 8, 13, 20, 34])}


def exercise_1(memory_gb, v: Variant = DEFAULT) -> None:
    """`billions` billion parameters, fp32, Adam: model state in GB."""
    billions = given_1(v)["billions"]
    n = billions * 1e9
    want = n * _total_per_parameter("fp32") / GB
    value = expect_number(
        memory_gb,
        want,
        "memory_gb",
        unit="GB",
        slips=[(1e3, "looks like megabytes; give GB (1 GB = 1000 MB).")],
    )
    if is_right(value, want):
        where = (
            "more than one 80 GB GPU holds"
            if want > 80
            else "it fits on one 80 GB GPU, before the activations"
        )
        passed(f"Right: {value:g} GB, 16 bytes per parameter: {where}.")
        return
    per_param = value * GB / n
    hints = {
        4: (
            "That is only the parameters (4 bytes each). Training also keeps a gradient per "
            "parameter and Adam keeps two more numbers per parameter."
        ),
        8: "You counted parameters and gradients. What does Adam keep for every parameter?",
        12: "Adam keeps two running averages per parameter (m and v), not one.",
        2: "The question is about plain fp32 training: every number is 4 bytes, not 2.",
    }
    for nbytes, hint in hints.items():
        if is_right(per_param, nbytes):
            fail(hint)
    fail(
        f"{value:g} GB is {per_param:.3g} bytes per parameter. Count the fp32 bytes of each "
        "thing training keeps per parameter: the weight, its gradient, and Adam's state."
    )


# --------------------------------------------------------------------------- 1.2

KEYS = ("parameters", "gradients", "optimizer")


def cases_2(v: Variant = DEFAULT) -> dict[str, list[tuple]]:
    """Every precision with every optimizer, on random sizes, then a few large models."""
    rng = v.cases("2")
    cases = [
        (rng.randint(1, 10**6) * 1000 + rng.randint(1, 999), precision, optimizer)
        for precision in PASS_BYTES
        for optimizer in OPTIMIZER_NUMBERS
    ]
    cases += [
        (rng.randint(10**8, 10**11), rng.choice(list(PASS_BYTES)), rng.choice(["adam", "sgd"]))
        for _ in range(3)
    ]
    return {"model_state_bytes": cases}


def _optimizer_hint(precision: str, optimizer: str) -> str:
    what = {
        "adam": "Adam keeps two fp32 numbers per parameter (m and v)",
        "momentum": "SGD with momentum keeps one fp32 number per parameter (its momentum)",
        "sgd": "plain SGD keeps no numbers of its own",
    }[optimizer]
    if precision == "mixed":
        return f"In mixed precision the optimizer also keeps an fp32 master copy; {what}."
    return f"In fp32 there is no separate master copy; {what}."


def exercise_2(model_state_bytes, v: Variant = DEFAULT) -> None:
    """Build model_state_bytes(num_params, precision, optimizer) -> bytes per kind of state."""
    call = check_function(model_state_bytes, "model_state_bytes")
    for num_params, precision, optimizer in cases_2(v)["model_state_bytes"]:
        shown = f"model_state_bytes({num_params}, {precision!r}, {optimizer!r})"
        got = call(num_params, precision, optimizer)
        if not isinstance(got, dict):
            fail(f"{shown} should return a dict, but it returned a {type(got).__name__}.")
        missing = [k for k in KEYS if k not in got]
        if missing:
            fail(
                f"{shown} has no key {missing[0]!r}. Return a dict with the keys "
                "'parameters', 'gradients' and 'optimizer'."
            )
        per = state_bytes_per_parameter(precision, optimizer)
        for key in KEYS:
            want = num_params * per[key]
            value = expect_number(
                got[key],
                want,
                f"{shown}[{key!r}]",
                unit="bytes",
                slips=[
                    (
                        1 / num_params,
                        "is the bytes of one parameter; give the bytes of all of them.",
                    )
                ],
            )
            if is_right(value, want):
                continue
            hint = {
                "parameters": "Which number format holds the weights the passes use?",
                "gradients": "Gradients have the same format as the weights the passes use.",
                "optimizer": _optimizer_hint(precision, optimizer),
            }[key]
            fail(
                f"{shown}[{key!r}] is {value / num_params:g} bytes per parameter, which is not "
                f"right. {hint}"
            )
    passed(
        "Right on fresh random model sizes, for both formats and all three optimizers. With "
        "Adam it is 16 bytes per parameter either way: mixed precision moves bytes from the "
        "weights to the optimizer, it does not save model state."
    )


# --------------------------------------------------------------------------- 1.3


def given_3(v: Variant = DEFAULT) -> dict:
    return {
        "billions": v.pick("3n", 30, [13, 20, 34, 40, 52, 70]),
        "gpu_gb": v.pick("3g", 80, [40, 48, 80, 96]),
        "reserve_gb": v.pick("3r", 20, [8, 12, 16, 24]),
    }


def fewest_stages(billions: float, gpu_gb: float, reserve_gb: float) -> int:
    """Equal stages whose mixed-precision Adam model state fits beside the reserve."""
    total_gb = billions * 1e9 * _total_per_parameter("mixed") / GB
    return math.ceil(total_gb / (gpu_gb - reserve_gb) - 1e-9)


def exercise_3(devices, v: Variant = DEFAULT) -> None:
    """`billions` B parameters, mixed + Adam, GPUs of `gpu_gb`, `reserve_gb` kept free."""
    billions, gpu, reserve = given_3(v).values()
    budget = gpu - reserve
    total_gb = billions * 1e9 * _total_per_parameter("mixed") / GB
    want = fewest_stages(billions, gpu, reserve)
    value = as_int(devices, "devices")
    if value < 1:
        fail("`devices` counts GPUs: at least 1.")
    if value == want:
        passed(
            f"Right: {total_gb:g} GB of model state; {want} equal stages put "
            f"{total_gb / want:.1f} GB on each GPU, within the {budget:g} GB left beside the "
            f"{reserve:g} GB activation reserve."
        )
        return
    if value > want:
        fail(
            f"{value} stages works, but fewer would too: the question asks for the fewest equal "
            f"stages whose model state fits in the {budget:g} GB per GPU left after the "
            "activation reserve."
        )
    # too few stages: say which budget the answer broke, never "more than needed"
    if total_gb / value <= gpu:
        fail(
            f"Too few: with {value} stages the model state fits in the whole {gpu:g} GB, but "
            f"leaves less than the {reserve:g} GB each GPU must keep free for activations. "
            f"Only {budget:g} GB per GPU may hold model state."
        )
    weights_only = billions * 1e9 * PASS_BYTES["mixed"] / GB
    if value in (math.ceil(weights_only / budget - 1e-9), math.ceil(weights_only / gpu - 1e-9)):
        fail(
            "Too few. Is that counting only the 16-bit weights? Count the gradients and the "
            "optimizer's state too: how many bytes per parameter in mixed precision with Adam?"
        )
    fail(
        f"Too few: with {value} stages each GPU would hold more than {gpu:g} GB of model state. "
        "Start from the total: how many bytes per parameter in mixed precision with Adam?"
    )


# --------------------------------------------------------------------------- 1.4


def given_4(v: Variant = DEFAULT) -> dict:
    return {"p": v.pick("4p", 4, [3, 5, 6, 8])}


def exercise_4(utilization, speedup, v: Variant = DEFAULT) -> None:
    """Naive model parallelism over p equal stages: utilization per device and speed-up."""
    p = given_4(v)["p"]
    want_util, want_speed = 1 / p, 1.0
    util = expect_number(utilization, want_util, "utilization", unit="fraction")
    if not 0 <= util <= 1:
        fail("`utilization` is a fraction of the step time: a number between 0 and 1.")
    if not is_right(util, want_util):
        if is_right(util, 1 - want_util):
            fail(f"{util:g} is the idle fraction. `utilization` asks for the busy fraction.")
        fail(
            f"Not yet. Draw the staircase: while one stage computes, what are the other "
            f"{p - 1} doing? How long is the step compared with one device's busy time?"
        )
    speed = expect_number(speedup, want_speed, "speedup")
    if not is_right(speed, want_speed):
        if is_right(speed, p):
            fail(
                f"`utilization` is right. {p}x would need all {p} devices computing at once; "
                "in the naive schedule they take turns. Does the step get any shorter?"
            )
        fail(
            f"`utilization` is right, `speedup` is not. The {p} devices do the same work one "
            "device would, one after another: does the step get any shorter?"
        )
    passed(
        f"Right: each device is busy 1/{p} of the step, and the step is as long as on one "
        "device (no speed-up). Naive model parallelism buys memory, not speed."
    )


# --------------------------------------------------------------------------- 1.5

PROBLEMS = ("a", "b", "c", "d")
FIXES = ("a", "b", "c", "d")


def exercise_5(problem, fix, v: Variant = DEFAULT) -> None:
    """Diagnose naive model parallelism's chart: the problem, and the fix that keeps the
    split between layers."""
    problem = as_choice(problem, PROBLEMS, "problem")
    fix = as_choice(fix, FIXES, "fix")
    problem_hints = {
        "a": (
            "The bars differ in length (the stage with the output head is heavier), but "
            "balanced stages would still take turns. Look at how many rows compute at once "
            "in the simulated chart."
        ),
        "c": (
            "Handing a tensor to the next thread takes microseconds; the gaps are as long as "
            "whole forward and backward passes. What are the idle devices waiting for?"
        ),
        "d": "This run has no optimizer step at all. Look at when each device works.",
    }
    expect_choice(problem, "b", problem_hints, "`problem` = {got!r} is not it. {hint}")
    fix_hints = {
        "b": (
            "More devices make each stage shorter but the staircase longer: utilization is "
            "still 1/p. What would let two stages work at the same time?"
        ),
        "c": (
            "A larger batch makes every bar longer, but still only one device works at a "
            "time. Think of an assembly line."
        ),
        "d": (
            "Balanced stages all take the same time, but they still take turns: balancing "
            "fixes uneven bars, not the waiting. What change to the *data* lets stages overlap?"
        ),
    }
    expect_choice(fix, "a", fix_hints, "`problem` is right. `fix` = {got!r} is not: {hint}")
    passed(
        "Right: the whole batch has to leave a stage before the next one starts, so one device "
        "works and the rest wait; cutting the batch into micro-batches lets stages overlap."
    )


# --------------------------------------------------------------------------- 1.6


def exercise_6(scenario_a, scenario_b, v: Variant = DEFAULT) -> None:
    """Tensor or pipeline parallelism for two scenarios."""
    a = as_choice(scenario_a, ("tensor", "pipeline"), "scenario_a")
    b = as_choice(scenario_b, ("tensor", "pipeline"), "scenario_b")
    if a != "tensor":
        fail(
            "`scenario_a` is not right. Splitting between layers puts whole layers on devices: "
            "can it help when one single layer is larger than a device?"
        )
    if b != "pipeline":
        fail(
            "`scenario_a` is right, `scenario_b` is not. Which split needs an all-reduce in "
            "every layer, and which only sends activations at a few stage boundaries?"
        )
    passed(
        "Right: a layer bigger than a device must be cut inside (tensor parallelism); over a "
        "slow link, cut between layers (pipeline) so only stage boundaries communicate."
    )


__all__ = [f"exercise_{k}" for k in range(1, 7)]
