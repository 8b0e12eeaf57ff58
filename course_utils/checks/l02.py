"""Checks for lesson 02's exercises (micro-batching and the GPipe pipeline).

Every expected answer is computed by the course's simulator (`course_utils.pipeline`), so
the feedback names the exact action that is wrong. Conventions, stated in the lesson and in
the exercises alike: stages, devices and micro-batches are numbered from 0 (`2F1` is stage
2's forward of micro-batch 1); stage s runs on device s; GPipe runs each device's backwards
in the order its forwards ran, first in, first out (`0B0` before `0B1`), as PyTorch's
ScheduleGPipe does.
"""

from __future__ import annotations

from course_utils import checks
from course_utils.actions import Action
from course_utils.checks import DEFAULT, OTHERWISE, Variant, exercise, fail, judge, numbers, pick
from course_utils.checks.programs import ProgramCase, as_program, drawn_case

for_student = checks.lesson_checks(__name__)
ACTIONS = checks.sequence(item=checks.as_action)


def _simulate(name: str, p: int, m: int, forward=1.0, backward=2.0, p2p=0.0):
    from course_utils.pipeline import CostModel, make_schedule, simulate

    costs = CostModel(forward=forward, backward=backward, p2p=p2p)
    return simulate(make_schedule(name, p, m), costs)


def _starts(p: int, m: int) -> dict[Action, float]:
    return {e.action: e.start for e in _simulate("gpipe", p, m).events if e.action.is_compute}


def _fail_if_lifo(actions: list[Action], shown: str) -> None:
    """Backwards listed last in, first out: a valid schedule, but not the course's GPipe."""
    for s in sorted({a.stage for a in actions}):
        order = [a.microbatch or 0 for a in actions if a.stage == s and a.kind == "B"]
        if len(order) > 1 and order == sorted(order, reverse=True):
            fail(
                f"{shown} runs stage {s}'s backwards last in, first out ({s}B0 last). That "
                "is a valid schedule (the GPipe paper's figure draws it so), but the "
                f"convention of this course, stated above, is first in, first out: {s}B0 "
                "first, in the order the forwards ran, as PyTorch's ScheduleGPipe does."
            )


# Lesson 02, section 2 walks GPipe on p = m = 2 event by event: never that pipeline here.
given_1 = numbers(pick("1", (2, 3), [(2, 3), (3, 2)], "p", "m"))


@exercise(given_1, order=ACTIONS)
def exercise_1(g, order) -> str:
    """Order the compute actions of GPipe (p devices, m micro-batches) by start time."""
    starts = _starts(g.p, g.m)
    unknown = [a for a in order if a not in starts]
    if unknown:
        fail(
            f"{unknown[0]} does not happen in this pipeline: there are stages 0 to {g.p - 1}, "
            f"micro-batches 0 to {g.m - 1}, and the kinds F and B."
        )
    twice = [a for i, a in enumerate(order) if a in order[:i]]
    if twice:
        fail(f"{twice[0]} is listed twice: every action happens exactly once.")
    missing = sorted(set(starts) - set(order))
    if missing:
        fail(f"{len(missing)} of the {len(starts)} actions are missing, for example {missing[0]}.")
    _fail_if_lifo(order, "Your order")
    for i, later in enumerate(order):
        for earlier in order[i + 1 :]:
            if starts[earlier] < starts[later]:
                if earlier.stage == later.stage:
                    why = f"both run on device {later.stage}, which can do one thing at a time"
                elif later.kind == "B" and earlier.kind == "F":
                    why = "GPipe runs every forward before the first backward"
                else:
                    why = "follow what each action needs: activations flow down, gradients up"
                fail(f"{later} is listed before {earlier}, but {earlier} starts first ({why}).")
    return (
        "Right: forwards go down the pipeline one step behind each other, the backward starts "
        "at the last stage and the gradients climb back up. (Actions that start at the same "
        "moment may be listed in either order.)"
    )


# Lesson 02 works "when `2F1` ends" (section 3 and the recap): never that event here.
given_2 = numbers(
    pick("2e", (3, 2), [(2, 2), (2, 3), (3, 1), (3, 2), (3, 3)], "stage", "microbatch"),
    p=pick("2p", 4, [4, 5, 6]),
    m=pick("2m", 8, [8, 10, 12]),
)


@exercise(given_2, stage0_action=checks.as_action, stage1_action=checks.as_action, partial=True)
def exercise_2(g, stage0_action, stage1_action) -> str:
    """GPipe (p stages, m micro-batches): what stages 0 and 1 start when a forward ends."""
    starts = _starts(g.p, g.m)
    moment = starts[Action(g.stage, "F", g.microbatch)] + 1.0  # F takes 1 unit here
    event = f"{g.stage}F{g.microbatch}"
    fields = checks.Fields()
    for got, stage, name in (
        (stage0_action, 0, "stage0_action"),
        (stage1_action, 1, "stage1_action"),
    ):
        with fields.judging():
            _judge_snapshot(g, starts, moment, event, got, stage, name)
    fields.verdict()
    busy = min(g.stage + 2, g.p)  # stages 0..stage+1 all start or run a forward at that moment
    return (
        f"Right: when {event} ends, stage 1 starts {stage1_action} and stage 0 starts "
        f"{stage0_action}: {busy} stages busy on different micro-batches at once."
    )


def _judge_snapshot(g, starts, moment, event, got, stage: int, name: str) -> None:
    """One of 2.2's two actions: what stage `stage` starts at `moment`."""
    if got.stage != stage:
        fail(f"`{name}` should be an action of stage {stage}, like '{stage}F0'.")
    want = next(a for a, t in starts.items() if a.stage == stage and t == moment)
    if got == want:
        return
    if got.kind != "F":
        fail(f"`{name}` is not right: when {event} ends, no backward has started anywhere.")
    if got.microbatch is None:
        fail(f"`{name}` = {got!r} needs a micro-batch number, like '{stage}F0'.")
    assert want.microbatch is not None  # the simulator's compute actions all have one
    fail(
        f"`{name}` = {got} is {'ahead' if got.microbatch > want.microbatch else 'behind'}. "
        f"Stage {stage} is {g.stage - stage} step(s) ahead of stage {g.stage} and starts a "
        "new micro-batch every forward time: count forward slots from time 0."
    )


# Devices of pipelines no one can build whole in time: the function must construct one
# device's list from d and m itself.
HUGE = [(10**9, 3, 987_654_321), (123_456_789, 2, 123_456_788)]


def cases_3(variant: Variant = DEFAULT) -> dict[str, list[tuple]]:
    rng = variant.cases("3")
    shapes = [(2, 2)] + [(rng.randint(2, 5), rng.randint(1, 8)) for _ in range(4)]
    small = [(p, m, d) for p, m in shapes for d in range(p)]
    return {"gpipe_device": [*small, *HUGE]}


def _device_list(result, shown: str, d: int) -> list[Action]:
    actions = ACTIONS(result, shown)
    wrong_stage = [a for a in actions if a.stage != d]
    if wrong_stage:
        fail(f"{shown} lists {wrong_stage[0]}, but device {d} runs stage {d} only.")
    kinds = [a.kind for a in actions]
    if "B" in kinds and "F" in kinds[kinds.index("B") :]:
        fail(
            f"{shown} runs a backward before its last forward. That order can work, but it is "
            "not GPipe: all forwards first, then all backwards."
        )
    _fail_if_lifo(actions, shown)
    return actions


@exercise(gpipe_device="function", partial=True)
def exercise_3(gpipe_device, variant) -> str:
    """Build gpipe_device(p, m, d) -> device d's GPipe actions, in order, as strings."""
    from course_utils.pipeline.simulate import validate

    lists: dict[tuple[int, int], list[list[Action]]] = {}
    why = "The check also asks for one device of a pipeline far too long to build whole: "
    why += "write device d's list from d and m, without making the whole schedule."
    cases = cases_3(variant)["gpipe_device"]
    for (p, m, d), shown, result in checks.each_call(gpipe_device, cases, HUGE, why):
        actions = _device_list(result, shown, d)
        if (p, m, d) in HUGE:
            want = [Action(d, "F", k) for k in range(m)] + [Action(d, "B", k) for k in range(m)]
            if actions != want:
                fail(f"{shown} is not device {d}'s GPipe list (check it on a small pipeline).")
            continue
        lists.setdefault((p, m), []).append(actions)
        problems = validate(lists[(p, m)], p, m) if len(lists[(p, m)]) == p else []
        if problems:
            fail(f"The lists of gpipe_device({p}, {m}, d) for d = 0..{p - 1}: {problems[0]}.")
    shapes = ", ".join(f"({p}, {m})" for p, m in lists)
    return (
        f"Right on random shapes (p, m) = {shapes}, every device a valid GPipe list, "
        "and on devices of pipelines with a hundred million stages and more."
    )


# Lesson 02 times GPipe on p = 4, m = 8 (F = 1, B = 2) and p = 2: no variant is one of those.
given_4 = numbers(
    p=pick("4p", 4, [3, 5, 6]), m=pick("4m", 6, [6, 12, 16]), F=1, B=pick("4b", 2, [2, 3])
)


@exercise(given_4, makespan="number", speedup="number", partial=True)
def exercise_4(g, makespan, speedup) -> str:
    """GPipe with p stages, m micro-batches, F and B per micro-batch: makespan and speed-up."""
    p, m, f, b = g.values()
    want = _simulate("gpipe", p, m, f, b).makespan
    naive = _simulate("naive", p, m, f, b).makespan  # the batch as one piece
    off_by_one = checks.any_of((m + p - 2) * (f + b), (m + p) * (f + b))
    hints = {
        "That is one device's busy time. The step also contains the time to fill the "
        "pipeline and drain it again: how many extra slots does that take?": m * (f + b),
        "That is the naive (unpipelined) step. With micro-batches the stages overlap.": naive,
        f"Off by one slot. Count again how many forward slots pass before stage {p - 1} "
        "starts its first forward (the fill), then its m forwards.": off_by_one,
        "`makespan` is not right. Draw the forward half: when does the last stage finish "
        "its last forward? The backward half is the mirror image, B/F times as slow.": OTHERWISE,
    }
    whole = makespan.is_integer() and float(want).is_integer()  # a whole number: no rounding
    fields = checks.Fields()
    with fields.judging():
        judge(makespan, want, "makespan", hints, rounding=not whole)
    hints = {
        f"`speedup`: {p}x is the ideal with no fill and drain; the speed-up is the naive "
        "step's time divided by GPipe's makespan.": p,
        "`speedup` is upside down: naive time / GPipe time.": want / naive,
        "`speedup` is not right. The naive schedule runs every stage on the whole batch one "
        "after the other: how long is that step, next to GPipe's?": OTHERWISE,
    }
    with fields.judging():
        judge(speedup, naive / want, "speedup", hints)
    fields.verdict()
    return f"Right: {makespan:g} units, a speed-up of {speedup:.3g} out of an ideal {p}."


MLP_5 = {"d_in": 256, "d_hidden": 512, "d_out": 10, "depth": 5}
given_5 = numbers(blocks_on_stage0=pick("5s", 1, [1, 4]))


def stage_parameters(blocks_on_stage0: int) -> list[int]:
    """Parameters of the two hand-made stages of exercise 2.5's MLP (its cost per sample)."""
    d_in, hidden, d_out, depth = MLP_5.values()
    layers = [d_in * hidden + hidden] + [hidden * hidden + hidden] * (depth - 1)
    layers.append(hidden * d_out + d_out)  # the output Linear
    return [sum(layers[:blocks_on_stage0]), sum(layers[blocks_on_stage0:])]


@exercise(given_5, problem="letter", fix="letter", partial=True)
def exercise_5(g, problem, fix) -> str:
    """Diagnose a GPipe chart with unbalanced stages (which stage is heavy is the variant's)."""
    params = stage_parameters(g.blocks_on_stage0)
    heavy = 0 if params[0] > params[1] else 1
    hints = {
        ("a" if heavy == 0 else "b"): (
            f"Look again at which row has the most grey in the middle of the step: device "
            f"{heavy} is almost never idle."
        ),
        "c": "The fill-and-drain bubble is at the start and end. Here one device also waits in "
        "the middle of the step: which one, and for what?",
        "d": "Handing a tensor between threads takes microseconds; these gaps are much longer.",
    }
    fields = checks.Fields()
    with fields.judging():
        checks.expect_choice(problem, "ba"[heavy], hints, "`problem` = {got!r} is not it. {hint}")
    hints = {
        "a": "More micro-batches shrink the fill-and-drain bubble, but the slow stage still "
        "sets the pace of every micro-batch.",
        "c": "The learning rate changes the maths of the update, not when devices compute.",
        ("b" if heavy == 0 else "d"): (
            f"That moves layers onto stage {heavy}, the stage that is already the slow one."
        ),
    }
    with fields.judging():
        checks.expect_choice(fix, "db"[heavy], hints, "`fix` = {got!r} is not it: {hint}")
    fields.verdict()
    return (
        f"Right: stage {heavy} has {params[heavy] / params[1 - heavy]:.1f}x the parameters of "
        f"stage {1 - heavy}, and a pipeline runs at the pace of its slowest stage. Balance the "
        "stages by their cost (here, their parameters), not by their number of layers."
    )


given_6 = numbers(
    pick("6", (32, 4), [(24, 3), (48, 4), (64, 4), (96, 6), (48, 8), (60, 5)], "batch", "m")
)


def cases_6(variant: Variant = DEFAULT) -> dict[str, list[tuple]]:
    """The learner's own batch on 2 ranks, then two more pipelines (never as many ranks as
    micro-batches): drawn from the student's name in a notebook, secret in the grader."""
    from course_utils.checks.pipeline_cases import AccumCase

    rng = variant.cases("6")
    g = given_6(variant)
    cases = [AccumCase(devices=2, microbatches=g.m, batch=g.batch, hidden=16, depth=2, seed=6)]
    for _ in range(2):
        p = rng.randint(2, 3)
        m = rng.choice([k for k in range(3, 7) if k != p])
        cases.append(AccumCase(**vars(drawn_case(rng, p, m))))
    return {"accumulate_program": [(case,) for case in cases]}


FOLLOW = (
    "Follow micro-batch 0 through your program, rank by rank: every receive must come after "
    "the send it waits for, on the other rank."
)
ADVICE_6 = {
    "deadlock": FOLLOW,
    "tag": "Micro-batches received in the wrong order: every rank takes the micro-batches in "
    "the same order.",
}


@exercise(given_6, accumulate_program=as_program, points=3, partial=True)
def exercise_6(g, accumulate_program, variant) -> str:
    """Build gradient accumulation: each micro-batch's loss scaled so that the gradients
    added up over the micro-batches are the whole batch's."""
    from course_utils.checks import pipeline_hints
    from course_utils.checks.accumulation_build import judge_gradients
    from course_utils.checks.programs import evidence

    for (case,), shown, got in checks.each_call(
        accumulate_program, cases_6(variant)["accumulate_program"]
    ):
        run = evidence(got, shown, case)
        if run["failure"] is None:
            judge_gradients(shown, run, case)
        pipeline_hints.judged_run(got, shown, case, ADVICE_6)
    size = g.batch // g.m
    return (
        f"Right: on your {g.m} micro-batches and on two other pipelines the gradients added "
        f"up are the whole batch's. Each micro-batch's loss is a mean over {size} rows; 1/{g.m} "
        f"of it, summed over {g.m} micro-batches, is the mean over all {g.batch}."
    )


given_7 = numbers(
    m=pick("7m", 4, [3, 5, 6]),
    F_ms=pick("7f", 2.0, [1.5, 2.5, 3.0]),
    B_ms=pick("7b", 4.0, [3.0, 5.0, 6.0]),
    latency_us=pick("7l", 100, [50, 200, 400]),
    bandwidth_mb_s=pick("7w", 500, [250, 400, 800]),
    message_kb=pick("7s", 450, [300, 600, 900]),
)


@exercise(given_7, transfer_ms="number", step_ms="number", partial=True)
def exercise_7(g, transfer_ms, step_ms) -> str:
    """2-device GPipe on the virtual clock: one transfer's time, then the step's makespan."""
    m, f, b, us = g.m, g.F_ms, g.B_ms, g.latency_us
    wire, ms = g.message_kb / g.bandwidth_mb_s, us / 1000  # kB / (MB/s) = ms
    want = ms + wire
    bytes_off = checks.any_of(*(ms + wire * k for k in (1e3, 1e-3, 8)))
    hints = {
        "`transfer_ms` leaves out the latency: every message pays it once, however small, "
        "before its bytes arrive.": wire,
        "`transfer_ms` mixes units: the latency is in microseconds, 1 ms = 1000 us.": us + wire,
        "`transfer_ms` is only the latency: the message's bytes take their time too.": ms,
        "`transfer_ms`: check the bytes' time. 1 kB at 1 MB/s takes 1 ms, and the message size "
        "is in kilobytes (not kilobits).": bytes_off,
        "`transfer_ms` is not right: a message takes latency + bytes / bandwidth.": OTHERWISE,
    }
    fields = checks.Fields()
    with fields.judging():
        judge(transfer_ms, want, "transfer_ms", hints)
    free = _simulate("gpipe", 2, m, f, b).makespan  # the same step with free links
    step = _simulate("gpipe", 2, m, f, b, p2p=want).makespan
    one = free + want  # one transfer on the critical path instead of two
    hints = {
        "`step_ms` leaves the links out. Device 1 cannot start before "
        "the first activation has arrived, nor device 0 its backward before the first "
        "gradient.": free,
        "`step_ms`: not every transfer adds to the step: a device sends and "
        "goes straight on to its next micro-batch while the bytes travel. Which transfers does "
        "nothing hide?": free + 2 * m * want,
        "`step_ms` counts one transfer, but the backward needs one too.": one,
        "`step_ms` is the naive schedule's step (each stage on the whole "
        "batch in turn); with GPipe the two devices overlap on different "
        "micro-batches.": 2 * m * (f + b) + 2 * want,
        "`step_ms` is not right. Draw the chart: device 1's first forward "
        "waits for 0F0 plus one transfer, device 0's first backward for 1B0 plus one.": OTHERWISE,
    }
    with fields.judging():
        judge(step_ms, step, "step_ms", hints)
    fields.verdict()
    return (
        f"Right: {step:.3g} ms. Of the {2 * m} messages ({m} activations down, {m} gradients "
        "up), only the first activation and the first gradient lie on the critical path; the "
        "others travel while the devices compute."
    )


# --------------------------------------------------------------------------- 2.8: the program


given_8 = numbers(pick("8", (3, 5), [(2, 6), (3, 4), (4, 6), (4, 5)], "p", "m"))


def case_8(g) -> ProgramCase:
    """The learner's own pipeline: `g.p` ranks, `g.m` micro-batches of two rows each."""
    return ProgramCase(devices=g.p, microbatches=g.m, batch=2 * g.m, hidden=24, depth=g.p, seed=8)


def cases_8(variant: Variant = DEFAULT) -> dict[str, list[tuple]]:
    """The learner's own pipeline, then two more (other sizes, depths and seeds): drawn from
    the student's name in a notebook, secret in the grader."""
    rng = variant.cases("8")
    cases = [case_8(given_8(variant))]
    for _ in range(2):
        cases.append(drawn_case(rng, rng.randint(2, 4), rng.randint(2, 6)))
    return {"gpipe_program": [(case,) for case in cases]}


ADVICE_8 = {
    "deadlock": FOLLOW,
    "tag": "Micro-batches received in the wrong order: a rank gets a neighbour's messages in "
    "the order they were sent, so run the backwards in the order the gradients come back.",
}


@exercise(given_8, gpipe_program=as_program, points=3, partial=True)
def exercise_8(gpipe_program, variant) -> str:
    """Build GPipe as a per-rank program; judged on the run's evidence and its order."""
    from course_utils.checks import pipeline_hints

    cases = cases_8(variant)["gpipe_program"]
    for (case,), shown, got in checks.each_call(gpipe_program, cases):
        run = pipeline_hints.judged_run(got, shown, case, ADVICE_8)
        rank = pipeline_hints.early_backward(run)
        if rank is not None:
            fail(
                f"{shown}: rank {rank} runs a backward before its last forward. That order can "
                "work (lesson 04), but it is not GPipe: all forwards first, then all backwards."
            )
        why = "A backward can start once its gradient is back: run each rank's backwards "
        pipeline_hints.order(shown, run, case, "gpipe", why + "in the order they arrive.")
    return (
        f"Right: on your {cases[0][0].devices} ranks and two other pipelines every rank's "
        "gradients equal one device's, and the order the ranks ran replays to GPipe's step. "
        "Each rank keeps every micro-batch's input and output from its forward to its "
        "backward: that is GPipe's memory, lesson 04's subject."
    )


# ------------------------------------------------------------ 2.9: reading a profiler's trace

MLP_9 = {"d_in": 32, "d_hidden": 64, "d_out": 10}
given_9 = numbers(
    pick("9", (2, 4), [(2, 5), (3, 5), (3, 6), (2, 3)], "p", "depth"),
    k=pick("9k", 1, [0, 2, 3]),
)


def linears_per_stage(p: int, depth: int) -> list[int]:
    """How many Linear layers each of the p stages of exercise 2.9's MLP holds: the raw
    evidence, read off the course's own split of the real model."""
    from torch import nn

    from course_utils.models import MLP, partition

    stages = partition(MLP(**MLP_9, depth=depth), p)
    return [sum(isinstance(m, nn.Linear) for m in stage.modules()) for stage in stages]


@exercise(given_9, mm_first="number", mm_last="number", partial=True)
def exercise_9(g, mm_first, mm_last) -> str:
    """Read a profiler's trace: aten::mm calls inside the first and the last stage's backward.

    Autograd's backward of a Linear (addmm) makes two matrix products, the input gradient and
    the weight gradient, except where no one needs the input's gradient: stage 0's input is the
    data batch. So 0B has 2 x its Linears - 1, the last stage 2 x its Linears
    (tests/test_checks_l02.py proves it against torch.profiler's own trace)."""
    linears = linears_per_stage(g.p, g.depth)
    n0, n_end = linears[0], linears[-1]
    first, last = 2 * n0 - 1, 2 * n_end
    k, end = g.k, g.p - 1
    hints = {
        "`mm_first` counts two products for every Linear of stage 0. Look again at the first "
        "one: its input is the data batch, and nothing asks for the data's gradient, so "
        "autograd skips one of its products.": 2 * n0,
        "`mm_first` is one product per Linear: the forward's count (it runs aten::addmm). A "
        "Linear's backward makes two products, count them inside the backward's slice.": n0,
        "`mm_first` is 0: are you counting inside the forward? Count the aten::mm slices inside "
        f"0B{k}.": 0,
        f"`mm_first` is not what the trace says. Count the aten::mm calls inside 0B{k} "
        f"(profile.operators_in('0B{k}')['aten::mm']).": OTHERWISE,
    }
    fields = checks.Fields()  # every wrong answer named at once
    with fields.judging():
        judge(mm_first, first, "mm_first", hints, rounding=False)
    hints = {
        f"`mm_last` skips a product, but the last stage's input is stage "
        f"{end - 1}'s activation: its gradient is sent back, so every Linear of stage {end} "
        "makes both products.": 2 * n_end - 1,
        "`mm_last` is one product per Linear, the forward's count; the "
        "backward makes two per Linear.": n_end,
        f"`mm_last` is not what the trace says. Count the aten::mm calls "
        f"inside {end}B{k}.": OTHERWISE,
    }
    with fields.judging():
        judge(mm_last, last, "mm_last", hints, rounding=False)
    fields.verdict()
    return (
        f"Right: {first} and {last}. Each Linear's backward makes two matrix products (the "
        "gradient of its input and of its weight); stage 0 has nobody to send an input "
        "gradient to, so autograd skips that product for its first layer. The Gantt shows "
        f"{end}B{k} as one bar; only the trace shows what is inside it."
    )
