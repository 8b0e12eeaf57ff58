"""Checks for lesson 05's exercises (interleaved and breadth-first pipelines).

With p devices, v chunks (virtual stages) per device and m micro-batches, both interleaved
1F1B (Narayanan et al. 2021, arXiv 2104.04473) and breadth-first (Lamy-Poirier, arXiv
2211.05953) idle (p - 1)/(v m) of the ideal time; stage s lives on device s % p (looping
placement, Lamy-Poirier's term). In the code `chunks` is v, the lessons' letter.
"""

from __future__ import annotations

from course_utils import checks
from course_utils.checks import DEFAULT, OTHERWISE, Variant, exercise, fail, judge, numbers, pick
from course_utils.checks.programs import ProgramCase, as_program, drawn_case, target

for_student = checks.lesson_checks(__name__)
ACTIONS = checks.sequence(item=checks.as_action)


def _looping(p: int, chunks: int) -> list[list[int]]:
    """Looping placement, per device: device d holds stages d, d + p, d + 2p, ..."""
    return [list(range(d, p * chunks, p)) for d in range(p)]


def _simulate(name: str, p: int, m: int, chunks: int, p2p: float = 0.0):
    from course_utils.pipeline import CostModel, make_schedule, simulate

    return simulate(make_schedule(name, p, m, chunks=chunks), CostModel(p2p=p2p))


def cases_1(variant: Variant = DEFAULT) -> dict[str, list[tuple]]:
    rng = variant.cases("1")
    cases = [(4, 2), (1, rng.randint(2, 4)), (rng.randint(2, 8), 1)]
    cases += [(rng.randint(2, 8), rng.randint(2, 4)) for _ in range(5)]
    return {"looping_placement": cases}


@exercise(looping_placement="function", points=2, partial=True)
def exercise_1(looping_placement, variant) -> str:
    """Build looping_placement(p, v): for each device, the stages it holds."""
    cases = cases_1(variant)["looping_placement"]
    for (p, chunks), shown, answer in checks.each_call(looping_placement, cases):
        rows = [] if isinstance(answer, dict) else checks.as_sequence(answer, shown)
        if isinstance(answer, dict) or (
            len(rows) == p * chunks and all(not isinstance(x, list | tuple) for x in rows)
        ):
            fail(
                f"{shown} returned the device of each stage: that is the other direction (what "
                "the course's device_of_stage() gives). Return one list per device: the stages "
                "that device holds."
            )
        got = checks.as_placement(rows, shown, p, p * chunks)
        blocks = [list(range(d * chunks, (d + 1) * chunks)) for d in range(p)]
        hints = {
            f"{shown} gives each device a block of consecutive stages ({got}). That is the "
            "ordinary placement with bigger stages; looping placement deals the stages out in "
            "turn, like cards, so neighbouring stages sit on different devices.": blocks,
            f"{shown} returned {got}, which is not looping placement. Walk along the stages 0, "
            "1, 2, ... and hand them to devices 0, 1, ..., p-1, then start again at device "
            "0.": OTHERWISE,
        }
        judge(got, _looping(p, chunks), shown, hints)
    return (
        f"Right on {len(cases)} random (p, v) cases, e.g. 8 stages on 4 devices: "
        f"{_looping(4, 2)}. Every hop from one stage to the next changes device."
    )


def given_2(variant: Variant = DEFAULT) -> dict:
    # never lesson 05's interleaved p = 4, m = 8, v = 2 (issue 50)
    p = variant.pick("2p", 8, [5, 6])
    return {"p": p, "m": p * variant.pick("2g", 2, [2, 3]), "v": variant.pick("2v", 4, [2, 3])}


@exercise(given_2, bubble_vs_ideal="number", step_time="number", partial=True)
def exercise_2(g, bubble_vs_ideal, step_time) -> str:
    """Interleaved 1F1B, the given p, m, v, F=1, B=2: bubble relative to ideal, and step time."""
    p, m, chunks = g.p, g.m, g.v
    bubble, every_stage = (p - 1) / (chunks * m), (p * chunks - 1) / (chunks * m)
    ideal = m * 3.0  # F + B = 1 + 2
    hints = {
        "`bubble_vs_ideal` is 1F1B's bubble without chunks. With v chunks each hop of the "
        "fill and the drain costs only a chunk's work: what does that do?": (p - 1) / m,
        "`bubble_vs_ideal` is the idle share of the whole step. The question asks for the "
        "idle time relative to the ideal (busy) time.": (p - 1) / (chunks * m + p - 1),
        "`bubble_vs_ideal` counts p*v - 1 hops in the fill. The fill ends when the last DEVICE "
        "starts: how many devices does the first micro-batch pass first?": every_stage,
        "`bubble_vs_ideal` is not right yet. Idle time per device: (p - 1) hops of one chunk's "
        "forward + backward. Ideal time: m micro-batches of the whole device's forward + "
        "backward. Divide.": OTHERWISE,
    }
    fields = checks.Fields()  # every wrong answer named at once
    with fields.judging():
        judge(bubble_vs_ideal, bubble, "bubble_vs_ideal", hints, unit="fraction")
    carried = ideal * (1 + bubble_vs_ideal) if fields.failures else None
    hints = {
        "`step_time` is the ideal time: add the bubble on top of it.": ideal,
        "`step_time` adds a bubble of full (unchunked) stages: with chunks, step time = ideal "
        "time x (1 + the chunked bubble).": ideal + (p - 1) * 3.0,
        "`step_time` follows from your `bubble_vs_ideal`, which is not right yet: it comes "
        "right with it.": carried,
        "`step_time` is not right yet: step time = ideal time x (1 + bubble_vs_ideal), with "
        "ideal time = m x (F + B). Compare with the simulator.": OTHERWISE,
    }
    with fields.judging():
        judge(step_time, ideal * (1 + bubble), "step_time", hints)
    fields.verdict()
    return (
        f"Right: bubble {p - 1}/{chunks * m} = {bubble:.1%} of the ideal time, a step of "
        f"{ideal * (1 + bubble):g} units instead of {(m + p - 1) * 3.0:g} for plain 1F1B."
    )


def given_3(variant: Variant = DEFAULT) -> dict:
    # lesson 05 compares both orders on (p, m, v) = (2, 4, 2) and (4, 8, 2): never those
    p = variant.pick("3p", 4, [2, 3])
    return {"p": p, "v": variant.pick("3v", 2, [2, 3]), "m": p * variant.pick("3g", 3, [3, 4])}


SAME_HOPS = (
    "Both orders fill the pipeline through the same p - 1 hops of one chunk each: compare their "
    "makespans in the simulator."
)
COUNT = "Count, on device 0, how many forwards each order runs before its first backward."


@exercise(
    given_3,
    smaller_bubble={"same": checks.RIGHT, "depth-first": SAME_HOPS, "breadth-first": SAME_HOPS},
    less_memory={"depth-first": checks.RIGHT, "breadth-first": COUNT, "same": COUNT},
    breadth_first_peak="whole number",
    partial=True,
)
def exercise_3(g, smaller_bubble, less_memory, breadth_first_peak) -> str:
    """The given p, v, m: compare bubble and activation memory of the two orders."""
    # device 0's simulated peaks, in (micro-batch, chunk) pairs
    depth, want = (
        int(_simulate(name, g.p, g.m, g.v).peak_activations[0])
        for name in ("interleaved", "breadth-first")
    )
    hints = {
        f"`breadth_first_peak` = {g.m} counts whole micro-batches. Count one unit per "
        "(micro-batch, chunk) pair: every micro-batch leaves activations on each of device 0's "
        "chunks.": g.m,
        f"{depth} is the depth-first peak. `breadth_first_peak` asks for breadth-first.": depth,
        "`breadth_first_peak` is not right. Breadth-first runs every forward of every local "
        "chunk before the first backward: how many (micro-batch, chunk) pairs is that?": OTHERWISE,
    }
    judge(breadth_first_peak, want, "breadth_first_peak", hints)
    return (
        f"Right: same bubble, but breadth-first holds all m x v = {want} chunk-activations at "
        f"once (GPipe's memory) while depth-first starts backwards early ({depth} here)."
    )


# --------------------------------------------------------------------------- 5.4: the program

# never the lesson's (p, m, v) = (2, 4, 2) or (4, 8, 2)
given_4 = numbers(pick("4", (3, 6), [(2, 6), (2, 8), (3, 9)], "p", "m"), v=2)


def _pipelines(first: ProgramCase, rng, fewest: int) -> list[tuple]:
    """The learner's own pipeline `first`, then two more of 2 stages per rank (2 and 3 ranks,
    `fewest` to 3 micro-batches per rank, other sizes and seeds) that `rng` draws: from the
    student's name in a notebook, secret in the grader."""
    drawn = [drawn_case(rng, p, p * rng.randint(fewest, 3), chunks=2) for p in (2, 3)]
    return [(case,) for case in [first, *drawn]]


def cases_4(variant: Variant = DEFAULT) -> dict[str, list[tuple]]:
    """The learner's own pipeline (`g.p` ranks of 2 stages, `g.m` micro-batches), then two
    more."""
    g = given_4(variant)
    first = ProgramCase(
        devices=g.p, chunks=g.v, microbatches=g.m, batch=g.m, hidden=16, depth=g.p * g.v, seed=4
    )
    return {"breadth_first_program": _pipelines(first, variant.cases("4"), 1)}


@exercise(given_4, breadth_first_program=as_program, points=3, partial=True)
def exercise_4(breadth_first_program, variant) -> str:
    """Build breadth-first (2 stages per rank, looping placement) as a per-rank program."""
    from course_utils.checks import breadth_first_build

    cases = cases_4(variant)["breadth_first_program"]
    for (case,), shown, got in checks.each_call(breadth_first_program, cases):
        breadth_first_build.judge(got, shown, case)
    g = given_4(variant)
    mine, depth = (target(cases[0][0], name) for name in ("breadth-first", "interleaved"))
    return (
        f"Right: on your {g.p} ranks of two stages and two other pipelines the gradients equal "
        f"one device's and the order replays to breadth-first's step ({mine.step:.4g} units; "
        f"depth-first's: {depth.step:.4g}; with equal stages both idle (p-1)/(v m) of the ideal "
        f"time). But rank 0 holds all {mine.held[0]} micro-batch chunks at once, where "
        f"depth-first holds {depth.held[0]}."
    )


CHUNK_CHOICES = (1, 2, 4, 8)
# every variant keeps the diagnosis true: 8 chunks are slower than plain 1F1B
given_5 = numbers(m=pick("5m", 8, [8, 12]), transfer=pick("5t", 0.3, [0.2, 0.25, 0.4]))


@exercise(
    given_5,
    points=3,
    partial=True,
    problem={
        "b": checks.RIGHT,
        "a": "The bubble formula (p-1)/(v m) says the bubble is small with 8 chunks. Look "
        "at the gaps between the bars instead.",
        "c": "Memory does not appear in a timeline; the gaps are waiting time.",
        "d": "All chunks cost the same here (equal stages); look at what sits between them.",
    },
    fix={
        "b": checks.RIGHT,
        "a": "More chunks means more hops per micro-batch, each paying the transfer cost.",
        "c": "More devices means more hops too, and it changes the whole setup.",
        "d": "GPipe has the same number of transfers as 1F1B and a bigger activation peak.",
    },
    best_chunks="whole number",
)
def exercise_5(g, problem, fix, best_chunks) -> str:
    """Interleaved with v=8 is slower than 1F1B when a transfer costs the given time."""
    if best_chunks not in CHUNK_CHOICES:
        fail("`best_chunks` is one of the values in the sweep: 1, 2, 4 or 8.")
    spans = {c: _simulate("interleaved", 4, g.m, c, g.transfer).makespan for c in CHUNK_CHOICES}
    fastest = min(spans, key=lambda c: spans[c])
    if best_chunks != fastest:
        fail(
            f"`best_chunks`: with v = {best_chunks} the step is not the fastest. Simulate "
            f"make_schedule('interleaved', 4, {g.m}, chunks=v) with "
            f"CostModel(p2p={g.transfer:g}) for each v and compare the makespans."
        )
    return (
        "Right: each chunk's compute shrinks like 1/v while every transfer still costs the "
        f"same, so past v = {fastest} the extra transfers eat what the smaller bubble saves."
    )


@exercise(
    scenario_a={
        "breadth-first": checks.RIGHT,
        "depth-first": "Few micro-batches per pipeline, a large data-parallel group and "
        "memory to spare: which order lets the gradient reduction start early?",
    },
    scenario_b={
        "depth-first": checks.RIGHT,
        "breadth-first": "With 64 micro-batches the bubble is small either way; what limits "
        "this team is activation memory. Which order holds fewer micro-batches at once?",
    },
    reason_a={
        "b": checks.RIGHT,
        "a": "Both orders have the same bubble, (p - 1)/(v m) of the ideal time.",
        "c": "Breadth-first holds MORE activations than depth-first (like GPipe).",
        "d": "Both orders send the same transfers: each micro-batch crosses every stage "
        "boundary once each way.",
    },
    partial=True,
)
def exercise_6(scenario_a, scenario_b, reason_a) -> str:
    """When to pick breadth-first: two scenarios and the reason for the first."""
    return (
        "Right: breadth-first pays in activation memory and wins when a small batch per "
        "device would otherwise leave the data-parallel gradient reduction exposed."
    )


# --------------------------------------------------------------------------- 5.7: the program


given_7 = numbers(pick("7", (2, 6), [(2, 8), (3, 6), (3, 9), (2, 10)], "p", "m"), v=2)


def case_7(g) -> ProgramCase:
    """The learner's own pipeline: `g.p` ranks of 2 chunks each, `g.m` micro-batches."""
    return ProgramCase(
        devices=g.p, chunks=g.v, microbatches=g.m, batch=g.m, hidden=16, depth=g.p * g.v, seed=5
    )


def cases_7(variant: Variant = DEFAULT) -> dict[str, list[tuple]]:
    """The learner's own pipeline, then two more (`_pipelines`)."""
    return {"interleaved_program": _pipelines(case_7(given_7(variant)), variant.cases("7"), 2)}


ADVICE_7 = {
    "deadlock": "Run your rank's actions in the schedule's order, receiving what each needs "
    "just before it and sending what it made just after.",
    "tag": "A rank gets a neighbour's messages in the order they were sent: run your rank's "
    "actions in the schedule's order, and name each message alike on both sides (what it is, "
    "for which stage, for which micro-batch).",
}


def _same_tags(run: dict) -> tuple[int, int, str, list[str]] | None:
    """(sender, receiver, tag, the actions whose results it tagged) for a tag that two
    messages between the same two ranks share, if any."""
    for rank, sends in enumerate(run["sends"]):
        seen: dict[tuple, list[str]] = {}
        for to, tag, _, after in sends:
            seen.setdefault((to, tag), []).append(str(after))
        for (to, tag), afters in seen.items():
            if len(afters) > 1:
                return rank, to, tag, afters
    return None


@exercise(given_7, interleaved_program=as_program, points=3, partial=True)
def exercise_7(interleaved_program, variant) -> str:
    """Build interleaved 1F1B (2 chunks per rank) as a per-rank program."""
    from course_utils.checks import pipeline_hints

    cases = cases_7(variant)["interleaved_program"]
    for (case,), shown, got in checks.each_call(interleaved_program, cases):
        run = pipeline_hints.judged_run(got, shown, case, ADVICE_7)
        shared = _same_tags(run)
        if shared:
            rank, to, tag, afters = shared
            fail(
                f"{shown}: rank {rank} sent rank {to} the results of {afters[0]} and "
                f"{afters[1]} both tagged {tag}. Between two ranks go activations and "
                "gradients of both chunks: tags must tell them apart (what, which stage, "
                "which micro-batch), or a receive of the wrong one goes unnoticed."
            )
        want = target(case, "interleaved")
        gpipe = "Interleaved 1F1B starts backwards early, as 1F1B does: follow its order."
        pipeline_hints.memory(shown, run, case, want.held[0], gpipe)
        why = (
            'Run each rank\'s actions in the order of make_schedule("interleaved", p, m, chunks=2).'
        )
        pipeline_hints.order(shown, run, case, "interleaved", why)
    g = given_7(variant)
    held = target(cases[0][0], "interleaved").held[0]
    return (
        f"Right: on your {g.p} ranks of two chunks and two other pipelines the gradients equal "
        "one device's, every message says what it is, the order replays to interleaved "
        f"1F1B's step, and rank 0 held at most {held} micro-batch chunks at once."
    )
