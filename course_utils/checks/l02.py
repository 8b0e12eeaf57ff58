"""Checks for the exercises of lesson 02 (micro-batching and the GPipe pipeline).

Each `exercise_K` is called by the check cell of Exercise 2.K in
`exercises/02_microbatching_gpipe.ipynb`, with the learner's variant `v`: `given_K(v)` draws
the exercise's numbers (the default student gets the course's own), and every expected
answer is computed from them by the course's simulator (`course_utils.pipeline.simulate`),
so the feedback names the exact action that is wrong. `cases_3(v)` are the inputs the
Build exercise's function is tried on.

Conventions, stated in the lesson and in the exercises alike: stages, devices and
micro-batches are numbered from 0 (`2F1` is stage 2's forward of micro-batch 1); stage s
runs on device s; GPipe runs each device's backwards in the order its forwards ran, first
in, first out (`0B0` before `0B1`), as PyTorch's ScheduleGPipe does.
"""

from __future__ import annotations

from course_utils.actions import Action
from course_utils.checks import (
    DEFAULT,
    CheckFailed,
    NotAnswered,
    Variant,
    as_choice,
    as_number,
    as_sequence,
    check_function,
    expect_choice,
    expect_number,
    fail,
    is_right,
    passed,
    require,
)
from course_utils.checks import (
    for_student as _for_student,
)
from course_utils.errors import CourseInputError


def for_student(student: str = "default"):
    """This lesson's checks with `student`'s numbers (the notebook's first code cell)."""
    import sys

    return _for_student(sys.modules[__name__], student)


def _as_action(value, what: str) -> Action:
    require(value, what)
    try:
        return Action.parse(value)
    except CourseInputError:
        fail(f"`{what}` should be an action written like '1F0' or '0B1', but it is {value!r}.")


def _gpipe(p: int, m: int, forward: float = 1.0, backward: float = 2.0):
    from course_utils.pipeline.schedules import make_schedule
    from course_utils.pipeline.simulate import CostModel, simulate

    return simulate(make_schedule("gpipe", p, m), CostModel(forward=forward, backward=backward))


def _starts(p: int, m: int) -> dict[Action, float]:
    return {e.action: e.start for e in _gpipe(p, m).events if e.action.is_compute}


def _lifo_stage(actions: list[Action]) -> int | None:
    """A stage whose backwards are listed last in, first out (the convention's slip)."""
    for stage in sorted({a.stage for a in actions}):
        order = [
            a.microbatch
            for a in actions
            if a.stage == stage and a.kind == "B" and a.microbatch is not None
        ]
        if len(order) > 1 and order == sorted(order, reverse=True):
            return stage
    return None


def _fifo_message(stage: int, shown: str) -> str:
    return (
        f"{shown} runs stage {stage}'s backwards last in, first out ({stage}B0 last). That is a "
        "valid schedule (the GPipe paper's figure draws it so), but the convention of this "
        f"course, stated above, is first in, first out: {stage}B0 first, in the order the "
        "forwards ran, as PyTorch's ScheduleGPipe does."
    )


# --------------------------------------------------------------------------- 2.1


def given_1(v: Variant = DEFAULT) -> dict:
    p, m = v.pick("1", (2, 2), [(2, 3), (3, 2)])
    return {"p": p, "m": m}


def exercise_1(order, v: Variant = DEFAULT) -> None:
    """Order the compute actions of GPipe (p devices, m micro-batches) by start time."""
    p, m = given_1(v).values()
    items = as_sequence(order, "order")
    actions = [_as_action(x, f"order[{i}]") for i, x in enumerate(items)]
    starts = _starts(p, m)
    unknown = [a for a in actions if a not in starts]
    if unknown:
        fail(
            f"{unknown[0]} does not happen in this pipeline: there are stages 0 to {p - 1}, "
            f"micro-batches 0 to {m - 1}, and the kinds F and B."
        )
    seen = set()
    for a in actions:
        if a in seen:
            fail(f"{a} is listed twice: every action happens exactly once.")
        seen.add(a)
    missing = sorted(set(starts) - seen)
    if missing:
        fail(f"{len(missing)} of the {len(starts)} actions are missing, for example {missing[0]}.")
    stage = _lifo_stage(actions)
    if stage is not None:
        fail(_fifo_message(stage, "Your order"))
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


# --------------------------------------------------------------------------- 2.2


def given_2(v: Variant = DEFAULT) -> dict:
    return {
        "p": v.pick("2p", 4, [4, 5, 6]),
        "m": v.pick("2m", 8, [8, 10, 12]),
        "stage": v.pick("2s", 2, [2, 3]),
        "microbatch": v.pick("2k", 1, [1, 2, 3]),
    }


def _moment_2(v: Variant) -> tuple[dict, float, dict[Action, float]]:
    g = given_2(v)
    starts = _starts(g["p"], g["m"])
    # the forward that ends: F takes 1 unit in this exercise
    return g, starts[Action(g["stage"], "F", g["microbatch"])] + 1.0, starts


def exercise_2(stage0_action, stage1_action, v: Variant = DEFAULT) -> None:
    """GPipe (p stages, m micro-batches): what stages 0 and 1 start when a forward ends."""
    g, moment, starts = _moment_2(v)
    event = f"{g['stage']}F{g['microbatch']}"
    a0 = _as_action(stage0_action, "stage0_action")
    a1 = _as_action(stage1_action, "stage1_action")
    for got, stage, name in ((a0, 0, "stage0_action"), (a1, 1, "stage1_action")):
        if got.stage != stage:
            fail(f"`{name}` should be an action of stage {stage}, like '{stage}F0'.")
        want = next(a for a, t in starts.items() if a.stage == stage and t == moment)
        if got != want:
            if got.kind != "F":
                fail(f"`{name}` is not right: when {event} ends, no backward has started anywhere.")
            if got.microbatch is None:
                fail(f"`{name}` = {got!r} needs a micro-batch number, like '{stage}F0'.")
            assert want.microbatch is not None  # the simulator's compute actions all have one
            off = got.microbatch - want.microbatch
            fail(
                f"`{name}` = {got} is {'ahead' if off > 0 else 'behind'}. Stage {stage} is "
                f"{g['stage'] - stage} step(s) ahead of stage {g['stage']} and starts a new "
                "micro-batch every forward time: count forward slots from time 0."
            )
    busy = g["stage"] + 2  # stages 0..stage+1 all start or run a forward at that moment
    passed(
        f"Right: when {event} ends, stage 1 starts {a1} and "
        f"stage 0 starts {a0}: {min(busy, g['p'])} stages busy on different micro-batches at once."
    )


# --------------------------------------------------------------------------- 2.3

# Devices of pipelines no one can build whole in time: the function must construct one
# device's list from d and m itself.
HUGE = [(10**9, 3, 987_654_321), (123_456_789, 2, 123_456_788)]


def cases_3(v: Variant = DEFAULT) -> dict[str, list[tuple]]:
    rng = v.cases("3")
    shapes = [(2, 2)] + [(rng.randint(2, 5), rng.randint(1, 8)) for _ in range(4)]
    small = [(p, m, d) for p, m in shapes for d in range(p)]
    return {"gpipe_device": [*small, *HUGE]}


def _device_list(result, shown: str, d: int) -> list[Action]:
    items = as_sequence(result, shown)
    actions = [_as_action(x, f"{shown}[{i}]") for i, x in enumerate(items)]
    wrong_stage = [a for a in actions if a.stage != d]
    if wrong_stage:
        fail(f"{shown} lists {wrong_stage[0]}, but device {d} runs stage {d} only.")
    kinds = [a.kind for a in actions]
    if "B" in kinds and "F" in kinds[kinds.index("B") :]:
        fail(
            f"{shown} runs a backward before its last forward. That order can work, but it is "
            "not GPipe: all forwards first, then all backwards."
        )
    stage = _lifo_stage(actions)
    if stage is not None:
        fail(_fifo_message(stage, shown))
    return actions


def exercise_3(gpipe_device, v: Variant = DEFAULT) -> None:
    """Build gpipe_device(p, m, d) -> device d's GPipe actions, in order, as strings."""
    from course_utils.pipeline.simulate import validate

    call = check_function(gpipe_device, "gpipe_device")
    cases = cases_3(v)["gpipe_device"]
    lists: dict[tuple[int, int], list[list[Action]]] = {}
    for p, m, d in cases:
        shown = f"gpipe_device({p}, {m}, {d})"
        try:
            result = call(p, m, d)
        except CheckFailed as exc:
            if (p, m, d) in HUGE and not isinstance(exc, NotAnswered):
                what = exc.message.splitlines()[0].removeprefix(shown).strip()
                fail(
                    f"{shown} {what.rstrip('.')}. The check also asks for one device of a "
                    "pipeline far too long to build whole: write device d's list from d and m, "
                    "without making the whole schedule."
                )
            raise
        actions = _device_list(result, shown, d)
        if (p, m, d) in HUGE:
            want = [Action(d, "F", k) for k in range(m)] + [Action(d, "B", k) for k in range(m)]
            if actions != want:
                fail(f"{shown} is not device {d}'s GPipe list (check it on a small pipeline).")
            continue
        lists.setdefault((p, m), []).append(actions)
        if len(lists[(p, m)]) == p:
            problems = validate(lists[(p, m)], p, m)
            if problems:
                fail(f"The lists of gpipe_device({p}, {m}, d) for d = 0..{p - 1}: {problems[0]}.")
    shapes = ", ".join(f"({p}, {m})" for p, m in lists)
    passed(
        f"Right on fresh random shapes (p, m) = {shapes}, every device a valid GPipe list, "
        "and on devices of pipelines with a hundred million stages and more."
    )


# --------------------------------------------------------------------------- 2.4


def given_4(v: Variant = DEFAULT) -> dict:
    return {
        "p": v.pick("4p", 4, [3, 5, 6]),
        "m": v.pick("4m", 8, [6, 12, 16]),
        "F": 1,
        "B": v.pick("4b", 2, [2, 3]),
    }


def exercise_4(makespan, speedup, v: Variant = DEFAULT) -> None:
    """GPipe with p stages, m micro-batches, F and B per micro-batch: makespan and speed-up."""
    from course_utils.pipeline.schedules import make_schedule
    from course_utils.pipeline.simulate import CostModel, simulate

    p, m, f, b = given_4(v).values()
    costs = CostModel(forward=f, backward=b)
    want_t = simulate(make_schedule("gpipe", p, m), costs).makespan
    naive_t = simulate(make_schedule("naive", p, m), costs).makespan  # the batch as one piece
    t = as_number(makespan, "makespan")
    if not is_right(t, want_t):
        if is_right(t, m * (f + b)):
            fail(
                "That is one device's busy time. The step also contains the time to fill the "
                "pipeline and drain it again: how many extra slots does that take?"
            )
        if is_right(t, naive_t):
            fail("That is the naive (unpipelined) step. With micro-batches the stages overlap.")
        if any(is_right(t, (m + p - 1 + off) * (f + b)) for off in (-1, 1)):
            fail(
                f"Off by one slot. Count again how many forward slots pass before stage {p - 1} "
                "starts its first forward (the fill), then its m forwards."
            )
        if not (t.is_integer() and want_t.is_integer()):  # a whole number is not a rounding
            expect_number(t, want_t, "makespan")
        fail(
            "`makespan` is not right. Draw the forward half: when does the last stage finish "
            "its last forward? The backward half is the mirror image, B/F times as slow."
        )
    want_s = naive_t / want_t
    s = expect_number(speedup, want_s, "speedup")
    if not is_right(s, want_s):
        if is_right(s, p):
            fail(
                f"`makespan` is right. {p}x is the ideal with no fill and drain; the speed-up "
                "is the naive step's time divided by GPipe's makespan."
            )
        if is_right(s, 1 / want_s):
            fail("`makespan` is right. `speedup` is upside down: naive time / GPipe time.")
        fail(
            "`makespan` is right, `speedup` is not. The naive schedule runs every stage on the "
            "whole batch one after the other: how long is that step?"
        )
    passed(f"Right: {t:g} units, a speed-up of {s:.3g} out of an ideal {p}.")


# --------------------------------------------------------------------------- 2.5

PROBLEMS = ("a", "b", "c", "d")
FIXES = ("a", "b", "c", "d")
MLP_5 = {"d_in": 256, "d_hidden": 512, "d_out": 10, "depth": 5}


def given_5(v: Variant = DEFAULT) -> dict:
    return {"blocks_on_stage0": v.pick("5s", 1, [1, 4])}


def stage_parameters(blocks_on_stage0: int) -> list[int]:
    """Parameters of the two hand-made stages of exercise 2.5's MLP (its cost per sample)."""
    d_in, hidden, d_out, depth = MLP_5.values()
    layers = [d_in * hidden + hidden] + [hidden * hidden + hidden] * (depth - 1)
    layers.append(hidden * d_out + d_out)  # the output Linear
    return [sum(layers[:blocks_on_stage0]), sum(layers[blocks_on_stage0:])]


def exercise_5(problem, fix, v: Variant = DEFAULT) -> None:
    """Diagnose a GPipe chart with unbalanced stages (which stage is heavy is the variant's)."""
    problem = as_choice(problem, PROBLEMS, "problem")
    fix = as_choice(fix, FIXES, "fix")
    params = stage_parameters(given_5(v)["blocks_on_stage0"])
    heavy = 0 if params[0] > params[1] else 1
    idle = 1 - heavy
    right_problem = "b" if heavy == 0 else "a"
    right_fix = "d" if heavy == 0 else "b"
    wrong_side = "a" if heavy == 0 else "b"
    hints = {
        wrong_side: (
            f"Look again at which row has the most grey in the middle of the step: device "
            f"{heavy} is almost never idle."
        ),
        "c": (
            "The fill-and-drain bubble is at the start and end. Here one device also waits in "
            "the middle of the step: which one, and for what?"
        ),
        "d": "Handing a tensor between threads takes microseconds; these gaps are much longer.",
    }
    expect_choice(problem, right_problem, hints, "`problem` = {got!r} is not it. {hint}")
    fix_hints = {
        "a": (
            "More micro-batches shrink the fill-and-drain bubble, but the slow stage still sets "
            "the pace of every micro-batch."
        ),
        "c": "The learning rate changes the maths of the update, not when devices compute.",
        ("b" if heavy == 0 else "d"): (
            f"That moves layers onto stage {heavy}, the stage that is already the slow one."
        ),
    }
    expect_choice(fix, right_fix, fix_hints, "`problem` is right. `fix` = {got!r} is not: {hint}")
    passed(
        f"Right: stage {heavy} has {params[heavy] / params[idle]:.1f}x the parameters of stage "
        f"{idle}, and a pipeline runs at the pace of its slowest stage. Balance the stages by "
        "measured cost (partition(..., balance='cost')), not by layer count."
    )


# --------------------------------------------------------------------------- 2.6


def given_6(v: Variant = DEFAULT) -> dict:
    batch, m = v.pick("6", (32, 4), [(24, 3), (48, 4), (64, 4), (96, 6), (48, 8), (60, 5)])
    return {"batch": batch, "m": m}


def exercise_6(scale, v: Variant = DEFAULT) -> None:
    """Loss scale per micro-batch so accumulated gradients equal the full-batch gradient."""
    batch, m = given_6(v).values()
    size = batch // m
    want = 1 / m
    value = expect_number(scale, want, "scale")
    if is_right(value, want):
        passed(
            f"Right: each micro-batch loss is a mean over {size} samples; 1/{m} of it, summed "
            f"over {m} micro-batches, is the mean over all {batch}."
        )
        return
    if is_right(value, 1 / batch):
        fail(
            f"Each micro-batch loss is already a *mean* over its {size} samples. How many of "
            "those means do you add up?"
        )
    if is_right(value, 1 / size):
        fail(
            f"1/{size} divides by the micro-batch size, which the mean already did. What "
            "factor turns a sum of the micro-batch means into the mean of the whole batch?"
        )
    if is_right(value, 1.0):
        fail(f"Summing {m} unscaled means gives {m} times the full-batch mean gradient.")
    if value > 1:
        fail("The scale makes the sum smaller, not larger: it should be below 1.")
    fail(
        f"Not yet. Write the full-batch mean over {batch} samples as a sum over the {m} "
        "micro-batches of their own means: what factor appears in front of each?"
    )


# --------------------------------------------------------------------------- 2.7


def given_7(v: Variant = DEFAULT) -> dict:
    return {
        "m": v.pick("7m", 4, [3, 5, 6]),
        "F_ms": v.pick("7f", 2.0, [1.5, 2.5, 3.0]),
        "B_ms": v.pick("7b", 4.0, [3.0, 5.0, 6.0]),
        "latency_us": v.pick("7l", 100, [50, 200, 400]),
        "bandwidth_mb_s": v.pick("7w", 500, [250, 400, 800]),
        "message_kb": v.pick("7s", 450, [300, 600, 900]),
    }


def _virtual_step(m: int, forward: float, backward: float, p2p: float) -> float:
    from course_utils.pipeline.schedules import make_schedule
    from course_utils.pipeline.simulate import CostModel, simulate

    costs = CostModel(forward=forward, backward=backward, p2p=p2p)
    return simulate(make_schedule("gpipe", 2, m), costs).makespan


def exercise_7(transfer_ms, step_ms, v: Variant = DEFAULT) -> None:
    """2-device GPipe on the virtual clock: one transfer's time, then the step's makespan."""
    g = given_7(v)
    m, f, b = g["m"], g["F_ms"], g["B_ms"]
    wire_ms = g["message_kb"] / g["bandwidth_mb_s"]  # kB / (MB/s) = ms
    want_t = g["latency_us"] / 1000 + wire_ms
    t = as_number(transfer_ms, "transfer_ms")
    if not is_right(t, want_t):
        if is_right(t, wire_ms):
            fail(
                "`transfer_ms` leaves out the latency: every message pays it once, however "
                "small, before its bytes arrive."
            )
        if is_right(t, g["latency_us"] + wire_ms):
            fail("`transfer_ms` mixes units: the latency is in microseconds, 1 ms = 1000 us.")
        if is_right(t, g["latency_us"] / 1000):
            fail("`transfer_ms` is only the latency: the message's bytes take their time too.")
        if any(is_right(t, g["latency_us"] / 1000 + wire_ms * k) for k in (1000, 1e-3, 8)):
            fail(
                "`transfer_ms`: check the bytes' time. 1 kB at 1 MB/s takes 1 ms, and the "
                "message size is in kilobytes (not kilobits)."
            )
        expect_number(t, want_t, "transfer_ms")  # a too-rounded answer is told so
        fail("`transfer_ms` is not right: a message takes latency + bytes / bandwidth.")
    want = _virtual_step(m, f, b, want_t)
    step = as_number(step_ms, "step_ms")
    if is_right(step, want):
        passed(
            f"Right: {want:.3g} ms. Of the {2 * m} messages each way, only the first "
            "activation and the first gradient lie on the critical path; the others travel "
            "while the devices compute."
        )
        return
    if is_right(step, _virtual_step(m, f, b, 0.0)):
        fail(
            "`transfer_ms` is right, `step_ms` leaves the links out. Device 1 cannot start "
            "before the first activation has arrived, nor device 0 its backward before the "
            "first gradient."
        )
    if is_right(step, _virtual_step(m, f, b, 0.0) + 2 * m * want_t):
        fail(
            "`transfer_ms` is right, but not every transfer adds to the step: a device sends "
            "and goes straight on to its next micro-batch while the bytes travel. Which "
            "transfers does nothing hide?"
        )
    if is_right(step, _virtual_step(m, f, b, 0.0) + want_t):
        fail("`transfer_ms` is right. One transfer is counted, but the backward needs one too.")
    if is_right(step, 2 * m * (f + b) + 2 * want_t):
        fail(
            "`transfer_ms` is right. That is the naive schedule's step (each stage on the whole "
            "batch in turn); with GPipe the two devices overlap on different micro-batches."
        )
    expect_number(step, want, "step_ms")
    fail(
        "`transfer_ms` is right, `step_ms` is not. Draw the chart: device 1's first forward "
        "waits for 0F0 plus one transfer, device 0's first backward for 1B0 plus one."
    )


__all__ = [f"exercise_{k}" for k in range(1, 8)]
