"""Checks for the exercises of lesson 02 (micro-batching and the GPipe pipeline).

Each `exercise_K` is called by the check cell of Exercise 2.K in
`exercises/02_microbatching_gpipe.ipynb`. Schedules are graded with the course's own
simulator (`course_utils.pipeline.simulate`), so the feedback names the exact action that is wrong.
"""

from __future__ import annotations

import random

from course_utils.actions import Action
from course_utils.checks import (
    as_choice,
    as_number,
    as_sequence,
    check_function,
    close,
    fail,
    passed,
    require,
)
from course_utils.errors import CourseInputError


def _as_action(value, what: str) -> Action:
    require(value, what)
    try:
        return Action.parse(value)
    except CourseInputError:
        fail(f"`{what}` should be an action written like '1F0' or '0B1', but it is {value!r}.")


def _gpipe_starts(p: int, m: int) -> dict[Action, float]:
    from course_utils.pipeline.schedules import make_schedule
    from course_utils.pipeline.simulate import CostModel, simulate

    timeline = simulate(make_schedule("gpipe", p, m), CostModel(forward=1.0, backward=2.0))
    return {e.action: e.start for e in timeline.events if e.action.is_compute}


def exercise_1(order) -> None:
    """Order the compute actions of GPipe with 2 devices and 2 micro-batches by start time."""
    items = as_sequence(order, "order")
    actions = [_as_action(x, f"order[{i}]") for i, x in enumerate(items)]
    starts = _gpipe_starts(2, 2)
    unknown = [a for a in actions if a not in starts]
    if unknown:
        fail(
            f"{unknown[0]} does not happen in this pipeline: there are stages 0 and 1, "
            "micro-batches 0 and 1, and the kinds F and B."
        )
    seen = set()
    for a in actions:
        if a in seen:
            fail(f"{a} is listed twice: every action happens exactly once.")
        seen.add(a)
    missing = sorted(set(starts) - seen)
    if missing:
        fail(f"{len(missing)} of the 8 actions are missing, for example {missing[0]}.")
    for i, later in enumerate(actions):
        for earlier in actions[i + 1 :]:
            if starts[earlier] < starts[later]:
                if earlier.stage == later.stage:
                    why = f"both run on device {later.stage}, which can do one thing at a time"
                elif later.kind == "B" and earlier.kind == "F":
                    why = "GPipe runs every forward before the first backward"
                else:
                    why = "follow what each action needs: activations flow down, gradients up"
                fail(f"{later} is listed before {earlier}, but {earlier} starts first ({why}).")
    passed(
        "Right: forwards go down the pipeline one step behind each other, the backward starts "
        "at the last stage and the gradients climb back up. (Actions that start at the same "
        "moment may be listed in either order.)"
    )


def exercise_2(stage0_action, stage1_action) -> None:
    """4-stage GPipe, 8 micro-batches: what stages 0 and 1 start when 2F1 ends."""
    a0 = _as_action(stage0_action, "stage0_action")
    a1 = _as_action(stage1_action, "stage1_action")
    starts = _gpipe_starts(4, 8)
    moment = starts[Action(2, "F", 1)] + 1.0  # 2F1 ends one forward after it starts
    for got, stage, name in ((a0, 0, "stage0_action"), (a1, 1, "stage1_action")):
        if got.stage != stage:
            fail(f"`{name}` should be an action of stage {stage}, like '{stage}F0'.")
        want = next(a for a, t in starts.items() if a.stage == stage and t == moment)
        if got != want:
            if got.kind != "F":
                fail(f"`{name}` is not right: at that moment no backward has started anywhere.")
            if got.microbatch is None:
                fail(f"`{name}` = {got!r} needs a micro-batch number, like '{stage}F0'.")
            assert want.microbatch is not None  # the simulator's compute actions all have one
            off = got.microbatch - want.microbatch
            fail(
                f"`{name}` = {got} is {'ahead' if off > 0 else 'behind'}. Stage {stage} is "
                f"{2 - stage} step(s) ahead of stage 2 and starts a new micro-batch every "
                "forward time: count forward slots from time 0."
            )
    passed(
        f"Right: when 2F1 hands micro-batch 1 on, stage 1 starts {a1} and stage 0 starts {a0}: "
        "three stages busy on three different micro-batches at once."
    )


def exercise_3(gpipe_schedule) -> None:
    """Build gpipe_schedule(p, m) -> one list of action strings per device."""
    from course_utils.pipeline.simulate import validate

    call = check_function(gpipe_schedule, "gpipe_schedule")
    rng = random.Random()
    cases = [(2, 2)] + [(rng.randint(2, 5), rng.randint(1, 8)) for _ in range(5)]
    for p, m in cases:
        shown = f"gpipe_schedule({p}, {m})"
        devices = as_sequence(call(p, m), shown)
        if len(devices) != p:
            fail(f"{shown} returned {len(devices)} lists; there should be one per device ({p}).")
        lists = []
        for d, actions in enumerate(devices):
            items = as_sequence(actions, f"{shown}[{d}]")
            lists.append([_as_action(x, f"{shown}[{d}][{i}]") for i, x in enumerate(items)])
        problems = validate(lists, p, m)
        if problems:
            fail(f"{shown}: {problems[0]}")
        for d, actions in enumerate(lists):
            wrong_stage = [a for a in actions if a.stage != d]
            if wrong_stage:
                fail(f"{shown}: {wrong_stage[0]} is on device {d}, but stage s lives on device s.")
            kinds = [a.kind for a in actions]
            if "B" in kinds and "F" in kinds[kinds.index("B") :]:
                fail(
                    f"{shown}: device {d} runs a backward before its last forward. That order "
                    "can work, but it is not GPipe: all forwards first, then all backwards."
                )
    passed(f"Right on fresh random shapes (p, m) = {cases}: a valid GPipe schedule.")


def exercise_4(makespan, speedup) -> None:
    """GPipe, p=4, m=8, F=1, B=2: makespan in units and speed-up over naive."""
    t = as_number(makespan, "makespan")
    s = as_number(speedup, "speedup")
    p, m, f, b = 4, 8, 1.0, 2.0
    want_t = (m + p - 1) * (f + b)
    if not close(t, want_t, rel=1e-3):
        if close(t, m * (f + b), rel=1e-3):
            fail(
                "That is one device's busy time. The step also contains the time to fill the "
                "pipeline and drain it again: how many extra slots does that take?"
            )
        if close(t, p * m * (f + b), rel=1e-3):
            fail("That is the naive (unpipelined) step. With micro-batches the stages overlap.")
        fail(
            "`makespan` is not right. Draw the forward half: when does the last stage finish "
            "its last forward? The backward half is the mirror image, twice as slow."
        )
    want_s = p * m * (f + b) / want_t
    if not close(s, want_s, rel=5e-3):
        fail(
            "`makespan` is right, `speedup` is not. The naive schedule runs every stage on the "
            "whole batch one after the other: how long is that step?"
        )
    passed(f"Right: {t:g} units, a speed-up of {s:.2f} out of an ideal 4.")


PROBLEMS = ("a", "b", "c", "d")
FIXES = ("a", "b", "c", "d")


def exercise_5(problem, fix) -> None:
    """Diagnose a measured GPipe chart with unbalanced stages."""
    problem = as_choice(problem, PROBLEMS, "problem")
    fix = as_choice(fix, FIXES, "fix")
    hints = {
        "b": "Look again at which row has the most grey. Which device is almost never idle?",
        "c": (
            "The fill-and-drain bubble is at the start and end. Here one device also waits in "
            "the middle of the step: which one, and for what?"
        ),
        "d": "Handing a tensor between threads takes microseconds; these gaps are much longer.",
    }
    if problem != "a":
        fail(f"`problem` = {problem!r} is not it. {hints[problem]}")
    fix_hints = {
        "a": (
            "More micro-batches shrink the fill-and-drain bubble, but the slow stage still sets "
            "the pace of every micro-batch."
        ),
        "c": "The learning rate changes the maths of the update, not when devices compute.",
        "d": "Which stage is the slow one? Moving layers away from the fast stage makes it worse.",
    }
    if fix != "b":
        fail(f"`problem` is right. `fix` = {fix!r} is not: {fix_hints[fix]}")
    passed(
        "Right: a pipeline runs at the pace of its slowest stage. Balance the stages by measured "
        "cost (partition(..., balance='cost')), not by layer count."
    )


def exercise_6(scale) -> None:
    """Loss scale per micro-batch so accumulated gradients equal the full-batch gradient."""
    value = as_number(scale, "scale")
    if close(value, 0.25, rel=1e-6):
        passed("Right: each micro-batch loss is a mean over 8 samples; 1/4 of it, summed over 4.")
        return
    if close(value, 1 / 32, rel=1e-6):
        fail(
            "Each micro-batch loss is already a *mean* over its 8 samples. How many of those "
            "means do you add up?"
        )
    if close(value, 1.0, rel=1e-6):
        fail("Summing 4 unscaled means gives 4 times the full-batch mean gradient.")
    if close(value, 4.0, rel=1e-6) or close(value, 8.0, rel=1e-6):
        fail("The scale makes the sum smaller, not larger: it should be below 1.")
    fail(
        "Not yet. Write the full-batch mean over 32 samples as a sum over the 4 micro-batches "
        "of their own means: what factor appears in front of each?"
    )


__all__ = [f"exercise_{k}" for k in range(1, 7)]
