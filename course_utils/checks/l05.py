"""Checks for the exercises of lesson 05 (interleaved and breadth-first pipelines).

Each `exercise_K` is called by the check cell of Exercise 5.K in
`exercises/05_interleaved_breadth_first.ipynb`, with the learner's variant `v`: `given_K(v)`
draws the exercise's numbers (the default student gets the course's own), and every
expected answer is computed from them, here or by the simulator; `cases_1(v)` are the
inputs the Build exercise's function is tried on. With p devices, v chunks (virtual
stages) per device and m micro-batches, both interleaved 1F1B (Narayanan et al. 2021,
arXiv 2104.04473) and breadth-first (Lamy-Poirier, arXiv 2211.05953) idle (p - 1)/(v m)
of the ideal time; stage s lives on device s % p (looping placement, Lamy-Poirier's term).
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


def _looping(p: int, v: int) -> list[list[int]]:
    """Looping placement, per device: device d holds stages d, d + p, d + 2p, ..."""
    return [list(range(d, p * v, p)) for d in range(p)]


# --------------------------------------------------------------------------- 5.1


def cases_1(v: Variant = DEFAULT) -> dict[str, list[tuple]]:
    rng = v.cases("1")
    cases = [(4, 2), (1, rng.randint(2, 4)), (rng.randint(2, 8), 1)]
    cases += [(rng.randint(2, 8), rng.randint(2, 4)) for _ in range(5)]
    return {"looping_placement": cases}


def exercise_1(looping_placement, v: Variant = DEFAULT) -> None:
    """Build looping_placement(p, v): for each device, the stages it holds."""
    call = check_function(looping_placement, "looping_placement")
    cases = cases_1(v)["looping_placement"]
    for p, chunks in cases:
        shown = f"looping_placement({p}, {chunks})"
        answer = call(p, chunks)
        other_way = (
            f"{shown} returned the device of each stage: that is the other direction (what "
            "the course's device_of_stage() gives). Return one list per device: the stages "
            "that device holds."
        )
        if isinstance(answer, dict):
            fail(other_way)
        result = as_sequence(answer, shown)
        want = _looping(p, chunks)
        if len(result) == p * chunks and all(not isinstance(x, list | tuple) for x in result):
            fail(other_way)
        if len(result) != p:
            fail(
                f"{shown} has {len(result)} entries; it needs one per device ({p}), each a "
                "list of the stages that device holds."
            )
        got = [
            as_sequence(stages, f"device {d}'s stages in {shown}", item=as_int)
            for d, stages in enumerate(result)
        ]
        if got == want:
            continue
        every = sorted(s for stages in got for s in stages)
        if every != list(range(p * chunks)):
            fail(
                f"{shown} does not hand out each of the {p * chunks} stages 0..{p * chunks - 1} "
                f"exactly once (with {p} devices and {chunks} chunks each): {got}."
            )
        if [sorted(x) for x in got] == want:
            fail(f"{shown}: list each device's stages in increasing order: {got}.")
        if got == [list(range(d * chunks, (d + 1) * chunks)) for d in range(p)]:
            fail(
                f"{shown} gives each device a block of consecutive stages ({got}). That is "
                "the ordinary placement with bigger stages; looping placement deals the "
                "stages out in turn, like cards, so neighbouring stages sit on different devices."
            )
        fail(
            f"{shown} returned {got}, which is not looping placement. Walk along the "
            "stages 0, 1, 2, ... and hand them to devices 0, 1, ..., p-1, then start again "
            "at device 0."
        )
    passed(
        f"Right on {len(cases)} fresh (p, v) cases, e.g. 8 stages on 4 devices: "
        f"{_looping(4, 2)}. Every hop from one stage to the next changes device."
    )


# --------------------------------------------------------------------------- 5.2


def given_2(v: Variant = DEFAULT) -> dict:
    p = v.pick("2p", 8, [4, 6])
    return {"p": p, "m": p * v.pick("2g", 2, [2, 3]), "v": v.pick("2v", 4, [2, 3])}


def exercise_2(bubble_vs_ideal, step_time, v: Variant = DEFAULT) -> None:
    """Interleaved 1F1B, the given p, m, v, F=1, B=2: bubble relative to ideal, and step time."""
    p, m, chunks = given_2(v).values()
    f, b = 1.0, 2.0
    want_bubble = (p - 1) / (chunks * m)
    ideal = m * (f + b)
    want_time = ideal * (1 + want_bubble)
    bubble = as_number(bubble_vs_ideal, "bubble_vs_ideal")
    if not is_right(bubble, want_bubble):
        if is_right(bubble, (p - 1) / m):
            fail(
                "`bubble_vs_ideal` is 1F1B's bubble without chunks. With v chunks each hop "
                "of the fill and the drain costs only a chunk's work: what does that do?"
            )
        if is_right(bubble, (p - 1) / (chunks * m + p - 1)):
            fail(
                "`bubble_vs_ideal` is the idle share of the whole step. The question asks "
                "for the idle time relative to the ideal (busy) time."
            )
        if is_right(bubble, (p * chunks - 1) / (chunks * m)):
            fail(
                "`bubble_vs_ideal` counts p*v - 1 hops in the fill. The fill ends when the "
                "last DEVICE starts: how many devices does the first micro-batch pass first?"
            )
        expect_number(bubble, want_bubble, "bubble_vs_ideal", unit="fraction")
        fail(
            "`bubble_vs_ideal` is not right yet. Idle time per device: (p - 1) hops of one "
            "chunk's forward + backward. Ideal time: m micro-batches of the whole device's "
            "forward + backward. Divide."
        )
    time = as_number(step_time, "step_time")
    if not is_right(time, want_time):
        if is_right(time, ideal):
            fail("`step_time` is the ideal time: add the bubble on top of it.")
        if is_right(time, ideal + (p - 1) * (f + b)):
            fail(
                "`step_time` adds a bubble of full (unchunked) stages. `bubble_vs_ideal` is "
                "right: use it, step time = ideal time x (1 + bubble)."
            )
        expect_number(time, want_time, "step_time")
        fail(
            "`bubble_vs_ideal` is right, `step_time` is not: step time = ideal time x "
            "(1 + bubble_vs_ideal), with ideal time = m x (F + B). Compare with the simulator."
        )
    plain = (m + p - 1) * (f + b)
    passed(
        f"Right: bubble {p - 1}/{chunks * m} = {want_bubble:.1%} of the ideal time, a step of "
        f"{want_time:g} units instead of {plain:g} for plain 1F1B."
    )


# --------------------------------------------------------------------------- 5.3

ORDERS = ("depth-first", "breadth-first", "same")


def given_3(v: Variant = DEFAULT) -> dict:
    p = v.pick("3p", 4, [2, 3])
    return {"p": p, "v": v.pick("3v", 2, [2, 3]), "m": p * v.pick("3g", 2, [2, 3])}


def _peaks_3(v: Variant) -> tuple[int, int]:
    """Device 0's simulated peak (micro-batch, chunk) pairs: depth-first, breadth-first."""
    from course_utils.pipeline.schedules import make_schedule
    from course_utils.pipeline.simulate import simulate

    p, chunks, m = given_3(v).values()
    depth, breadth = (
        simulate(make_schedule(name, p, m, chunks=chunks)).peak_activations
        for name in ("interleaved", "breadth-first")
    )
    assert depth is not None and breadth is not None
    return int(depth[0]), int(breadth[0])


def exercise_3(smaller_bubble, less_memory, breadth_first_peak, v: Variant = DEFAULT) -> None:
    """The given p, v, m: compare bubble and activation memory of the two orders."""
    p, chunks, m = given_3(v).values()
    bubble = as_choice(smaller_bubble, ORDERS, "smaller_bubble")
    memory = as_choice(less_memory, ORDERS, "less_memory")
    peak = as_int(breadth_first_peak, "breadth_first_peak")
    if bubble != "same":
        fail(
            f"`smaller_bubble` = {bubble!r} is not it. Both orders fill the pipeline through "
            "the same p - 1 hops of one chunk each: compare their makespans in the simulator."
        )
    if memory != "depth-first":
        fail(
            f"`less_memory` = {memory!r} is not it. Count, on device 0, how many forwards "
            "each order runs before its first backward."
        )
    depth_peak, want = _peaks_3(v)
    if peak != want:
        if peak == m:
            fail(
                f"`breadth_first_peak` = {m} counts whole micro-batches. Count one unit per "
                "(micro-batch, chunk) pair: every micro-batch leaves activations on each of "
                "device 0's chunks."
            )
        if peak == depth_peak:
            fail(
                f"{depth_peak} is the depth-first peak. `breadth_first_peak` asks for "
                "breadth-first."
            )
        fail(
            "`breadth_first_peak` is not right. Breadth-first runs every forward of every "
            "local chunk before the first backward: how many (micro-batch, chunk) pairs is that?"
        )
    passed(
        f"Right: same bubble, but breadth-first holds all m x v = {want} chunk-activations at "
        f"once (GPipe's memory) while depth-first starts backwards early ({depth_peak} here)."
    )


# --------------------------------------------------------------------------- 5.4


def given_4(v: Variant = DEFAULT) -> dict:
    return {"p": 2, "v": v.pick("4v", 2, [2, 3]), "m": v.pick("4m", 2, [2, 3])}


def _parse_devices(my_schedule, p: int):
    from course_utils.actions import Action
    from course_utils.errors import CourseInputError

    lists = as_sequence(my_schedule, "my_schedule", length=p)
    devices = []
    for d, actions in enumerate(lists):
        items = as_sequence(actions, f"my_schedule[{d}]")
        parsed = []
        for i, item in enumerate(items):
            try:
                parsed.append(Action.parse(item))
            except CourseInputError:
                fail(
                    f"`my_schedule[{d}][{i}]` = {item!r} is not an action. Write actions as "
                    "text like '2F0' (stage 2, forward, micro-batch 0) or '3B1'."
                )
        devices.append(parsed)
    return devices


def exercise_4(my_schedule, v: Variant = DEFAULT) -> None:
    """A breadth-first schedule, backwards first-in first-out, written by hand."""
    from course_utils.actions import Schedule
    from course_utils.pipeline.schedules import make_schedule
    from course_utils.pipeline.simulate import simulate, validate

    p, chunks, m = given_4(v).values()
    stages = p * chunks
    devices = _parse_devices(my_schedule, p)
    if any(a.kind not in ("F", "B") for acts in devices for a in acts):
        fail("Use only forwards (F) and full backwards (B) here; no I, W or communication.")
    problems = validate(devices, stages=stages, microbatches=m)
    if problems:
        listed = "; ".join(problems[:3]) + (" ..." if len(problems) > 3 else "")
        fail(f"This schedule cannot run as written: {listed}.")
    for d, acts in enumerate(devices):
        wrong = sorted({a.stage for a in acts if a.stage % p != d})
        if wrong:
            fail(
                f"Device {d} runs stage(s) {wrong}. With looping placement on {p} devices, "
                f"device {d} holds the stages s with s % {p} == {d}."
            )
    for d, acts in enumerate(devices):
        forwards = [a.stage for a in acts if a.kind == "F"]
        backwards = [a.stage for a in acts if a.kind == "B"]
        first_b = next(i for i, a in enumerate(acts) if a.kind == "B")
        if any(a.kind == "F" for a in acts[first_b:]):
            fail(
                f"Device {d} starts a backward before its last forward: that is the "
                "depth-first (1F1B) habit. Breadth-first runs all forwards first."
            )
        if forwards != sorted(forwards) or backwards != sorted(backwards, reverse=True):
            fail(
                f"Device {d} mixes its stages: breadth-first takes every micro-batch through "
                "one local stage before moving to the next one (forwards: lower stage first; "
                "backwards: higher stage first)."
            )
    for d, acts in enumerate(devices):
        for s in {a.stage for a in acts}:
            order = [a.microbatch for a in acts if a.kind == "B" and a.stage == s]
            if order != sorted(order):
                lifo = order == sorted(order, reverse=True)
                why = " (last in, first out: the order of the course's schedule)" if lifo else ""
                fail(
                    f"Device {d} runs the backwards of stage {s} in the order {order}{why}. "
                    "The question asks for first in, first out: within a stage, micro-batch "
                    "0's backward first."
                )
    sched = Schedule("yours", stages, m, tuple(tuple(acts) for acts in devices))
    mine = simulate(sched).makespan
    ours = simulate(make_schedule("breadth-first", p, m, chunks=chunks)).makespan
    if mine > ours + 1e-9:
        fail(
            f"Valid, breadth-first and first in, first out, but it takes {mine:g} units where "
            f"the course's breadth-first schedule takes {ours:g} (F=1, B=2). Look at the "
            "order of the stages in the backwards: a device that waits for a gradient the "
            "other device will only produce later idles."
        )
    passed(
        f"Right: a valid breadth-first schedule, first in, first out, as fast as the course's "
        f"({ours:g} units). The course's runs each stage's backwards last in, first out: "
        f"print(make_schedule('breadth-first', {p}, {m}, chunks={chunks})). Both orders keep "
        "every micro-batch's activations until its backward, so they hold the same memory."
    )


# --------------------------------------------------------------------------- 5.5

PROBLEMS = ("a", "b", "c", "d")
FIXES = ("a", "b", "c", "d")
CHUNK_CHOICES = (1, 2, 4, 8)


def given_5(v: Variant = DEFAULT) -> dict:
    # every variant keeps the diagnosis true: 8 chunks are slower than plain 1F1B
    return {"m": v.pick("5m", 8, [8, 12]), "transfer": v.pick("5t", 0.3, [0.2, 0.25, 0.4])}


def _spans_5(v: Variant) -> dict[int, float]:
    from course_utils.pipeline.schedules import make_schedule
    from course_utils.pipeline.simulate import CostModel, simulate

    m, transfer = given_5(v).values()
    costs = CostModel(p2p=transfer)
    return {
        chunks: simulate(make_schedule("interleaved", 4, m, chunks=chunks), costs).makespan
        for chunks in CHUNK_CHOICES
    }


def exercise_5(problem, fix, best_chunks, v: Variant = DEFAULT) -> None:
    """Interleaved with v=8 is slower than 1F1B when a transfer costs the given time."""
    what = as_choice(problem, PROBLEMS, "problem")
    remedy = as_choice(fix, FIXES, "fix")
    best = as_int(best_chunks, "best_chunks")
    expect_choice(
        what,
        "b",
        {
            "a": "The bubble formula (p-1)/(v m) says the bubble is small with 8 chunks. Look "
            "at the gaps between the bars instead.",
            "c": "Memory does not appear in a timeline; the gaps are waiting time.",
            "d": "All chunks cost the same here (equal stages); look at what sits between them.",
        },
        "`problem` = {got!r} is not it. {hint}",
    )
    expect_choice(
        remedy,
        "b",
        {
            "a": "More chunks means more hops per micro-batch, each paying the transfer cost.",
            "c": "More devices means more hops too, and it changes the whole setup.",
            "d": "GPipe has the same number of transfers as 1F1B and a bigger activation peak.",
        },
        "`problem` is right. `fix` = {got!r} is not: {hint}",
    )
    if best not in CHUNK_CHOICES:
        fail("`best_chunks` is one of the values in the sweep: 1, 2, 4 or 8.")
    spans = _spans_5(v)
    fastest = min(spans, key=lambda c: spans[c])
    m, transfer = given_5(v).values()
    if best != fastest:
        fail(
            f"With v = {best} the step is not the fastest. Simulate "
            f"make_schedule('interleaved', 4, {m}, chunks=v) with CostModel(p2p={transfer:g}) "
            "for each v and compare the makespans."
        )
    passed(
        "Right: each chunk's compute shrinks like 1/v while every transfer still costs the "
        f"same, so past v = {fastest} the extra transfers eat what the smaller bubble saves."
    )


# --------------------------------------------------------------------------- 5.6

SCHEDULE_CHOICES = ("breadth-first", "depth-first")
REASONS = ("a", "b", "c", "d")


def exercise_6(scenario_a, scenario_b, reason_a, v: Variant = DEFAULT) -> None:
    """When to pick breadth-first: two scenarios and the reason for the first."""
    a = as_choice(scenario_a, SCHEDULE_CHOICES, "scenario_a")
    b = as_choice(scenario_b, SCHEDULE_CHOICES, "scenario_b")
    why = as_choice(reason_a, REASONS, "reason_a")
    if a != "breadth-first":
        fail(
            "`scenario_a` is not it. Few micro-batches per pipeline, a large data-parallel "
            "group and memory to spare: which order lets the gradient reduction start early?"
        )
    if b != "depth-first":
        fail(
            "`scenario_a` is right, `scenario_b` is not. With 64 micro-batches the bubble is "
            "small either way; what limits this team is activation memory. Which order "
            "holds fewer micro-batches at once?"
        )
    expect_choice(
        why,
        "b",
        {
            "a": "Both orders have the same bubble, (p - 1)/(v m) of the ideal time.",
            "c": "Breadth-first holds MORE activations than depth-first (like GPipe).",
            "d": "Both orders send the same transfers: each micro-batch crosses every "
            "stage boundary once each way.",
        },
        "Both scenarios are right. `reason_a` = {got!r} is not: {hint}",
    )
    passed(
        "Right: breadth-first pays in activation memory and wins when a small batch per "
        "device would otherwise leave the data-parallel gradient reduction exposed."
    )


__all__ = [f"exercise_{k}" for k in range(1, 7)]
