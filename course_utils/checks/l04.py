"""Checks for the exercises of lesson 04 (1F1B, activation memory, the zero-bubble split).

Each `exercise_K` is called by the check cell of Exercise 4.K in
`exercises/04_1f1b_zero_bubble.ipynb`. 1F1B is PipeDream-Flush (Narayanan et al. 2021,
arXiv 2006.09503); ZB-H1 is from "Zero Bubble Pipeline Parallelism" (Qi et al. 2023,
arXiv 2401.10241). The reference orders come from `course_utils.pipeline.schedules`.
"""

from __future__ import annotations

import random

from course_utils.checks import (
    as_choice,
    as_int,
    as_number,
    as_sequence,
    check_function,
    close,
    expect_choice,
    fail,
    passed,
)


def _makespan(p: int, m: int, forward: float, backward: float) -> float:
    # equal stages, free communication: GPipe and 1F1B both take (m + p - 1)(F + B)
    return (m + p - 1) * (forward + backward)


def _count(value, what: str) -> int:
    number = as_int(value, what)
    if number < 0:
        fail(f"`{what}` counts micro-batches: it cannot be negative.")
    return number


def exercise_1(peak_gpipe, peak_1f1b) -> None:
    """p=5, m=12: the most micro-batches each device holds at once, GPipe and 1F1B."""
    p, m = 5, 12
    gpipe = as_sequence(peak_gpipe, "peak_gpipe", length=p, item=_count)
    one_f = as_sequence(peak_1f1b, "peak_1f1b", length=p, item=_count)
    if gpipe != [m] * p:
        if gpipe == [p] * p or gpipe == list(range(p, 0, -1)):
            fail(
                "`peak_gpipe` is not right: that is what a schedule that starts backwards "
                "early holds. In GPipe, what does every device do before its first backward?"
            )
        fail(
            "`peak_gpipe` is not right yet. In GPipe a device runs every forward before its "
            "first backward: how many micro-batches is it holding when that backward starts?"
        )
    if one_f == [m] * p:
        fail("`peak_gpipe` is right. `peak_1f1b` copies it, but 1F1B starts backwards early.")
    if one_f == sorted(one_f) and one_f != sorted(one_f, reverse=True):
        fail(
            "`peak_gpipe` is right. `peak_1f1b` grows with the device number, but device 0 "
            "is the one that waits longest for its first gradient to come back."
        )
    if one_f == list(range(p - 1, -1, -1)):
        fail(
            "`peak_gpipe` is right. `peak_1f1b` is one short on every device: the steady "
            "phase starts with a forward, so count the warm-up forwards plus that one."
        )
    if len(set(one_f)) == 1:
        fail(
            "`peak_gpipe` is right. `peak_1f1b` is the same on every device, but a later "
            "device gets its first gradient back sooner: it needs fewer warm-up forwards."
        )
    if one_f != list(range(p, 0, -1)):
        fail(
            "`peak_gpipe` is right, `peak_1f1b` is not yet. For device d: how many forwards "
            "does it run before its first backward? It holds no more than that afterwards."
        )
    passed(
        "Right: GPipe holds all 12 micro-batches on every device; 1F1B holds p - d, at most "
        "5 on device 0, however large m gets."
    )


def _reference(p: int, m: int, d: int) -> list[str]:
    from course_utils.pipeline.schedules import make_schedule

    return [str(a) for a in make_schedule("1f1b", p, m).devices[d]]


def _as_action_text(value, what: str) -> str:
    from course_utils.actions import Action
    from course_utils.errors import CourseInputError

    try:
        return str(Action.parse(value))
    except CourseInputError:
        fail(
            f"`{what}` is {value!r}, which is not an action. Write each action as a string "
            "like '1F0' (stage 1, forward, micro-batch 0) or '1B3'."
        )


def exercise_2(one_f_one_b) -> None:
    """Build one_f_one_b(p, m, d): device d's 1F1B order, as action strings."""
    call = check_function(one_f_one_b, "one_f_one_b")
    rng = random.Random()
    cases = [(4, 8, 0), (4, 8, 3), (1, rng.randint(1, 5), 0)]
    for _ in range(7):
        p = rng.randint(2, 8)
        cases.append((p, rng.randint(1, 16), rng.randrange(p)))
    cases.append((6, 3, 1))  # fewer micro-batches than stages
    for p, m, d in cases:
        shown = f"one_f_one_b({p}, {m}, {d})"
        got = as_sequence(call(p, m, d), shown, item=_as_action_text)
        want = _reference(p, m, d)
        if got == want:
            continue
        if len(got) != 2 * m:
            fail(
                f"{shown} returned {len(got)} actions. Device {d} runs one forward and one "
                f"backward for each of the {m} micro-batches."
            )
        if sorted(got) != sorted(want):
            fail(
                f"{shown} does not contain exactly one F and one B of stage {d} for each "
                "micro-batch 0 .. m-1. (Device d runs stage d.)"
            )
        warm_got = next((i for i, a in enumerate(got) if "B" in a), len(got))
        warm_want = next(i for i, a in enumerate(want) if "B" in a)
        if warm_got != warm_want:
            more = "many" if warm_got > warm_want else "few"
            fail(
                f"{shown} runs {warm_got} forwards before its first backward: too {more}. "
                "How many forwards can device d start before the gradient of micro-batch 0 "
                "returns from the last stage? Remember m can be smaller than p."
            )
        first = next(i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b)
        fail(
            f"{shown} starts well but goes wrong at position {first} ({got[first]!r}). After "
            "the warm-up, alternate: one forward of the next new micro-batch, then one "
            "backward of the oldest one still held; then the cool-down runs the last backwards."
        )
    passed(f"Right on fresh random (p, m, d) = {cases}.")


def exercise_3(makespan_gpipe, makespan_1f1b, bubble_1f1b) -> None:
    """p=4, m=6, F=1, B=2: both makespans and 1F1B's bubble fraction."""
    p, m, f, b = 4, 6, 1.0, 2.0
    want = _makespan(p, m, f, b)
    gpipe = as_number(makespan_gpipe, "makespan_gpipe")
    one_f = as_number(makespan_1f1b, "makespan_1f1b")
    bubble = as_number(bubble_1f1b, "bubble_1f1b")
    if not close(gpipe, want):
        if close(gpipe, m * (f + b)):
            fail("`makespan_gpipe` is only the busy time of one device: add its idle time.")
        fail(
            "`makespan_gpipe` is not right yet. Lesson 03's step time: the fill and the "
            "drain add p - 1 slots to the m micro-batches, each slot one forward + one backward."
        )
    if not close(one_f, want):
        if one_f < want:
            fail(
                "`makespan_gpipe` is right. `makespan_1f1b` is too short: 1F1B changes the "
                "order of work, not the fill and drain. Does device 3 get micro-batch 0 earlier?"
            )
        fail("`makespan_gpipe` is right, `makespan_1f1b` is not: compare the two Gantt charts.")
    if not 0 <= bubble <= 1:
        fail(f"`bubble_1f1b` is a fraction of the step: between 0 and 1, not {bubble:g}.")
    if not close(bubble, (p - 1) / (m + p - 1)):
        if close(bubble, (p - 1) / m):
            fail(
                "Both makespans are right. `bubble_1f1b` = (p-1)/m is relative to the busy "
                "time; the question asks for the idle share of the whole step."
            )
        fail("Both makespans are right. `bubble_1f1b`: idle time of a device / step time.")
    passed(
        "Right: 27 units for both. 1F1B keeps GPipe's bubble (1/3 of the step here); what it "
        "saves is memory."
    )


def exercise_4(idle_1f1b, idle_zb) -> None:
    """p=4, F=2, I=2, W=1.5: idle time per device of 1F1B and of ZB-H1."""
    p, f, i, w = 4, 2.0, 2.0, 1.5
    one_f = as_number(idle_1f1b, "idle_1f1b")
    zb = as_number(idle_zb, "idle_zb")
    if not close(one_f, (p - 1) * (f + i + w)):
        if close(one_f, (p - 1) * (f + i)):
            fail(
                "`idle_1f1b` leaves out W. 1F1B does not split the backward: each of its "
                "backward slots takes I + W."
            )
        fail(
            "`idle_1f1b` is not right yet. With equal stages each device idles p - 1 "
            "forward slots and p - 1 backward slots; a 1F1B backward is I + W long."
        )
    if close(zb, one_f):
        fail("`idle_1f1b` is right. `idle_zb` equals it, but ZB-H1 fills part of the bubble.")
    if not close(zb, (p - 1) * (f + i - w)):
        if close(zb, (p - 1) * (f + i)):
            fail(
                "`idle_1f1b` is right. `idle_zb` is the bubble if W were only moved out of the "
                "way; ZB-H1 also runs W's inside the remaining gaps. What does that subtract?"
            )
        if close(zb, (p - 1) * f) or close(zb, 0):
            fail(
                "`idle_1f1b` is right. `idle_zb` is too optimistic for ZB-H1: it keeps 1F1B's "
                "memory bound, so not every gap can be filled with W."
            )
        fail(
            "`idle_1f1b` is right, `idle_zb` is not yet. Use the lesson's formula for ZB-H1's "
            "bubble, or simulate make_schedule('zb-h1', 4, m) with these costs."
        )
    passed(
        f"Right: {one_f:g} units for 1F1B, {zb:g} for ZB-H1. Splitting the backward and "
        "delaying W cut the idle time by more than half, with no more activation memory."
    )


PROBLEMS_5 = ("a", "b", "c", "d")
FIXES_5 = ("a", "b", "c", "d")


def exercise_5(oom_cause, oom_fix) -> None:
    """GPipe p=4, m=12 runs out of activation memory: name the problem and the fix."""
    got_problem = as_choice(oom_cause, PROBLEMS_5, "oom_cause")
    got_fix = as_choice(oom_fix, FIXES_5, "oom_fix")
    expect_choice(
        got_problem,
        "b",
        {
            "a": "The bubble costs time, not memory: an idle device holds nothing extra.",
            "c": "Accumulated gradients take the size of the parameters once, whatever m is.",
            "d": "Read the chart again: in GPipe every device climbs to the same height.",
        },
        "`oom_cause` = {got!r} is not it. {hint}",
    )
    expect_choice(
        got_fix,
        "c",
        {
            "a": (
                "24 micro-batches of half the size: each device still holds the whole batch "
                "before its first backward, so the same bytes."
            ),
            "b": (
                "with 2 stages each device holds twice the layers, so every micro-batch "
                "leaves twice the activations, and it still holds all 12."
            ),
            "d": "a data-parallel replica runs the same schedule: the same memory per device.",
        },
        "`oom_cause` is right. `oom_fix` = {got!r} does not help: {hint}",
    )
    passed(
        "Right: GPipe holds all 12 micro-batches at the peak; 1F1B with the same m holds at "
        "most 4 (on device 0), under the budget, with the same bubble."
    )


PROBLEMS_6 = ("a", "b", "c", "d")
FIXES_6 = ("a", "b", "c", "d")


def exercise_6(zb_problem, zb_fix) -> None:
    """A split schedule with every W at the end: name the problem and the fix."""
    got_problem = as_choice(zb_problem, PROBLEMS_6, "zb_problem")
    got_fix = as_choice(zb_fix, FIXES_6, "zb_fix")
    expect_choice(
        got_problem,
        "b",
        {
            "a": "Compare the title's bubble with 1F1B's for p=4, m=8: it is smaller, not larger.",
            "c": "Every W comes after its own I here; the simulator would refuse the schedule "
            "otherwise.",
            "d": "The simulator finished the step and drew it: a deadlock has no chart.",
        },
        "`zb_problem` = {got!r} is not it. {hint}",
    )
    expect_choice(
        got_fix,
        "c",
        {
            "a": "W needs its own I first (it uses the output gradient I computed).",
            "b": "Smaller pieces of W still wait until the end: the micro-batches stay held.",
            "d": "That fixes the memory but brings back 1F1B's whole bubble. Keep the split "
            "and place each W better.",
        },
        "`zb_problem` is right. `zb_fix` = {got!r} is not the best: {hint}",
    )
    passed(
        "Right: a micro-batch's activations stay until its W, so W's parked at the end hold "
        "all m micro-batches. ZB-H1 runs each W a few slots after its I, inside the bubbles, "
        "and holds at most p."
    )


__all__ = [f"exercise_{k}" for k in range(1, 7)]
