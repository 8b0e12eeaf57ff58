"""Checks for the exercises of lesson 01 (why split a model; naive model parallelism).

Each `exercise_K` is called by the check cell of Exercise 1.K in
`exercises/01_naive_model_parallelism.ipynb`. Wrong answers get a hint, never the answer.
"""

from __future__ import annotations

import random

from course_utils.checks import (
    as_choice,
    as_int,
    as_number,
    check_function,
    close,
    fail,
    passed,
)

GB = 1e9  # the course counts memory in decimal gigabytes, like GPU data sheets

# Bytes per parameter of model state when training with Adam (ZeRO's accounting,
# Rajbhandari et al. 2019, arXiv 1910.02054; mixed precision: Micikevicius et al. 2017,
# arXiv 1710.03740).
STATE_BYTES = {
    "fp32": {"parameters": 4, "gradients": 4, "optimizer": 8},
    "mixed": {"parameters": 2, "gradients": 2, "optimizer": 12},
}


def exercise_1(memory_gb) -> None:
    """7B parameters, fp32, Adam: model state in GB."""
    value = as_number(memory_gb, "memory_gb")
    expected = 7e9 * 16 / GB
    if close(value, expected, rel=0.01):
        passed(f"Right: {value:g} GB, 16 bytes per parameter. No single 80 GB GPU holds it.")
        return
    per_param = value * GB / 7e9
    if any(close(value, expected * scale, rel=0.01) for scale in (1e9, 1e3, 1e-3, 1.024**-3)):
        fail("The digits look right but the unit is off: answer in GB, where 1 GB = 1e9 bytes.")
    if close(per_param, 4, rel=0.01):
        fail(
            "That is only the parameters (4 bytes each). Training also keeps a gradient per "
            "parameter and Adam keeps two more numbers per parameter."
        )
    if close(per_param, 8, rel=0.01):
        fail("You counted parameters and gradients. What does Adam keep for every parameter?")
    if close(per_param, 12, rel=0.01):
        fail("Close: Adam keeps two running averages per parameter (m and v), not one.")
    fail(
        f"{value:g} GB is {per_param:.3g} bytes per parameter. Count the fp32 bytes of each "
        "thing training keeps per parameter: the weight, its gradient, and Adam's state."
    )


def _reference_state(num_params: int, precision: str) -> dict[str, int]:
    return {name: num_params * n for name, n in STATE_BYTES[precision].items()}


def exercise_2(model_state_bytes) -> None:
    """Build model_state_bytes(num_params, precision) -> dict of bytes per kind of state."""
    call = check_function(model_state_bytes, "model_state_bytes")
    rng = random.Random()
    cases = [(rng.randint(1, 10**6) * 1000 + rng.randint(0, 999), prec) for prec in STATE_BYTES]
    cases += [(rng.randint(10**8, 10**11), rng.choice(list(STATE_BYTES))) for _ in range(4)]
    for num_params, precision in cases:
        got = call(num_params, precision)
        shown = f"model_state_bytes({num_params}, {precision!r})"
        if not isinstance(got, dict):
            fail(f"{shown} should return a dict, but it returned a {type(got).__name__}.")
        missing = [k for k in STATE_BYTES[precision] if k not in got]
        if missing:
            fail(
                f"{shown} has no key {missing[0]!r}. Return a dict with the keys "
                "'parameters', 'gradients' and 'optimizer'."
            )
        expected = _reference_state(num_params, precision)
        for key, want in expected.items():
            value = as_number(got[key], f"{shown}[{key!r}]")
            if not close(value, want, rel=1e-6):
                per = value / num_params
                hint = {
                    "parameters": "Which number format holds the weights the passes use?",
                    "gradients": "Gradients have the same format as the weights the passes use.",
                    "optimizer": (
                        "Adam keeps m and v in fp32; in mixed precision the optimizer also "
                        "keeps an fp32 master copy of the weights."
                    ),
                }[key]
                fail(f"{shown}[{key!r}] is {per:g} bytes per parameter, which is not right. {hint}")
    passed(
        "Right on fresh random model sizes: 16 bytes per parameter either way; mixed precision "
        "moves bytes from the weights to the optimizer, it does not save model state."
    )


def exercise_3(devices) -> None:
    """30B parameters, mixed + Adam, 80 GB GPUs, 20 GB kept for activations: fewest stages."""
    value = as_int(devices, "devices")
    if value == 8:
        passed("Right: 480 GB of model state, 60 GB per GPU, so 8 equal stages.")
        return
    if value == 6:
        fail(
            "6 stages put 80 GB of model state on each GPU: nothing left for the activations. "
            "Only 60 GB per GPU may hold model state."
        )
    if value in (2, 4):
        fail("Is that counting only the 16-bit weights? Count gradients and Adam's state too.")
    if value < 6:
        fail(
            f"With {value} stages each GPU would hold more than 80 GB. Start from the total: "
            "how many bytes per parameter in mixed precision with Adam?"
        )
    fail(
        f"{value} stages is more than needed: the question asks for the fewest equal stages "
        "whose model state fits in the 60 GB per GPU left after the activation reserve."
    )


def exercise_4(utilization, speedup) -> None:
    """Naive model parallelism over 4 equal stages: utilization per device and speed-up."""
    util = as_number(utilization, "utilization")
    speed = as_number(speedup, "speedup")
    if util > 1 or util < 0:
        fail("`utilization` is a fraction of the step time: a number between 0 and 1.")
    if not close(util, 0.25, rel=0.01):
        if close(util, 0.75, rel=0.01):
            fail("0.75 is the idle fraction. `utilization` asks for the busy fraction.")
        fail(
            "Not yet. Draw the staircase: while one stage computes, what are the other "
            "three doing? How long is the step compared with one device's busy time?"
        )
    if not close(speed, 1.0, rel=0.01):
        fail(
            "`utilization` is right, `speedup` is not. The four devices do the same work as one "
            "device would, one after another: does the step get any shorter?"
        )
    passed(
        "Right: each device is busy 1/4 of the step, and the step is as long as on one device "
        "(no speed-up). Naive model parallelism buys memory, not speed."
    )


PROBLEMS = ("a", "b", "c", "d")
FIXES = ("a", "b", "c", "d")


def exercise_5(problem, fix) -> None:
    """Diagnose the measured chart of naive model parallelism: the problem and its fix."""
    problem = as_choice(problem, PROBLEMS, "problem")
    fix = as_choice(fix, FIXES, "fix")
    problem_hints = {
        "a": (
            "The bars are about the same length on every device, so imbalance is not the main "
            "story. Look at how many rows have a bar at the same moment."
        ),
        "c": (
            "Handing a tensor to the next thread takes microseconds; the gaps are as long as "
            "whole forward and backward passes. What are the idle devices waiting for?"
        ),
        "d": "This run has no optimizer step at all. Look at when each device works.",
    }
    if problem != "b":
        fail(f"`problem` = {problem!r} is not it. {problem_hints[problem]}")
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
            "Tensor parallelism is another way to split, not a fix for this schedule's idle "
            "time. What change to the *data* lets stages overlap?"
        ),
    }
    if fix != "a":
        fail(f"`problem` is right. `fix` = {fix!r} is not: {fix_hints[fix]}")
    passed(
        "Right: the whole batch has to leave a stage before the next one starts, so one device "
        "works and the rest wait; cutting the batch into micro-batches lets stages overlap."
    )


def exercise_6(scenario_a, scenario_b) -> None:
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
