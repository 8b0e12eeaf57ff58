"""Checks for the exercises of lesson 05 (interleaved and breadth-first pipelines).

Each `exercise_K` is called by the check cell of Exercise 5.K in
`exercises/05_interleaved_breadth_first.ipynb`. With p devices, v chunks (virtual stages)
per device and m micro-batches, both interleaved 1F1B (Narayanan et al. 2021,
arXiv 2104.04473) and breadth-first (Lamy-Poirier 2022, arXiv 2211.05953) idle
(p - 1)/(v m) of the ideal time; stage s lives on device s % p (looping placement).
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


def _looping(p: int, v: int) -> list[int]:
    return [s % p for s in range(p * v)]


# --------------------------------------------------------------------------- 5.1


def exercise_1(looping_placement) -> None:
    """Build looping_placement(p, v): the device of each of the p*v stages."""
    call = check_function(looping_placement, "looping_placement")
    rng = random.Random()
    cases = [(4, 2), (1, rng.randint(2, 4)), (rng.randint(2, 8), 1)]
    cases += [(rng.randint(2, 8), rng.randint(2, 4)) for _ in range(5)]
    for p, v in cases:
        shown = f"looping_placement({p}, {v})"
        got = as_sequence(call(p, v), shown, item=as_int)
        want = _looping(p, v)
        if len(got) != p * v:
            fail(
                f"{shown} has {len(got)} entries; it needs one per stage. How many stages "
                f"are there with {p} devices and {v} chunks each?"
            )
        if got == want:
            continue
        if any(not 0 <= d < p for d in got):
            fail(f"{shown} uses a device number outside 0..{p - 1}: {got}.")
        if got == [s // v for s in range(p * v)]:
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

P2, M2, V2 = 8, 16, 4
F2, B2 = 1.0, 2.0


def exercise_2(bubble_vs_ideal, step_time) -> None:
    """Interleaved 1F1B, p=8, m=16, v=4, F=1, B=2: bubble relative to ideal, and step time."""
    bubble = as_number(bubble_vs_ideal, "bubble_vs_ideal")
    time = as_number(step_time, "step_time")
    want_bubble = (P2 - 1) / (V2 * M2)
    ideal = M2 * (F2 + B2)
    want_time = ideal * (1 + want_bubble)
    if not close(bubble, want_bubble):
        if close(bubble, (P2 - 1) / M2):
            fail(
                "`bubble_vs_ideal` is 1F1B's bubble without chunks. With v chunks each hop "
                "of the fill and the drain costs only a chunk's work: what does that do?"
            )
        if close(bubble, (P2 - 1) / (V2 * M2 + P2 - 1)):
            fail(
                "`bubble_vs_ideal` is the idle share of the whole step. The question asks "
                "for the idle time relative to the ideal (busy) time."
            )
        if close(bubble, (P2 * V2 - 1) / (V2 * M2)):
            fail(
                "`bubble_vs_ideal` counts p*v - 1 hops in the fill. The fill ends when the "
                "last DEVICE starts: how many devices does the first micro-batch pass first?"
            )
        fail(
            "`bubble_vs_ideal` is not right yet. Idle time per device: (p - 1) hops of one "
            "chunk's forward + backward. Ideal time: m micro-batches of the whole device's "
            "forward + backward. Divide."
        )
    if not close(time, want_time):
        if close(time, ideal):
            fail("`step_time` is the ideal time: add the bubble on top of it.")
        if close(time, ideal + (P2 - 1) * (F2 + B2)):
            fail(
                "`step_time` adds a bubble of full (unchunked) stages. `bubble_vs_ideal` is "
                "right: use it, step time = ideal time x (1 + bubble)."
            )
        fail(
            "`bubble_vs_ideal` is right, `step_time` is not: step time = ideal time x "
            "(1 + bubble_vs_ideal), with ideal time = m x (F + B). Compare with the simulator."
        )
    passed(
        f"Right: bubble 7/64 = {want_bubble:.1%} of the ideal time, a step of "
        f"{want_time:g} units instead of 69 for plain 1F1B."
    )


# --------------------------------------------------------------------------- 5.3

ORDERS = ("depth-first", "breadth-first", "same")


def exercise_3(smaller_bubble, less_memory, breadth_first_peak) -> None:
    """p=4, m=8, v=2: compare bubble and activation memory of the two orders."""
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
    if peak != 16:
        if peak == 8:
            fail(
                "`breadth_first_peak` = 8 counts whole micro-batches. Count one unit per "
                "(micro-batch, chunk) pair: every micro-batch leaves activations on each of "
                "device 0's chunks."
            )
        if peak == 11:
            fail("11 is the depth-first peak. `breadth_first_peak` asks for breadth-first.")
        fail(
            "`breadth_first_peak` is not right. Breadth-first runs every forward of every "
            "local chunk before the first backward: how many (micro-batch, chunk) pairs is that?"
        )
    passed(
        "Right: same bubble, but breadth-first holds all m x v = 16 chunk-activations at once "
        "(GPipe's memory) while depth-first starts backwards early (11 here)."
    )


# --------------------------------------------------------------------------- 5.4


def _parse_devices(my_schedule):
    from course_utils.actions import Action
    from course_utils.errors import CourseInputError

    lists = as_sequence(my_schedule, "my_schedule", length=2)
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


def exercise_4(my_schedule) -> None:
    """A breadth-first schedule for p=2, v=2, m=2 written by hand."""
    from course_utils.actions import Schedule
    from course_utils.pipeline.schedules import make_schedule
    from course_utils.pipeline.simulate import simulate, validate

    devices = _parse_devices(my_schedule)
    if any(a.kind not in ("F", "B") for acts in devices for a in acts):
        fail("Use only forwards (F) and full backwards (B) here; no I, W or communication.")
    problems = validate(devices, stages=4, microbatches=2)
    if problems:
        listed = "; ".join(problems[:3]) + (" ..." if len(problems) > 3 else "")
        fail(f"This schedule cannot run as written: {listed}.")
    for d, acts in enumerate(devices):
        wrong = sorted({a.stage for a in acts if a.stage % 2 != d})
        if wrong:
            fail(
                f"Device {d} runs stage(s) {wrong}. With looping placement on 2 devices, "
                f"device {d} holds the stages s with s % 2 == {d}."
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
    sched = Schedule("yours", 4, 2, tuple(tuple(acts) for acts in devices))
    mine = simulate(sched).makespan
    ours = simulate(make_schedule("breadth-first", 2, 2, chunks=2)).makespan
    if mine > ours + 1e-9:
        fail(
            f"Valid and breadth-first, but it takes {mine:g} units where the course's takes "
            f"{ours:g} (F=1, B=2). Look at the order of micro-batches in the backwards: a "
            "device that waits for a gradient the other device will only produce later idles."
        )
    passed(
        f"Right: a valid breadth-first schedule with the course's makespan of {ours:g} units. "
        "Compare it with print(make_schedule('breadth-first', 2, 2, chunks=2))."
    )


# --------------------------------------------------------------------------- 5.5

PROBLEMS = ("a", "b", "c", "d")
FIXES = ("a", "b", "c", "d")


def exercise_5(problem, fix, best_chunks) -> None:
    """Interleaved with v=8 is slower than 1F1B when a transfer costs 0.3 units."""
    what = as_choice(problem, PROBLEMS, "problem")
    remedy = as_choice(fix, FIXES, "fix")
    best = as_int(best_chunks, "best_chunks")
    expect_choice(
        what,
        "b",
        {
            "a": "8 micro-batches on 4 devices: the bubble formula says the bubble is small "
            "with 8 chunks. Look at the gaps between the bars instead.",
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
    if best not in (1, 2, 4, 8):
        fail("`best_chunks` is one of the values in the sweep: 1, 2, 4 or 8.")
    if best != 2:
        fail(
            f"With v = {best} the step is not the fastest. Simulate "
            "make_schedule('interleaved', 4, 8, chunks=v) with CostModel(p2p=0.3) for each v "
            "and compare the makespans."
        )
    passed(
        "Right: each chunk's compute shrinks like 1/v while every transfer still costs the "
        "same, so past v = 2 the extra transfers eat what the smaller bubble saves."
    )


# --------------------------------------------------------------------------- 5.6

SCHEDULE_CHOICES = ("breadth-first", "depth-first")
REASONS = ("a", "b", "c", "d")


def exercise_6(scenario_a, scenario_b, reason_a) -> None:
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
