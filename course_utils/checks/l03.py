"""Checks for lesson 03's exercises (the pipeline bubble and the micro-batch trade-off).

The bubble formula is GPipe's with equal stages (Huang et al. 2018, arXiv 1811.06965):
(p - 1) / (m + p - 1), the idle share of the step.
"""

from __future__ import annotations

import math

from course_utils import checks
from course_utils.checks import DEFAULT, OTHERWISE, Variant, exercise, fail, judge, numbers, pick
from course_utils.checks.pipeline_cases import BudgetCase
from course_utils.checks.programs import as_program, drawn_case

for_student = checks.lesson_checks(__name__)


def _bubble(p: int, m: int) -> float:
    return (p - 1) / (m + p - 1)


# p = 4 only for the default student (m = 12): lesson 03 works GPipe on p = 4, m = 4 and 8.
# (7 stands where 4 stood: every other student keeps the numbers drawn before.)
given_1 = numbers(p=pick("1p", 4, [3, 7, 5, 6, 8]), m=pick("1m", 12, [6, 8, 10, 16, 20]))


@exercise(given_1, bubble_fraction="number")
def exercise_1(g, bubble_fraction) -> str:
    """GPipe with the given p and m, equal stages: the bubble fraction."""
    p, m = g.p, g.m
    want, fill = _bubble(p, m), p / (m + p)
    hints = {
        f"{p - 1}/{m} is the bubble relative to the ideal (busy) time. The question asks for "
        "the idle share of the whole step: divide by the step's length in slots "
        "instead.": (p - 1) / m,
        "Count the fill slots again: with p stages, how many slots until the last starts?": fill,
        "Not yet. Per device, count busy slots (one per micro-batch) and idle slots (the "
        "fill and drain); the bubble is idle over all slots.": OTHERWISE,
    }
    judge(bubble_fraction, want, "bubble_fraction", hints, unit="fraction")
    return f"Right: {p - 1} idle slots out of {m + p - 1} per device, a bubble of {want:.1%}."


# Inputs no simulation can reach in time: the function must compute the formula.
HUGE = [(10**6, 10**9), (123_457, 10**8)]


def cases_2(variant: Variant = DEFAULT) -> dict[str, list[tuple]]:
    rng = variant.cases("2")
    small = [(1, rng.randint(1, 8))] + [(rng.randint(2, 16), rng.randint(1, 64)) for _ in range(6)]
    return {"gpipe_bubble": [*small, *HUGE]}


@exercise(gpipe_bubble="function", partial=True)
def exercise_2(gpipe_bubble, variant) -> str:
    """Build gpipe_bubble(p, m): any p >= 1, m >= 1, up to millions of stages."""
    cases = cases_2(variant)["gpipe_bubble"]
    why = "The check also tries a million stages: compute the bubble from p and m with the "
    why += "formula, do not simulate."
    for (p, m), shown, result in checks.each_call(gpipe_bubble, cases, HUGE, why):
        value = checks.as_number(result, shown)
        if math.isclose(value, _bubble(p, m), rel_tol=1e-9, abs_tol=1e-12):
            continue
        if p > 1 and math.isclose(value, (p - 1) / m, rel_tol=1e-9):
            fail(f"{shown} gives (p-1)/m: that is relative to the busy time, not the step.")
        if p == 1:
            fail(f"{shown} should be 0: a single device never waits for another one.")
        fail(
            f"{shown} returned {value:.4g}, which is not the idle share of the step. "
            "Check it on p=2, m=1 by drawing the timeline."
        )
    small = ", ".join(f"({p}, {m})" for p, m in cases[: -len(HUGE)])
    return f"Right on random (p, m) = {small}, and on a million stages."


given_3 = numbers(
    p=pick("3p", 8, [4, 6, 10, 12, 16]), target=pick("3t", 0.1, [0.05, 0.1, 0.2, 0.25])
)


@exercise(given_3, microbatches="whole number")
def exercise_3(g, microbatches) -> str:
    """The fewest micro-batches whose bubble is at most the target, for the given p."""
    p, target, m = g.p, g.target, microbatches
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
    return f"Right: m = {m} is the fewest; its bubble is {_bubble(p, m):.1%}."


# p, m and the GPUs of the learner's pipeline (the lesson works GPipe on p = 4, m = 4 and 8):
# room for 2 to 4 micro-batches, fewer than m, so that the step takes rounds.
given_4 = numbers(
    pick(
        "4",
        (4, 10, 80, 74.0, 1.5),
        [
            (3, 9, 40, 35.5, 1.25),
            (4, 11, 48, 42.0, 2.0),
            (3, 7, 96, 90.0, 1.5),
            (5, 9, 80, 75.0, 2.5),
        ],
        "p",
        "m",
        "gpu_gb",
        "state_gb",
        "per_microbatch_gb",
    )
)


def room(g) -> int:
    """How many micro-batches' activations fit on stage 0 beside the model state."""
    return math.floor((g.gpu_gb - g.state_gb) / g.per_microbatch_gb + 1e-9)


def equal_stages(g) -> dict:
    """g.p equal stages, one linear layer each: each round's bubble is (p-1)/(k+p-1)."""
    return {"devices": g.p, "depth": g.p - 1, "d_in": 24, "hidden": 24, "classes": 24}


def case_4(g) -> BudgetCase:
    """The learner's own pipeline: `g.p` ranks, `g.m` micro-batches of two rows, room for
    `room(g)` of them."""
    return BudgetCase(**equal_stages(g), microbatches=g.m, batch=2 * g.m, seed=3, budget=room(g))


def cases_4(variant: Variant = DEFAULT) -> dict[str, list[tuple]]:
    """The learner's own pipeline, then two more (one whose budget divides m): drawn from the
    student's name in a notebook, secret in the grader."""
    rng = variant.cases("4")
    cases = [case_4(given_4(variant))]
    for divides in (False, True):
        budget = rng.randint(2, 3)
        m = budget * rng.randint(2, 3) + (0 if divides else rng.randint(1, budget - 1))
        drawn = drawn_case(rng, rng.randint(2, 4), m)
        cases.append(BudgetCase(**vars(drawn) | {"budget": budget}))
    return {"rounds_program": [(case,) for case in cases]}


ADVICE_4 = {
    "deadlock": "Follow one round through your program, rank by rank: every rank runs the same "
    "rounds, and every receive comes after the send it waits for, on the other rank.",
    "tag": "Micro-batches received in the wrong order: a rank gets a neighbour's messages in "
    "the order they were sent, so each rank takes the rounds, and the micro-batches in each, "
    "in the same order.",
}


@exercise(given_4, budget="whole number", rounds_program=as_program, partial=True)
def exercise_4(g, budget, rounds_program, variant) -> str:
    """The micro-batches that fit on a GPU, and GPipe run in rounds of that many."""
    from course_utils.checks import pipeline_hints, rounds_build
    from course_utils.checks.programs import evidence

    p, gpu, state, per = g.p, g.gpu_gb, g.state_gb, g.per_microbatch_gb
    k = room(g)
    whole, state_only = (math.floor(x / per + 1e-9) for x in (gpu, state))
    hints = {
        f"{gpu:g} / {per:g} forgets the {state:g} GB of model state already on the GPU.": whole,
        f"{state:g} / {per:g} uses the model state as the budget: what is left for "
        "activations?": state_only,
        "`budget` is not right. Stage 0 holds the activations of every micro-batch it has "
        "forwarded and not yet backwarded: how many of them fit beside the model state?": OTHERWISE,
    }
    fields = checks.Fields()  # every wrong answer named at once
    with fields.judging():
        judge(budget, k, "budget", hints)
    with fields.judging():
        cases = cases_4(variant)["rounds_program"]
        for (case,), shown, got in checks.each_call(rounds_program, cases):
            run = evidence(got, shown, case)
            alone = None if run["failure"] else rounds_build.last_round_alone(run, case)
            if alone is not None:
                fail(
                    f"{shown}: every rank's gradients are those of its last round alone "
                    f"(micro-batches {alone}): the gradients were cleared between rounds. "
                    "They add up over the rounds as over the micro-batches of one round: "
                    "clear nothing until the step ends."
                )
            run = pipeline_hints.judged_run(got, shown, case, ADVICE_4)
            rounds_build.judge(shown, run, case)
    fields.verdict()
    rounds = math.ceil(g.m / k)
    return (
        f"Right: {k} micro-batches fit ({gpu - state:g} GB / {per:g} GB), so your {g.m} "
        f"micro-batches take {rounds} rounds on your {p} ranks and on two other pipelines, "
        "with one device's gradients and no rank ever over its room. Each round pays the "
        f"fill and drain again: a bubble of {_bubble(p, k):.1%} with equal stages, against "
        f"{_bubble(p, g.m):.1%} for one step of all {g.m} if they fitted."
    )


@exercise(
    left_cause={
        "a": checks.RIGHT,
        OTHERWISE: "With one or two micro-batches, look at the reference Gantt chart: how "
        "many devices compute at the same time?",
    },
    right_cause={
        "b": checks.RIGHT,
        "a": "The bubble keeps shrinking as m grows: it cannot explain a drop on the right.",
        "c": "The global batch is fixed, so the activation memory does not grow here.",
        "d": "Every point runs the same samples through the same model: the work is equal.",
    },
    partial=True,
)
def exercise_5(left_cause, right_cause) -> str:
    """Explain both ends of the reference throughput-vs-micro-batches curve."""
    return (
        "Right: few micro-batches leave devices idle in the bubble; many tiny ones each pay a "
        "fixed overhead and use the hardware poorly. The best m is in between."
    )


given_6 = numbers(m=pick("6m", 4, [3, 5, 6]), heavy=pick("6h", 2, [2, 3]))


def _unbalanced(variant: Variant):
    from course_utils.pipeline import CostModel, make_schedule, simulate

    m, heavy = given_6(variant).values()
    costs = CostModel(stage_forward=[1, 1, heavy], stage_backward=[2, 2, 2 * heavy])
    return simulate(make_schedule("gpipe", 3, m), costs)


@exercise(given_6, efficiency="number", busiest_device="whole number", partial=True)
def exercise_6(g, efficiency, busiest_device, variant) -> str:
    """A simulated GPipe timeline with a heavy last stage: efficiency and busiest device."""
    timeline = _unbalanced(variant)
    busy = [timeline.busy(d) for d in range(3)]
    want = sum(busy) / (3 * timeline.makespan)
    hints = {
        "`efficiency` is the bubble (idle share). Efficiency is the busy share.": 1 - want,
        "`efficiency` is the equal-stage formula m/(m+p-1). These stages are not equal: add "
        "up the busy time of every device and compare with devices x makespan.": g.m / (g.m + 2),
        "`efficiency` is not right. Efficiency = total busy time of all devices / (number of "
        "devices x makespan); read both off the chart.": OTHERWISE,
    }
    fields = checks.Fields()  # every wrong answer named at once
    with fields.judging():
        judge(efficiency, want, "efficiency", hints, unit="fraction")
    with fields.judging():
        if busiest_device not in range(3):
            fail("`busiest_device` is a device number: 0, 1 or 2.")
        if busiest_device != busy.index(max(busy)):
            fail("`busiest_device` is not right: which row of the chart has the least grey?")
    fields.verdict()
    return (
        f"Right: {want:.1%} efficiency. The slow last stage sets the pace; the other two devices "
        "wait for it even in the middle of the step."
    )
