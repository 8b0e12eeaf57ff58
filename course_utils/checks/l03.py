"""Checks for the exercises of lesson 03 (the pipeline bubble and the micro-batch trade-off).

Each `exercise_K` is called by the check cell of Exercise 3.K in
`exercises/03_bubble_tradeoff.ipynb`, with the learner's variant `v`: `given_K(v)` draws the
exercise's numbers (the default student gets the course's own), and every expected answer
is computed from them, here or by the simulator. `cases_2(v)` are the inputs a Build
exercise's function is tried on. The bubble formula is GPipe's with equal stages
(Huang et al. 2018, arXiv 1811.06965): (p - 1) / (m + p - 1), the idle share of the step.
"""

from __future__ import annotations

import math

from course_utils.checks import (
    DEFAULT,
    Variant,
    as_choice,
    as_int,
    as_number,
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


def for_student(student: str = "default"):
    """This lesson's checks with `student`'s numbers (the notebook's first code cell)."""
    import sys

    return _for_student(sys.modules[__name__], student)


def _bubble(p: int, m: int) -> float:
    return (p - 1) / (m + p - 1)


def _fraction(value, what: str, expected: float) -> float:
    number = expect_number(value, expected, what, unit="fraction")
    if not 0 <= number <= 1:
        fail(f"`{what}` is a fraction of the step: a number between 0 and 1, not {number:g}.")
    return number


# --------------------------------------------------------------------------- 3.1


def given_1(v: Variant = DEFAULT) -> dict:
    return {"p": v.pick("1p", 4, [3, 4, 5, 6, 8]), "m": v.pick("1m", 12, [6, 8, 10, 16, 20])}


def exercise_1(bubble_fraction, v: Variant = DEFAULT) -> None:
    """GPipe with the given p and m, equal stages: the bubble fraction."""
    p, m = given_1(v).values()
    want = _bubble(p, m)
    value = _fraction(bubble_fraction, "bubble_fraction", want)
    if is_right(value, want):
        passed(f"Right: {p - 1} idle slots out of {m + p - 1} per device, a bubble of {want:.1%}.")
        return
    if is_right(value, (p - 1) / m):
        fail(
            f"{p - 1}/{m} is the bubble relative to the ideal (busy) time. The question asks for "
            "the idle share of the whole step: divide by the step's length in slots instead."
        )
    if is_right(value, p / (m + p)):
        fail("Count the fill slots again: with p stages, how many slots until the last starts?")
    fail(
        "Not yet. Per device, count busy slots (one per micro-batch) and idle slots (the "
        "fill and drain); the bubble is idle over all slots."
    )


# --------------------------------------------------------------------------- 3.2

# Inputs no simulation can reach in time: the function must compute the formula.
HUGE = [(10**6, 10**9), (123_457, 10**8)]


def cases_2(v: Variant = DEFAULT) -> dict[str, list[tuple]]:
    rng = v.cases("2")
    small = [(1, rng.randint(1, 8))] + [(rng.randint(2, 16), rng.randint(1, 64)) for _ in range(6)]
    return {"gpipe_bubble": [*small, *HUGE]}


def exercise_2(gpipe_bubble, v: Variant = DEFAULT) -> None:
    """Build gpipe_bubble(p, m): any p >= 1, m >= 1, up to millions of stages."""
    call = check_function(gpipe_bubble, "gpipe_bubble")
    cases = cases_2(v)["gpipe_bubble"]
    for p, m in cases:
        shown = f"gpipe_bubble({p}, {m})"
        try:
            result = call(p, m)
        except Exception as exc:
            if (p, m) in HUGE:
                fail(
                    f"{shown} did not answer ({exc}). The check also tries a million stages: "
                    "compute the bubble from p and m with the formula, do not simulate."
                )
            raise
        value = as_number(result, shown)
        want = _bubble(p, m)
        if not math.isclose(value, want, rel_tol=1e-9, abs_tol=1e-12):
            if p > 1 and math.isclose(value, (p - 1) / m, rel_tol=1e-9):
                fail(f"{shown} gives (p-1)/m: that is relative to the busy time, not the step.")
            if p == 1:
                fail(f"{shown} should be 0: a single device never waits for another one.")
            fail(
                f"{shown} returned {value:.4g}, which is not the idle share of the step. "
                "Check it on p=2, m=1 by drawing the timeline."
            )
    small = ", ".join(f"({p}, {m})" for p, m in cases[: -len(HUGE)])
    passed(f"Right on fresh random (p, m) = {small}, and on a million stages.")


# --------------------------------------------------------------------------- 3.3


def given_3(v: Variant = DEFAULT) -> dict:
    return {
        "p": v.pick("3p", 8, [4, 6, 10, 12, 16]),
        "target": v.pick("3t", 0.1, [0.05, 0.1, 0.2, 0.25]),
    }


def exercise_3(microbatches, v: Variant = DEFAULT) -> None:
    """The fewest micro-batches whose bubble is at most the target, for the given p."""
    p, target = given_3(v).values()
    m = as_int(microbatches, "microbatches")
    if m < 1:
        fail("`microbatches` counts micro-batches: at least 1.")
    fewest = math.ceil((p - 1) * (1 - target) / target - 1e-9)
    if m == math.ceil((p - 1) / target - 1e-9) and m != fewest:
        fail(
            f"m = {m} makes (p-1)/m = {target:.0%}: that is the bubble relative to the busy time. "
            "This course's bubble is the idle share of the whole step, (p-1)/(m+p-1)."
        )
    if _bubble(p, m) > target + 1e-12:
        fail(
            f"With m = {m} the bubble is still above {target:.0%}. Solve (p-1)/(m+p-1) <= "
            f"{target:g} for m, or try larger values with your gpipe_bubble function."
        )
    if m > fewest:
        fail(f"m = {m} works, but fewer micro-batches would too: the question asks for the fewest.")
    passed(f"Right: m = {m} is the fewest; its bubble is {_bubble(p, m):.1%}.")


# --------------------------------------------------------------------------- 3.4


def given_4(v: Variant = DEFAULT) -> dict:
    return {
        "p": v.pick("4p", 4, [4, 6, 8]),
        "gpu_gb": v.pick("4g", 80, [40, 48, 80, 96]),
        "state_gb": v.pick("4s", 50, [18, 22, 26, 30]),
        "per_microbatch_gb": v.pick("4a", 1.5, [0.5, 0.75, 1.25, 2.0]),
    }


def exercise_4(max_microbatches, bubble_at_max, v: Variant = DEFAULT) -> None:
    """Largest m whose GPipe activations fit beside the model state, and its bubble."""
    p, gpu, state, per = given_4(v).values()
    fits = math.floor((gpu - state) / per + 1e-9)
    m = as_int(max_microbatches, "max_microbatches")
    if m != fits:
        if m == math.floor(gpu / per + 1e-9):
            fail(f"{gpu} / {per} forgets the {state} GB of model state already on the GPU.")
        if m == math.floor(state / per + 1e-9):
            fail(
                f"{state} / {per} uses the model state as the budget: what is left for activations?"
            )
        if m == p:
            fail(
                "That would be the count if only p micro-batches were in flight (1F1B, next "
                "lesson). In GPipe, how many micro-batches' activations does stage 0 hold "
                "when its last forward ends?"
            )
        fail(
            "`max_microbatches` is not right. Stage 0 holds the activations of every micro-batch "
            "it has forwarded and not yet backwarded: how many at the peak, in GPipe?"
        )
    want = _bubble(p, m)
    b = _fraction(bubble_at_max, "bubble_at_max", want)
    if not is_right(b, want):
        fail(f"`max_microbatches` is right; now put it into the bubble formula with p = {p}.")
    passed(f"Right: {m} micro-batches fit ({gpu - state:g} GB / {per:g} GB), a bubble of {b:.1%}.")


# --------------------------------------------------------------------------- 3.5

LEFT_CAUSES = ("a", "b", "c", "d")
RIGHT_CAUSES = ("a", "b", "c", "d")


def exercise_5(left_cause, right_cause, v: Variant = DEFAULT) -> None:
    """Explain both ends of the reference throughput-vs-micro-batches curve."""
    left = as_choice(left_cause, LEFT_CAUSES, "left_cause")
    right = as_choice(right_cause, RIGHT_CAUSES, "right_cause")
    if left != "a":
        fail(
            f"`left_cause` = {left!r} is not it. With one or two micro-batches, look at the "
            "reference Gantt chart: how many devices compute at the same time?"
        )
    expect_choice(
        right,
        "b",
        {
            "a": "The bubble keeps shrinking as m grows: it cannot explain a drop on the right.",
            "c": "The global batch is fixed, so the activation memory does not grow here.",
            "d": "Every point runs the same samples through the same model: the work is equal.",
        },
        "`left_cause` is right. `right_cause` = {got!r} is not: {hint}",
    )
    passed(
        "Right: few micro-batches leave devices idle in the bubble; many tiny ones each pay a "
        "fixed overhead and use the hardware poorly. The best m is in between."
    )


# --------------------------------------------------------------------------- 3.6


def given_6(v: Variant = DEFAULT) -> dict:
    return {"m": v.pick("6m", 4, [3, 5, 6]), "heavy": v.pick("6h", 2, [2, 3])}


def _unbalanced(v: Variant):
    from course_utils.pipeline import CostModel, make_schedule, simulate

    m, heavy = given_6(v).values()
    costs = CostModel(stage_forward=[1, 1, heavy], stage_backward=[2, 2, 2 * heavy])
    return simulate(make_schedule("gpipe", 3, m), costs)


def exercise_6(efficiency, busiest_device, v: Variant = DEFAULT) -> None:
    """A simulated GPipe timeline with a heavy last stage: efficiency and busiest device."""
    timeline = _unbalanced(v)
    busy = [timeline.busy(d) for d in range(3)]
    want = sum(busy) / (3 * timeline.makespan)
    dev = as_int(busiest_device, "busiest_device")
    if dev not in range(3):
        fail("`busiest_device` is a device number: 0, 1 or 2.")
    if dev != busy.index(max(busy)):
        fail("`busiest_device` is not right: which row of the chart has the least grey?")
    eff = _fraction(efficiency, "efficiency", want)
    if not is_right(eff, want):
        if is_right(eff, 1 - want):
            fail("That is the bubble (idle share). Efficiency is the busy share.")
        m = given_6(v)["m"]
        if is_right(eff, m / (m + 2)):
            fail(
                "That is the equal-stage formula m/(m+p-1). These stages are not equal: add "
                "up the busy time of every device and compare with devices x makespan."
            )
        fail(
            "`busiest_device` is right, `efficiency` is not. Efficiency = total busy time of "
            "all devices / (number of devices x makespan); read both off the chart."
        )
    passed(
        f"Right: {want:.1%} efficiency. The slow last stage sets the pace; the other two devices "
        "wait for it even in the middle of the step."
    )


__all__ = [f"exercise_{k}" for k in range(1, 7)]
