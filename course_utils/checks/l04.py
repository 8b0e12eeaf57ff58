"""Checks for the exercises of lesson 04 (1F1B, activation memory, the zero-bubble split).

Each `exercise_K` is called by the check cell of Exercise 4.K in
`exercises/04_1f1b_zero_bubble.ipynb`, with the learner's variant `v`: `given_K(v)` draws the
exercise's numbers (the default student gets the course's own), and every expected answer
is computed from them, here or by the simulator. `cases_2(v)` are the inputs the Build
exercise's function is tried on. 1F1B is PipeDream-Flush (Narayanan et al. 2020,
arXiv 2006.09503); ZB-H1 is from "Zero Bubble Pipeline Parallelism" (Qi et al., ICLR 2024,
arXiv 2401.10241). The reference orders come from `course_utils.pipeline.schedules`.
"""

from __future__ import annotations

from course_utils.checks import (
    DEFAULT,
    Variant,
    as_choice,
    as_int,
    as_number,
    as_sequence,
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


def _makespan(p: int, m: int, forward: float, backward: float) -> float:
    # equal stages, free communication: GPipe and 1F1B both take (m + p - 1)(F + B)
    return (m + p - 1) * (forward + backward)


def _count(value, what: str) -> int:
    number = as_int(value, what)
    if number < 0:
        fail(f"`{what}` counts micro-batches: it cannot be negative.")
    return number


# --------------------------------------------------------------------------- 4.1


def given_1(v: Variant = DEFAULT) -> dict:
    return {"p": v.pick("1p", 5, [4, 5, 6, 7]), "m": v.pick("1m", 12, [9, 10, 14, 16])}


def exercise_1(peak_gpipe, peak_1f1b, v: Variant = DEFAULT) -> None:
    """The most micro-batches each device holds at once, GPipe and 1F1B, for the given p, m."""
    p, m = given_1(v).values()
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
    want = [min(m, p - d) for d in range(p)]
    if one_f == want:
        passed(
            f"Right: GPipe holds all {m} micro-batches on every device; 1F1B holds p - d, at "
            f"most {p} on device 0, however large m gets."
        )
        return
    if one_f == [m] * p:
        fail("`peak_gpipe` is right. `peak_1f1b` copies it, but 1F1B starts backwards early.")
    if one_f == sorted(one_f) and one_f != sorted(one_f, reverse=True):
        fail(
            "`peak_gpipe` is right. `peak_1f1b` grows with the device number, but device 0 "
            "is the one that waits longest for its first gradient to come back."
        )
    if one_f == [w - 1 for w in want]:
        fail(
            "`peak_gpipe` is right. `peak_1f1b` is one short on every device: the steady "
            "phase starts with a forward, so count the warm-up forwards plus that one."
        )
    if one_f == [w + 1 for w in want]:
        fail(
            "`peak_gpipe` is right. `peak_1f1b` is one too many on every device: device d "
            "runs p - 1 - d warm-up forwards, then ONE steady forward before its first backward."
        )
    if len(set(one_f)) == 1:
        fail(
            "`peak_gpipe` is right. `peak_1f1b` is the same on every device, but a later "
            "device gets its first gradient back sooner: it needs fewer warm-up forwards."
        )
    fail(
        "`peak_gpipe` is right, `peak_1f1b` is not yet. For device d: how many forwards "
        "does it run before its first backward? It holds no more than that afterwards."
    )


# --------------------------------------------------------------------------- 4.2


def phases(p: int, m: int, d: int) -> tuple[list[str], list[str], list[str]]:
    """The three phases of device d's 1F1B order: warm-up, steady (F, B pairs), cool-down."""
    warm = min(p - 1 - d, m)
    warmup = [f"{d}F{i}" for i in range(warm)]
    steady = [a for i in range(m - warm) for a in (f"{d}F{warm + i}", f"{d}B{i}")]
    cooldown = [f"{d}B{i}" for i in range(m - warm, m)]
    return warmup, steady, cooldown


def cases_2(v: Variant = DEFAULT) -> dict[str, list[tuple]]:
    rng = v.cases("2")
    cases = [(4, 8, 0), (4, 8, 3), (1, rng.randint(1, 5), 0)]
    for _ in range(6):
        p = rng.randint(2, 8)
        cases.append((p, rng.randint(1, 16), rng.randrange(p)))
    cases.append((6, 3, 1))  # fewer micro-batches than stages
    p = rng.randint(5, 8)
    cases.append((p, rng.randint(1, p - 2), rng.randrange(2)))  # m < p - 1 - d: no steady phase
    return {"one_f_one_b": cases}


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


def _three_phases(result, shown: str) -> list[list[str]]:
    from course_utils.actions import Action

    items = as_sequence(result, f"the result of {shown}")
    if items and all(isinstance(x, str | Action) for x in items):
        fail(
            f"{shown} returned one flat list of actions. Return the three phases as three "
            "lists, (warm-up, steady, cool-down), so the check can see where each one ends."
        )
    if len(items) != 3:
        fail(
            f"{shown} returned {len(items)} items. Return three lists: the warm-up forwards, "
            "the steady phase (forward, backward, forward, backward, ...) and the cool-down."
        )
    names = ("warm-up", "steady", "cool-down")
    return [
        as_sequence(part, f"the {name} phase of {shown}", item=_as_action_text)
        for name, part in zip(names, items, strict=True)
    ]


def exercise_2(one_f_one_b, v: Variant = DEFAULT) -> None:
    """Build one_f_one_b(p, m, d): device d's 1F1B order as (warm-up, steady, cool-down)."""
    call = check_function(one_f_one_b, "one_f_one_b")
    cases = cases_2(v)["one_f_one_b"]
    for p, m, d in cases:
        shown = f"one_f_one_b({p}, {m}, {d})"
        got = _three_phases(call(p, m, d), shown)
        want = [list(x) for x in phases(p, m, d)]
        if got == want:
            continue
        flat, want_flat = [a for part in got for a in part], [a for part in want for a in part]
        if flat == want_flat:
            lengths = ", ".join(str(len(x)) for x in want)
            fail(
                f"{shown} has the right order, cut into phases at the wrong places. The "
                "warm-up is the forwards before the first steady pair; the steady phase "
                "alternates a forward and a backward; the cool-down is the backwards left "
                f"(here {lengths} actions)."
            )
        if len(flat) != 2 * m:
            fail(
                f"{shown} returned {len(flat)} actions. Device {d} runs one forward and one "
                f"backward for each of the {m} micro-batches."
            )
        if sorted(flat) != sorted(want_flat):
            fail(
                f"{shown} does not contain exactly one F and one B of stage {d} for each "
                "micro-batch 0 .. m-1. (Device d runs stage d.)"
            )
        warm_got = next((i for i, a in enumerate(flat) if "B" in a), len(flat))
        warm_want = next(i for i, a in enumerate(want_flat) if "B" in a)
        if warm_got != warm_want:
            more = "many" if warm_got > warm_want else "few"
            fail(
                f"{shown} runs {warm_got} forwards before its first backward: too {more}. "
                "How many forwards can device d start before the gradient of micro-batch 0 "
                "returns from the last stage? Remember m can be smaller than p."
            )
        first = next(i for i, (a, b) in enumerate(zip(flat, want_flat, strict=True)) if a != b)
        fail(
            f"{shown} starts well but goes wrong at position {first} ({flat[first]!r}). After "
            "the warm-up, alternate: one forward of the next new micro-batch, then one "
            "backward of the oldest one still held; then the cool-down runs the last backwards."
        )
    shown = ", ".join(str(c) for c in cases)
    passed(f"Right on fresh random (p, m, d) = {shown}: every phase in its place.")


# --------------------------------------------------------------------------- 4.3


def given_3(v: Variant = DEFAULT) -> dict:
    return {
        "p": v.pick("3p", 4, [3, 5, 6]),
        "m": v.pick("3m", 6, [5, 7, 8, 10]),
        "t_f": v.pick("3f", 1.0, [1.0, 2.0]),
        "t_b": v.pick("3b", 2.0, [3.0, 4.0]),
    }


def exercise_3(makespan_gpipe, makespan_1f1b, bubble_1f1b, v: Variant = DEFAULT) -> None:
    """Equal stages, the given p, m, t_F, t_B: both makespans and 1F1B's bubble fraction."""
    p, m, f, b = given_3(v).values()
    want = _makespan(p, m, f, b)
    one_too_many = (m + p) * (f + b)
    gpipe = as_number(makespan_gpipe, "makespan_gpipe")
    if not is_right(gpipe, want):
        if is_right(gpipe, m * (f + b)):
            fail("`makespan_gpipe` is only the busy time of one device: add its idle time.")
        if is_right(gpipe, one_too_many):
            fail(
                "`makespan_gpipe` counts one slot too many. The fill and the drain add p - 1 "
                "slots to the m micro-batches (the first device's forward is not waiting)."
            )
        expect_number(gpipe, want, "makespan_gpipe")
        fail(
            "`makespan_gpipe` is not right yet. Lesson 03's step time: the fill and the "
            "drain add p - 1 slots to the m micro-batches, each slot one forward + one backward."
        )
    one_f = as_number(makespan_1f1b, "makespan_1f1b")
    if not is_right(one_f, want):
        if one_f < want and not is_right(one_f, want):
            expect_number(one_f, want, "makespan_1f1b")
            fail(
                "`makespan_gpipe` is right. `makespan_1f1b` is too short: 1F1B changes the "
                "order of work, not the fill and drain. Does the last device get micro-batch 0 "
                "earlier?"
            )
        if is_right(one_f, one_too_many):
            fail(
                "`makespan_gpipe` is right. `makespan_1f1b` counts one slot too many: 1F1B "
                "has the same fill and drain as GPipe."
            )
        expect_number(one_f, want, "makespan_1f1b")
        fail("`makespan_gpipe` is right, `makespan_1f1b` is not: compare the two Gantt charts.")
    bubble_want = (p - 1) / (m + p - 1)
    bubble = as_number(bubble_1f1b, "bubble_1f1b")
    if not is_right(bubble, bubble_want):
        if is_right(bubble, (p - 1) / m):
            fail(
                "Both makespans are right. `bubble_1f1b` = (p-1)/m is relative to the busy "
                "time; the question asks for the idle share of the whole step."
            )
        expect_number(bubble, bubble_want, "bubble_1f1b", unit="fraction")
        if not 0 <= bubble <= 1:
            fail(f"`bubble_1f1b` is a fraction of the step: between 0 and 1, not {bubble:g}.")
        fail("Both makespans are right. `bubble_1f1b`: idle time of a device / step time.")
    passed(
        f"Right: {want:g} units for both. 1F1B keeps GPipe's bubble ({bubble_want:.1%} of the "
        "step here); what it saves is memory."
    )


# --------------------------------------------------------------------------- 4.4


def given_4(v: Variant = DEFAULT) -> dict:
    # W <= min(F, I) in every variant: the condition of the ZB-H1 formula
    return {
        "p": v.pick("4p", 4, [3, 5, 6]),
        "m": v.pick("4m", 10, [8, 12]),
        "t_f": v.pick("4f", 2.0, [1.5, 2.5, 3.0]),
        "t_i": v.pick("4i", 2.0, [2.5, 3.0]),
        "t_w": v.pick("4w", 1.5, [0.5, 1.0]),
    }


def exercise_4(idle_1f1b, idle_zb, v: Variant = DEFAULT) -> None:
    """Idle time per device of 1F1B and of ZB-H1, with the given p, m, t_F, t_I, t_W."""
    p, _m, f, i, w = given_4(v).values()
    want_1f1b, want_zb = (p - 1) * (f + i + w), (p - 1) * (f + i - w)
    one_f = as_number(idle_1f1b, "idle_1f1b")
    if not is_right(one_f, want_1f1b):
        if is_right(one_f, (p - 1) * (f + i)):
            fail(
                "`idle_1f1b` leaves out W. 1F1B does not split the backward: each of its "
                "backward slots takes I + W."
            )
        expect_number(one_f, want_1f1b, "idle_1f1b")
        fail(
            "`idle_1f1b` is not right yet. With equal stages each device idles p - 1 "
            "forward slots and p - 1 backward slots; a 1F1B backward is I + W long."
        )
    zb = as_number(idle_zb, "idle_zb")
    if not is_right(zb, want_zb):
        if is_right(zb, want_1f1b):
            fail("`idle_1f1b` is right. `idle_zb` equals it, but ZB-H1 fills part of the bubble.")
        if is_right(zb, (p - 1) * (f + i)):
            fail(
                "`idle_1f1b` is right. `idle_zb` is the bubble if W were only moved out of the "
                "way; ZB-H1 also runs W's inside the remaining gaps. What does that subtract?"
            )
        if is_right(zb, (p - 1) * f) or zb == 0:
            fail(
                "`idle_1f1b` is right. `idle_zb` is too optimistic for ZB-H1: it keeps 1F1B's "
                "memory bound, so not every gap can be filled with W."
            )
        expect_number(zb, want_zb, "idle_zb")
        fail(
            "`idle_1f1b` is right, `idle_zb` is not yet. Use the lesson's formula for ZB-H1's "
            "idle time (its condition W <= min(F, I) holds here), or simulate "
            "make_schedule('zb-h1', p, m) with these costs."
        )
    passed(
        f"Right: {want_1f1b:g} units for 1F1B, {want_zb:g} for ZB-H1. Splitting the backward "
        "and delaying W shortened the idle time with no more activation memory than 1F1B's "
        "device 0."
    )


# --------------------------------------------------------------------------- 4.5

PROBLEMS_5 = ("a", "b", "c", "d")
FIXES_5 = ("a", "b", "c", "d")


def exercise_5(oom_cause, oom_fix, v: Variant = DEFAULT) -> None:
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


# --------------------------------------------------------------------------- 4.6

PROBLEMS_6 = ("a", "b", "c", "d")
FIXES_6 = ("a", "b", "c", "d")


def exercise_6(zb_problem, zb_fix, v: Variant = DEFAULT) -> None:
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
