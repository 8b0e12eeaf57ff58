"""Checks for lesson 04's exercises (1F1B, activation memory, the zero-bubble split).

1F1B is PipeDream-Flush (Narayanan et al. 2020, arXiv 2006.09503); ZB-H1 is from "Zero
Bubble Pipeline Parallelism" (Qi et al., ICLR 2024, arXiv 2401.10241). The reference orders
come from `course_utils.pipeline.schedules`.
"""

from __future__ import annotations

from course_utils import checks
from course_utils.checks import DEFAULT, OTHERWISE, Variant, exercise, fail, judge, numbers, pick
from course_utils.checks.pipeline_cases import SplitCase
from course_utils.checks.programs import ProgramCase, as_program, drawn_case, target

for_student = checks.lesson_checks(__name__)


def _count(value, what: str) -> int:
    number = checks.as_int(value, what)
    if number < 0:
        fail(f"`{what}` counts micro-batches: it cannot be negative.")
    return number


given_1 = numbers(p=pick("1p", 5, [4, 5, 6, 7]), m=pick("1m", 12, [9, 10, 14, 16]))


@exercise(given_1, partial=True)
def exercise_1(g, peak_gpipe, peak_1f1b) -> str:
    """The most micro-batches each device holds at once, GPipe and 1F1B, for the given p, m."""
    p, m = g.p, g.m
    gpipe = checks.as_sequence(peak_gpipe, "peak_gpipe", length=p, item=_count)
    one_f = checks.as_sequence(peak_1f1b, "peak_1f1b", length=p, item=_count)
    early = checks.any_of([p] * p, list(range(p, 0, -1)))  # backwards started early
    hints = {
        "`peak_gpipe` is not right: that is what a schedule that starts backwards early "
        "holds. In GPipe, what does every device do before its first backward?": early,
        "`peak_gpipe` is not right yet. In GPipe a device runs every forward before its "
        "first backward: how many micro-batches is it holding when that backward "
        "starts?": OTHERWISE,
    }
    fields = checks.Fields()  # every wrong answer named at once
    fields.judge(gpipe, [m] * p, "peak_gpipe", hints)
    want = [min(m, p - d) for d in range(p)]
    short, extra = [w - 1 for w in want], [w + 1 for w in want]
    grows = one_f == sorted(one_f) != sorted(one_f, reverse=True)
    flat = len(set(one_f)) == 1  # the same on every device
    hints = {
        "`peak_1f1b` copies it, but 1F1B starts backwards early.": [m] * p,
        "`peak_1f1b` grows with the device number, but device 0 is the "
        "one that waits longest for its first gradient to come back.": grows,
        "`peak_1f1b` is one short on every device: the steady phase "
        "starts with a forward, so count the warm-up forwards plus that one.": short,
        "`peak_1f1b` is one too many on every device: device d runs "
        "p - 1 - d warm-up forwards, then ONE steady forward before its first backward.": extra,
        "`peak_1f1b` is the same on every device, but a later device "
        "gets its first gradient back sooner: it needs fewer warm-up forwards.": flat,
        "`peak_1f1b` is not right yet. For device d: how many forwards does "
        "it run before its first backward? It holds no more than that afterwards.": OTHERWISE,
    }
    fields.judge(one_f, want, "peak_1f1b", hints)
    fields.verdict()
    return (
        f"Right: GPipe holds all {m} micro-batches on every device; 1F1B holds p - d, at most "
        f"{p} on device 0, however large m gets."
    )


def phases(p: int, m: int, d: int) -> tuple[list[str], list[str], list[str]]:
    """The three phases of device d's 1F1B order: warm-up, steady (F, B pairs), cool-down."""
    warm = min(p - 1 - d, m)
    warmup = [f"{d}F{i}" for i in range(warm)]
    steady = [a for i in range(m - warm) for a in (f"{d}F{warm + i}", f"{d}B{i}")]
    cooldown = [f"{d}B{i}" for i in range(m - warm, m)]
    return warmup, steady, cooldown


def cases_2(variant: Variant = DEFAULT) -> dict[str, list[tuple]]:
    rng = variant.cases("2")
    cases = [(4, 8, 0), (4, 8, 3), (1, rng.randint(1, 5), 0)]
    for _ in range(6):
        p = rng.randint(2, 8)
        cases.append((p, rng.randint(1, 16), rng.randrange(p)))
    cases.append((6, 3, 1))  # fewer micro-batches than stages
    p = rng.randint(5, 8)
    cases.append((p, rng.randint(1, p - 2), rng.randrange(2)))  # m < p - 1 - d: no steady phase
    return {"one_f_one_b": cases}


def _action_text(value, what: str) -> str:
    return str(checks.as_action(value, what))


def _three_phases(result, shown: str) -> list[list[str]]:
    from course_utils.actions import Action

    items = checks.as_sequence(result, f"the result of {shown}")
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
        checks.as_sequence(part, f"the {name} phase of {shown}", item=_action_text)
        for name, part in zip(names, items, strict=True)
    ]


@exercise(one_f_one_b="function", points=2, partial=True)
def exercise_2(one_f_one_b, variant) -> str:
    """Build one_f_one_b(p, m, d): device d's 1F1B order as (warm-up, steady, cool-down)."""
    cases = cases_2(variant)["one_f_one_b"]
    for (p, m, d), shown, result in checks.each_call(one_f_one_b, cases):
        got = _three_phases(result, shown)
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
            fail(
                f"{shown} runs {warm_got} forwards before its first backward: too "
                f"{'many' if warm_got > warm_want else 'few'}. How many forwards can device d "
                "start before the gradient of micro-batch 0 returns from the last stage? "
                "Remember m can be smaller than p."
            )
        first = next(i for i, (a, b) in enumerate(zip(flat, want_flat, strict=True)) if a != b)
        fail(
            f"{shown} starts well but goes wrong at position {first} ({flat[first]!r}). After "
            "the warm-up, alternate: one forward of the next new micro-batch, then one "
            "backward of the oldest one still held; then the cool-down runs the last backwards."
        )
    shown = ", ".join(str(c) for c in cases)
    return f"Right on random (p, m, d) = {shown}: every phase in its place."


given_3 = numbers(
    p=pick("3p", 4, [3, 5, 6]),
    m=pick("3m", 6, [5, 7, 8, 10]),
    t_f=pick("3f", 1.0, [1.0, 2.0]),
    t_b=pick("3b", 2.0, [3.0, 4.0]),
)


@exercise(
    given_3, makespan_gpipe="number", makespan_1f1b="number", bubble_1f1b="number", partial=True
)
def exercise_3(g, makespan_gpipe, makespan_1f1b, bubble_1f1b) -> str:
    """Equal stages, the given p, m, t_F, t_B: both makespans and 1F1B's bubble fraction."""
    p, m, f, b = g.values()
    want = (m + p - 1) * (f + b)  # equal stages, free communication: GPipe and 1F1B alike
    too_many = (m + p) * (f + b)
    hints = {
        "`makespan_gpipe` is only the busy time of one device: add its idle time.": m * (f + b),
        "`makespan_gpipe` counts one slot too many. The fill and the drain add p - 1 slots to "
        "the m micro-batches (the first device's forward is not waiting).": too_many,
        "`makespan_gpipe` is not right yet. Lesson 03's step time: the fill and the drain add "
        "p - 1 slots to the m micro-batches, each slot one forward + one backward.": OTHERWISE,
    }
    fields = checks.Fields()  # every wrong answer named at once
    with fields.judging():
        judge(makespan_gpipe, want, "makespan_gpipe", hints)
    hints = {
        "`makespan_1f1b` is too short: 1F1B changes the order of "
        "work, not the fill and drain. Does the last device get micro-batch 0 "
        "earlier?": lambda x: x < want,
        "`makespan_1f1b` counts one slot too many: 1F1B has the same fill and drain as "
        "GPipe.": too_many,
        "`makespan_1f1b` is not right: compare the two Gantt charts.": OTHERWISE,
    }
    with fields.judging():
        judge(makespan_1f1b, want, "makespan_1f1b", hints)
    hints = {
        "`bubble_1f1b` = (p-1)/m is relative to the busy time; the question asks for the idle "
        "share of the whole step.": (p - 1) / m,
        "`bubble_1f1b` is not right: idle time of a device / step time.": OTHERWISE,
    }
    bubble = (p - 1) / (m + p - 1)
    with fields.judging():
        judge(bubble_1f1b, bubble, "bubble_1f1b", hints, unit="fraction")
    fields.verdict()
    return (
        f"Right: {want:g} units for both. 1F1B keeps GPipe's bubble ({bubble:.1%} of the "
        "step here); what it saves is memory."
    )


# p and m of the learner's ZB-H1 (the lesson draws ZB-H1 on p = 4, m = 8): never that one.
given_4 = numbers(pick("4", (4, 6), [(3, 6), (4, 7), (5, 7), (3, 5)], "p", "m"))


def case_4(g) -> SplitCase:
    """The learner's own pipeline: `g.p` ranks, `g.m` micro-batches of two rows each."""
    equal = {"devices": g.p, "depth": g.p - 1, "d_in": 24, "hidden": 24, "classes": 24}
    return SplitCase(**equal, microbatches=g.m, batch=2 * g.m, seed=5)


def cases_4(variant: Variant = DEFAULT) -> dict[str, list[tuple]]:
    """The learner's own pipeline, then two more, one with fewer micro-batches than ranks:
    drawn from the student's name in a notebook, secret in the grader."""
    rng = variant.cases("4")
    cases = [case_4(given_4(variant))]
    for few in (False, True):
        p = rng.randint(2, 4)
        m = rng.randint(1, p - 1) if few else rng.randint(p + 1, 7)
        cases.append(SplitCase(**vars(drawn_case(rng, p, m))))
    return {"zb_h1_program": [(case,) for case in cases]}


ADVICE_4 = {
    "deadlock": "Follow micro-batch 0 through your program, rank by rank: a rank sends its "
    "input's gradient back as soon as its I is done, never after a W.",
    "tag": "Micro-batches received in the wrong order: a rank gets a neighbour's messages in "
    "the order they were sent, so every rank runs its forwards in micro-batch order, and its "
    "I's in the order the micro-batches went forward.",
}


@exercise(given_4, zb_h1_program=as_program, points=3, partial=True)
def exercise_4(zb_h1_program, variant) -> str:
    """Build ZB-H1 as a per-rank program: each backward split into I and W, the W's put off
    into the bubble; judged on gradients, what each I changed, memory and order."""
    from course_utils.checks import pipeline_hints, zero_bubble_build

    cases = cases_4(variant)["zb_h1_program"]
    for (case,), shown, got in checks.each_call(zb_h1_program, cases):
        zero_bubble_build.before_run(got, shown, case)
        run = pipeline_hints.judged_run(got, shown, case, ADVICE_4)
        zero_bubble_build.judge(shown, run, case)
    from course_utils.pipeline import make_schedule, simulate

    g, case = given_4(variant), cases[0][0]
    zb, one_f = (
        simulate(make_schedule(name, g.p, g.m), case.costs()) for name in ("zb-h1", "1f1b")
    )
    return (
        f"Right: on your {g.p} ranks with {g.m} micro-batches and on two other pipelines the "
        "gradients equal one device's, no I touched the weights, and the order replays to "
        f"ZB-H1's step: rank 0 idles {zb.idle(0):.4g} units of a {zb.makespan:.4g}-unit step, "
        f"against {one_f.idle(0):.4g} of {one_f.makespan:.4g} under 1F1B, and no rank holds "
        "more micro-batches than 1F1B's rank 0."
    )


@exercise(
    points=2,
    partial=True,
    oom_cause={
        "b": checks.RIGHT,
        "a": "The bubble costs time, not memory: an idle device holds nothing extra.",
        "c": "Accumulated gradients take the size of the parameters once, whatever m is.",
        "d": "Read the chart again: in GPipe every device climbs to the same height.",
    },
    oom_fix={
        "c": checks.RIGHT,
        "a": "24 micro-batches of half the size: each device still holds the whole batch "
        "before its first backward, so the same bytes.",
        "b": "With 2 stages each device holds twice the layers, so every micro-batch "
        "leaves twice the activations, and it still holds all 12.",
        "d": "A data-parallel replica runs the same schedule: the same memory per device.",
    },
)
def exercise_5(oom_cause, oom_fix) -> str:
    """GPipe p=4, m=12 runs out of activation memory: name the problem and the fix."""
    return (
        "Right: GPipe holds all 12 micro-batches at the peak; 1F1B with the same m holds at "
        "most 4 (on device 0), under the budget, with the same bubble."
    )


@exercise(
    points=2,
    partial=True,
    zb_problem={
        "b": checks.RIGHT,
        "a": "Compare the title's bubble with 1F1B's for p=4, m=8: it is smaller, not larger.",
        "c": "Every W comes after its own I here; the simulator would refuse the schedule "
        "otherwise.",
        "d": "The simulator finished the step and drew it: a deadlock has no chart.",
    },
    zb_fix={
        "c": checks.RIGHT,
        "a": "W needs its own I first (it uses the output gradient I computed).",
        "b": "Smaller pieces of W still wait until the end: the micro-batches stay held.",
        "d": "That fixes the memory but brings back 1F1B's whole bubble. Keep the split "
        "and place each W better.",
    },
)
def exercise_6(zb_problem, zb_fix) -> str:
    """A split schedule with every W at the end: name the problem and the fix."""
    return (
        "Right: a micro-batch's activations stay until its W, so W's parked at the end hold "
        "all m micro-batches. ZB-H1 runs each W a few slots after its I, inside the bubbles, "
        "and holds at most p."
    )


# --------------------------------------------------------------------------- 4.7: the program


given_7 = numbers(pick("7", (3, 7), [(4, 6), (3, 8), (4, 9), (5, 7)], "p", "m"))


def case_7(g) -> ProgramCase:
    """The learner's own pipeline: `g.p` ranks, `g.m` micro-batches of two rows each."""
    return ProgramCase(devices=g.p, microbatches=g.m, batch=2 * g.m, hidden=24, depth=g.p, seed=4)


def cases_7(variant: Variant = DEFAULT) -> dict[str, list[tuple]]:
    """The learner's own pipeline, then two more with more micro-batches than ranks (and one
    with fewer): drawn from the student's name in a notebook, secret in the grader."""
    rng = variant.cases("7")
    cases = [case_7(given_7(variant))]
    for few in (False, True):
        p = rng.randint(2, 5)
        m = rng.randint(1, p - 1) if few else rng.randint(p + 1, 9)
        cases.append(drawn_case(rng, p, m))
    return {"one_f_one_b_program": [(case,) for case in cases]}


ADVICE_7 = {
    "deadlock": "The warm-up: a rank that waits for a gradient before the ranks after it have "
    "had the forwards they need waits for ever. How many forwards must rank r send on before "
    "micro-batch 0's gradient can come back to it?",
    "tag": "Micro-batches received in the wrong order: gradients come back in the order the "
    "micro-batches went forward, so in the steady state a rank runs the backward of the "
    "oldest micro-batch it holds.",
}


@exercise(given_7, one_f_one_b_program=as_program, points=3, partial=True)
def exercise_7(one_f_one_b_program, variant) -> str:
    """Build 1F1B as a per-rank program; judged on gradients, rank 0's memory and order."""
    from course_utils.checks import pipeline_hints

    cases = cases_7(variant)["one_f_one_b_program"]
    for (case,), shown, got in checks.each_call(one_f_one_b_program, cases):
        run = pipeline_hints.judged_run(got, shown, case, ADVICE_7)
        want = target(case, "1f1b")
        gpipe = "1F1B starts each backward as soon as its gradient can be back."
        pipeline_hints.memory(shown, run, case, want.held[0], gpipe)
        warm = [next(i for i, a in enumerate(acts) if a.is_backward) for acts in run["actions"]]
        why = (
            f"Its ranks ran {warm} forwards before their first backward. Each rank warms up "
            "with as many forwards as the ranks after it need to start theirs, then "
            "alternates one forward, one backward."
        )
        pipeline_hints.order(shown, run, case, "1f1b", why)
    g = given_7(variant)
    return (
        f"Right: on your {g.p} ranks with {g.m} micro-batches and on two other pipelines, the "
        "gradients equal one device's, the order replays to 1F1B's step, and rank 0 never "
        f"held more than {min(g.p, g.m)} micro-batches' activations (GPipe holds all {g.m})."
    )
