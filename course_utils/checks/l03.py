"""Checks for the exercises of lesson 03 (the pipeline bubble and the micro-batch trade-off).

Each `exercise_K` is called by the check cell of Exercise 3.K in
`exercises/03_bubble_tradeoff.ipynb`. The bubble formula is GPipe's with equal stages
(Huang et al. 2019, arXiv 1811.06965): (p - 1) / (m + p - 1).
"""

from __future__ import annotations

import random

from course_utils.checks import (
    as_choice,
    as_int,
    as_number,
    check_function,
    close,
    expect_choice,
    fail,
    passed,
)


def _bubble(p: int, m: int) -> float:
    return (p - 1) / (m + p - 1)


def _number_between_0_and_1(value, what: str) -> float:
    number = as_number(value, what)
    if not 0 <= number <= 1:
        fail(f"`{what}` is a fraction of the step: a number between 0 and 1, not {number:g}.")
    return number


def exercise_1(bubble_fraction) -> None:
    """GPipe, p=4, m=12, equal stages: the bubble fraction."""
    value = _number_between_0_and_1(bubble_fraction, "bubble_fraction")
    if close(value, _bubble(4, 12)):
        passed("Right: 3 idle slots out of 15 per device, a bubble of 20%.")
        return
    if close(value, 3 / 12):
        fail(
            "3/12 is the bubble relative to the ideal (busy) time. The question asks for the "
            "idle share of the whole step: divide by the step's length in slots instead."
        )
    if close(value, 4 / 16):
        fail("Count the fill slots again: with 4 stages, how many slots until the last starts?")
    fail(
        "Not yet. Per device, count busy slots (one per micro-batch) and idle slots (the "
        "fill and drain); the bubble is idle over all slots."
    )


def exercise_2(gpipe_bubble) -> None:
    """Build gpipe_bubble(p, m)."""
    call = check_function(gpipe_bubble, "gpipe_bubble")
    rng = random.Random()
    cases = [(1, rng.randint(1, 8))] + [(rng.randint(2, 16), rng.randint(1, 64)) for _ in range(8)]
    for p, m in cases:
        shown = f"gpipe_bubble({p}, {m})"
        value = as_number(call(p, m), shown)
        want = _bubble(p, m)
        if not close(value, want, rel=1e-9, abs=1e-12):
            if p > 1 and close(value, (p - 1) / m, rel=1e-9):
                fail(f"{shown} gives (p-1)/m: that is relative to the busy time, not the step.")
            if p == 1:
                fail(f"{shown} should be 0: a single device never waits for another one.")
            fail(
                f"{shown} returned {value:.4g}, which is not the idle share of the step. "
                "Check it on p=2, m=1 by drawing the timeline."
            )
    passed(f"Right on fresh random (p, m) = {cases}.")


def exercise_3(microbatches) -> None:
    """p=8: the fewest micro-batches with a bubble of at most 10%."""
    m = as_int(microbatches, "microbatches")
    if m < 1:
        fail("`microbatches` counts micro-batches: at least 1.")
    if _bubble(8, m) > 0.1 + 1e-12:
        fail(
            f"With m = {m} the bubble is still above 10%. Solve (p-1)/(m+p-1) <= 0.1 for m, "
            "or try larger values with your gpipe_bubble function."
        )
    if _bubble(8, m - 1) <= 0.1 + 1e-12:
        fail(f"m = {m} works, but fewer micro-batches would too: the question asks for the fewest.")
    passed(
        f"Right: m = {m} gives a bubble of exactly 10%; that is about 8 micro-batches per stage."
    )


def exercise_4(max_microbatches, bubble_at_max) -> None:
    """Largest m under a 30 GB activation budget (1.5 GB per micro-batch) and its bubble."""
    m = as_int(max_microbatches, "max_microbatches")
    b = _number_between_0_and_1(bubble_at_max, "bubble_at_max")
    if m != 20:
        if m == 53:
            fail("80 / 1.5 forgets the 50 GB of model state already on the GPU.")
        if m == 33:
            fail("50 / 1.5 uses the model state as the budget: what is left for activations?")
        if m == 5:
            fail(
                "That would be the budget if only p micro-batches were in flight (1F1B, next "
                "lesson). In GPipe, how many micro-batches' activations does stage 0 hold "
                "when its last forward ends?"
            )
        fail(
            "`max_microbatches` is not right. Stage 0 holds the activations of every micro-batch "
            "it has forwarded and not yet backwarded: how many at the peak, in GPipe?"
        )
    if not close(b, _bubble(4, m)):
        fail("`max_microbatches` is right; now put it into the bubble formula with p = 4.")
    passed(f"Right: 20 micro-batches fit (30 GB / 1.5 GB), leaving a bubble of {b:.1%}.")


LEFT_CAUSES = ("a", "b", "c", "d")
RIGHT_CAUSES = ("a", "b", "c", "d")


def exercise_5(left_cause, right_cause) -> None:
    """Explain both ends of the measured throughput-vs-micro-batches curve."""
    left = as_choice(left_cause, LEFT_CAUSES, "left_cause")
    right = as_choice(right_cause, RIGHT_CAUSES, "right_cause")
    if left != "a":
        fail(
            f"`left_cause` = {left!r} is not it. With one or two micro-batches, look at the "
            "measured Gantt chart: how many devices compute at the same time?"
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


def exercise_6(efficiency, busiest_device) -> None:
    """Read a simulated timeline with an unbalanced last stage: efficiency and busiest device."""
    from course_utils.pipeline.schedules import make_schedule
    from course_utils.pipeline.simulate import CostModel, simulate

    eff = _number_between_0_and_1(efficiency, "efficiency")
    dev = as_int(busiest_device, "busiest_device")
    timeline = simulate(
        make_schedule("gpipe", 3, 4), CostModel(stage_forward=[1, 1, 2], stage_backward=[2, 2, 4])
    )
    busy = [timeline.busy(d) for d in range(3)]
    want = sum(busy) / (3 * timeline.makespan)
    if dev not in range(3):
        fail("`busiest_device` is a device number: 0, 1 or 2.")
    if dev != busy.index(max(busy)):
        fail("`busiest_device` is not right: which row of the chart has the least grey?")
    if not close(eff, want, rel=2e-3):
        if close(eff, 1 - want, rel=2e-3):
            fail("That is the bubble (idle share). Efficiency is the busy share.")
        if close(eff, 4 / 6, rel=2e-3):
            fail(
                "That is the equal-stage formula m/(m+p-1). These stages are not equal: add "
                "up the busy time of every device and compare with devices x makespan."
            )
        fail(
            "`busiest_device` is right, `efficiency` is not. Efficiency = total busy time of "
            "all devices / (number of devices x makespan); read both off the chart."
        )
    passed(
        f"Right: {eff:.1%} efficiency. The slow last stage sets the pace; the other two devices "
        "wait for it even in the middle of the step."
    )


__all__ = [f"exercise_{k}" for k in range(1, 7)]
