"""Checks for the exercises of lesson 11 (V-shaped pipeline schedules: ZB-V and DualPipeV).

Each `exercise_K` is called by the check cell of Exercise 11.K in
`exercises/11_v_shaped_schedules.ipynb`, with the learner's variant `v`: `given_K(v)` draws
the exercise's numbers (the default student gets the course's own), and every expected
answer is computed from them, here, with `course_utils.pipeline.vshape` (the closed forms
and the builders) or the simulator. `cases_3(v)` are the inputs the Build exercise's
function is tried on.

Conventions shared with the lesson: p devices hold 2p stages; in a V device d holds stage d
(its down chunk) and stage 2p-1-d (its up chunk); F, I and W are the costs of one
micro-batch through one chunk (one stage), B = I + W; stages, devices and micro-batches are
numbered from 0 and actions are written like PyTorch's: `3F0` is stage 3's forward of
micro-batch 0. ZB-V: Qi et al. 2024, arXiv 2401.10241; DualPipeV: DeepSeek-AI 2024, arXiv
2412.19437.
"""

from __future__ import annotations

from course_utils.checks import (
    DEFAULT,
    Variant,
    as_choice,
    as_int,
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


def for_student(student: str = "default"):
    """This lesson's checks with `student`'s numbers (the notebook's first code cell)."""
    import sys

    return _for_student(sys.modules[__name__], student)


def _v(p: int) -> list[list[int]]:
    return [[d, 2 * p - 1 - d] for d in range(p)]


# --------------------------------------------------------------------------- 11.1


def given_1(v: Variant = DEFAULT) -> dict:
    return {"p": v.pick("1p", 4, [3, 5, 6])}


def exercise_1(stages_of_device, loss_device, v: Variant = DEFAULT) -> None:
    """The V placement for p devices: each device's [down, up] stages, and the loss's device."""
    p = given_1(v)["p"]
    rows = as_sequence(stages_of_device, "stages_of_device")
    require(loss_device, "loss_device")
    want = _v(p)
    if len(rows) != p:
        fail(
            f"`stages_of_device` has {len(rows)} entries; it needs one per device ({p}), each "
            "the list of the stages that device holds."
        )
    got = [as_sequence(r, f"stages_of_device[{d}]", item=as_int) for d, r in enumerate(rows)]
    if any(len(r) != 2 for r in got):
        fail("In a V every device holds exactly two stages: give each device a pair.")
    if sorted(s for r in got for s in r) != list(range(2 * p)):
        fail(
            f"`stages_of_device` must hand out each of the 2p = {2 * p} stages "
            f"0..{2 * p - 1} exactly once: {got}."
        )
    if got != want:
        if [sorted(r) for r in got] == want:
            fail("Give each device's stages in increasing order: [down stage, up stage].")
        if got == [[d, d + p] for d in range(p)]:
            fail(
                f"{got} is looping placement (stage s on device s mod {p}), as in interleaved "
                "1F1B. In a V the stages go down the devices and then back up."
            )
        fail(
            f"{got} is not a V. Walk the stages 0, 1, 2, ... down the devices 0 .. p-1, then "
            "turn at the last device and walk back up."
        )
    loss = as_int(loss_device, "loss_device")
    if loss != 0:
        if loss == p - 1:
            fail(
                f"Device {p - 1} is the bottom of the V. The loss is computed after the last "
                f"stage, {2 * p - 1}: which device holds it?"
            )
        fail(f"`loss_device` is not right: which device holds the last stage, {2 * p - 1}?")
    passed(
        f"Right: {want}. The stages meet at the bottom of the V (device {p - 1} holds "
        f"{p - 1} and {p}), and device 0 holds both the first and the last stage, so the "
        "input and the loss are on the same device."
    )


# --------------------------------------------------------------------------- 11.2


def given_2(v: Variant = DEFAULT) -> dict:
    p = v.pick("2p", 4, [3, 5, 6])
    m = v.pick("2m", 2 * p, [2 * p - 1, 2 * p, 3 * p])
    F, I, W = v.pick(  # noqa: N806, E741
        "2c", (1.0, 1.2, 0.8), [(1.0, 1.0, 1.0), (0.8, 1.0, 0.6), (1.0, 1.5, 1.2), (0.9, 1.2, 1.0)]
    )
    return {"p": p, "m": m, "F": F, "I": I, "W": W}


def exercise_2(idle_per_device, bubble, v: Variant = DEFAULT) -> None:
    """ZB-V inside its condition: idle time per device and the bubble fraction of the step."""
    from course_utils.pipeline import vshape

    g = given_2(v)
    p, m, F, I, W = g.values()  # noqa: N806, E741
    assert vshape.zb_v_formula_holds(p, m, F, I, W)
    want_idle = vshape.zb_v_idle(p, F, I, W)
    busy = 2 * m * (F + I + W)
    idle = expect_number(idle_per_device, want_idle, "idle_per_device", unit="units")
    if not is_right(idle, want_idle):
        hints = [
            ((p - 1) * (F + I - W), "that is ZB-H1's bubble, (p-1)(F+I-W)"),
            ((p - 1) * (F + I + W), "that is 1F1B's fill and drain, (p-1)(F+B)"),
            ((p - 1) * F, "the warm-up alone: count the cool-down's slant too"),
            (2 * (p - 1) * I, "chunk costs already are per chunk: do not double them"),
            (p * I, "count the devices the slant crosses: p-1 steps, not p"),
        ]
        for value, hint in hints:
            if value != want_idle and is_right(idle, value):
                fail(f"`idle_per_device` is not ZB-V's: {hint}.")
        fail(
            "`idle_per_device` is not right. Inside its condition every ZB-V device idles "
            "the same total: p-1 steps of one of F, I and W (at F = I = W these are the "
            "slanted ends of a parallelogram; with these costs part of the wait falls "
            "inside the step, but the total is the same). Which cost does the cool-down's "
            "chain of input gradients repeat?"
        )
    want = vshape.bubble_fraction(m, F, I, W, want_idle)
    share = expect_number(bubble, want, "bubble", unit="fraction")
    if not is_right(share, want):
        if is_right(share, want_idle / busy):
            fail(
                "`bubble` is the idle time relative to the busy time. The bubble fraction is "
                "idle / makespan: add the idle time to the busy time."
            )
        if is_right(share, want_idle / (m * (F + I + W) + want_idle)):
            fail(
                "Each device runs 2 chunks for each of the m micro-batches: its busy time is "
                "2m(F+I+W)."
            )
        fail(
            "`bubble` is not right: a device's makespan is its busy time, 2m(F+I+W), plus "
            "its idle time; the bubble fraction is idle / makespan."
        )
    passed(
        f"Right: every device idles (p-1) I = {want_idle:g} of a {busy + want_idle:g}-unit "
        f"step, a bubble of {want:.2%}. ZB-V's I/W split fills everything but the slanted "
        "ends; the ends stay because the first and the last micro-batch must cross the V."
    )


# --------------------------------------------------------------------------- 11.3


def cases_3(v: Variant = DEFAULT) -> dict[str, list[tuple]]:
    rng = v.cases("3")
    cases = [(2, 4), (1, rng.randint(1, 3)), (rng.randint(2, 5), 1)]
    cases += [(rng.randint(2, 5), rng.randint(2, 8)) for _ in range(4)]
    return {"v_gpipe": cases}


def _text(action) -> str:
    return str(action).strip()


def exercise_3(v_gpipe, v: Variant = DEFAULT) -> None:
    """Build v_gpipe(p, m): fill-and-drain (GPipe) on a V of 2p stages, as per-device lists."""
    from course_utils.actions import Action
    from course_utils.errors import CourseInputError
    from course_utils.pipeline import simulate
    from course_utils.pipeline.simulate import ScheduleError, validate

    call = check_function(v_gpipe, "v_gpipe")
    cases = cases_3(v)["v_gpipe"]
    example: list[list[str]] = []
    for p, m in cases:
        shown = f"v_gpipe({p}, {m})"
        rows = as_sequence(call(p, m), shown)
        if len(rows) != p:
            fail(f"{shown} has {len(rows)} rows; it needs one list of actions per device ({p}).")
        devices: list[list[Action]] = []
        for d, row in enumerate(rows):
            actions = []
            for i, item in enumerate(as_sequence(row, f"device {d}'s actions in {shown}")):
                try:
                    actions.append(Action.parse(item))
                except (CourseInputError, ValueError) as exc:
                    fail(f"{shown}: device {d}, action {i} = {item!r} is not an action: {exc}.")
            devices.append(actions)
        kinds = {a.kind for row in devices for a in row}
        if kinds - {"F", "B"}:
            fail(
                f"{shown} uses {sorted(kinds - {'F', 'B'})}: this exercise keeps each backward "
                "whole (B), as GPipe does. Splitting it into I and W is ZB-V's trick."
            )
        try:
            problems = validate(devices, 2 * p, m)
        except (CourseInputError, ScheduleError) as exc:
            problems = [str(exc)]
        if problems:
            fail(f"{shown} cannot run: {problems[0]}.")
        for d, row in enumerate(devices):
            held = sorted({a.stage for a in row})
            if held != sorted(_v(p)[d]):
                looping = sorted({d, d + p})
                hint = (
                    "that is looping placement; in a V device d holds stages d and 2p-1-d"
                    if held == looping
                    else "in a V device d holds stages d and 2p-1-d"
                )
                fail(f"{shown}: device {d} runs stages {held}: {hint}.")
            kinds_in_order = [a.kind for a in row]
            if "B" in kinds_in_order and "F" in kinds_in_order[kinds_in_order.index("B") :]:
                first_b = kinds_in_order.index("B")
                fail(
                    f"{shown}: device {d} runs {_text(row[first_b])} before all its forwards "
                    "are done. GPipe fills first and drains after: every forward of a device, "
                    "then its backwards."
                )
        example = example or [[str(a) for a in row] for row in devices]
    timeline = simulate(_schedule([[str(a) for a in row] for row in devices], 2 * p, m))
    passed(
        f"Right on {len(cases)} fresh (p, m) cases, e.g. {cases[0]}: {example}. "
        f"Simulated with equal costs the last case ({p}, {m}) idles "
        f"{timeline.bubble_fraction:.0%} of its step, and every device holds all 2m chunks' "
        "activations at the turn: what 1F1B's and ZB-V's orders avoid."
    )


def _schedule(orders: list[list[str]], stages: int, m: int, name: str = "v"):
    from course_utils.actions import Action, Schedule

    return Schedule(name, stages, m, tuple(tuple(Action.parse(a) for a in r) for r in orders))


# --------------------------------------------------------------------------- 11.4


def given_4(v: Variant = DEFAULT) -> dict:
    return {"p": v.pick("4p", 4, [3, 5, 6, 8])}


def exercise_4(plain_1f1b, looping, v_shape, v: Variant = DEFAULT) -> None:
    """Transfers between devices of one micro-batch (forward and backward) for 3 placements."""
    from course_utils.pipeline.vshape import transfers_per_microbatch

    p = given_4(v)["p"]
    want = {
        "plain_1f1b": 2 * (p - 1),
        "looping": transfers_per_microbatch(p, "looping"),
        "v_shape": transfers_per_microbatch(p, "v"),
    }
    got = {
        "plain_1f1b": as_int(plain_1f1b, "plain_1f1b"),
        "looping": as_int(looping, "looping"),
        "v_shape": as_int(v_shape, "v_shape"),
    }
    boundaries = {"plain_1f1b": p - 1, "looping": 2 * p - 1, "v_shape": 2 * p - 2}
    for name, right in want.items():
        mine = got[name]
        if mine == right:
            continue
        if mine == boundaries[name]:
            fail(
                f"`{name}` counts the forward only. The backward sends a gradient back over "
                "every boundary the forward crossed."
            )
        if name == "v_shape" and mine == want["looping"]:
            fail(
                "`v_shape`: in a V one boundary between neighbouring stages stays inside a "
                "device. Which one?"
            )
        if name == "looping" and mine == 2 * (2 * p - 2):
            fail(
                "`looping`: with stage s on device s mod p, do two neighbouring stages ever "
                "sit on the same device?"
            )
        if mine in (right + 2, right + 1):
            fail(
                f"`{name}` counts one boundary too many: the input arrives and the loss is "
                "computed on a device; only the boundaries between stages cross devices."
            )
        fail(
            f"`{name}` is not right. Count the boundaries between neighbouring stages that "
            "lie between two different devices, then remember the backward."
        )
    passed(
        f"Right: {want['plain_1f1b']}, {want['looping']} and {want['v_shape']}. Two chunks "
        "per device double plain 1F1B's traffic whichever way they are placed; the V saves "
        "the two transfers at its bottom."
    )


# --------------------------------------------------------------------------- 11.5


def given_5(v: Variant = DEFAULT) -> dict:
    p = v.pick("5p", 4, [3, 5])
    m = v.pick("5m", 8, [2 * p, 2 * p + 2])
    F, I, W = v.pick("5c", (1.0, 1.0, 1.0), [(1.0, 1.2, 0.8), (0.8, 1.0, 0.7)])  # noqa: N806, E741
    return {"p": p, "m": m, "F": F, "I": I, "W": W}


def _culprit(v: Variant) -> int:
    p = given_5(v)["p"]
    return v.pick("5k", p - 2, range(1, p))


def their_schedule(v: Variant = DEFAULT):
    """Exercise 11.5's schedule: ZB-V, except that one device runs each W right after its I."""
    from course_utils.actions import Action, Schedule
    from course_utils.pipeline.vshape import zb_v

    g = given_5(v)
    good, k = zb_v(g["p"], g["m"]), _culprit(v)
    rows = []
    for d, row in enumerate(good.devices):
        if d != k:
            rows.append(row)
            continue
        eager: list[Action] = []
        for a in row:
            if a.kind != "W":
                eager.append(a)
            if a.kind == "I":
                eager.append(Action(a.stage, "W", a.microbatch))
        rows.append(tuple(eager))
    return Schedule("their zb-v", good.stages, good.microbatches, tuple(rows))


def their_timeline(v: Variant = DEFAULT):
    """Exercise 11.5's schedule simulated with its chunk costs."""
    from course_utils.pipeline import simulate
    from course_utils.pipeline.vshape import chunk_costs

    g = given_5(v)
    return simulate(their_schedule(v), chunk_costs(g["F"], g["I"], g["W"]))


FIXES = ("a", "b", "c", "d")


def exercise_5(culprit, extra, fix, v: Variant = DEFAULT) -> None:
    """A ZB-V step gone slow: the device whose order is wrong, the time lost, the fix."""
    from course_utils.pipeline import simulate
    from course_utils.pipeline.vshape import chunk_costs, zb_v

    g = given_5(v)
    k = _culprit(v)
    theirs = their_timeline(v)
    right = simulate(zb_v(g["p"], g["m"]), chunk_costs(g["F"], g["I"], g["W"]))
    lost = theirs.makespan - right.makespan
    who = as_int(culprit, "culprit")
    if who not in range(g["p"]):
        fail(f"`culprit` is a device number, 0 to {g['p'] - 1}.")
    if who != k:
        fail(
            f"Device {who} runs ZB-V's own order. Compare each device's row with the same "
            "row of zb_v(p, m), action by action: one row differs. (A W right after its I "
            "proves nothing by itself: ZB-V's own device 0 runs every W that way.)"
        )
    number = expect_number(extra, lost, "extra", unit="units")
    if not is_right(number, lost):
        idle = [theirs.makespan - b for b in theirs.busy_per_device()]
        if is_right(number, idle[0]):
            fail(
                "`extra` is a device's whole idle time. The question asks how much LONGER the "
                "step is than ZB-V's: subtract ZB-V's makespan."
            )
        if is_right(number, theirs.makespan):
            fail("`extra` is their makespan; subtract the makespan of ZB-V's own order.")
        fail(
            "`extra` is not right: their makespan minus the makespan of zb_v(p, m) with the "
            "same chunk costs (simulate both)."
        )
    expect_choice(
        as_choice(fix, FIXES, "fix"),
        "a",
        {
            "b": (
                "the extra wait does not shrink with m: it is paid in the cool-down, "
                "once per step, however many micro-batches come before"
            ),
            "c": (
                "looping placement changes where the stages live, not the order on the "
                "device; it also adds transfers"
            ),
            "d": (
                "a whole B is exactly I followed at once by W: that is what device "
                f"{k} already does"
            ),
        },
        "The numbers are right. `fix` = {got!r} does not help: {hint}.",
    )
    passed(
        f"Right: device {k} runs every W straight after its I, so in the cool-down the input "
        f"gradients the devices before it wait for come a W later each time: the step is "
        f"{lost:g} units longer. Postponed W's fill the gaps instead of making them."
    )


# --------------------------------------------------------------------------- 11.6


def given_6(v: Variant = DEFAULT) -> dict:
    # F = I and I/2 <= W <= I: DeepSeek's DualPipeV figure and ZB-V's both hold exactly.
    p, m, F, I, W = v.pick(  # noqa: N806, E741
        "6",
        (4, 8, 1.0, 1.0, 0.6),
        [
            (3, 6, 1.0, 1.0, 0.5),
            (5, 10, 1.2, 1.2, 0.9),
            (3, 7, 0.9, 0.9, 0.6),
            (6, 12, 1.0, 1.0, 1.0),
        ],
    )
    return {"p": p, "m": m, "F": F, "I": I, "W": W}


def exercise_6(dualpipe_idle, times_zbv, dualpipe_peak, v: Variant = DEFAULT) -> None:
    """DualPipeV against ZB-V: its idle time per device, how many times ZB-V's that is, and
    its peak chunks."""
    from course_utils.pipeline import vshape

    g = given_6(v)
    p, m, F, I, W = g.values()  # noqa: N806, E741
    assert vshape.zb_v_formula_holds(p, m, F, I, W)
    assert vshape.dualpipe_v_formula_holds(p, m, F, I, W)
    want = vshape.dualpipe_v_idle(p, F, I, W)
    zbv = vshape.zb_v_idle(p, F, I, W)
    idle = expect_number(dualpipe_idle, want, "dualpipe_idle", unit="units")
    if not is_right(idle, want):
        if is_right(idle, zbv):
            fail("`dualpipe_idle` is ZB-V's idle time, (p-1) I. DualPipeV's figure differs.")
        if is_right(idle, vshape.dualpipe_v_early_send_idle(p, F, I, W)):
            fail(
                "`dualpipe_idle` is the course's early-send variant, (p-1)(F+I-W), which "
                "sends a slot's forward output as soon as F ends. DualPipeV sends both "
                "results when the whole F&B slot ends, as DeepSeek's code does."
            )
        if is_right(idle, 2 * want):
            fail(
                "`dualpipe_idle` is twice DeepSeek's figure: with PP = 2p stages, "
                "PP/2 - 1 is p - 1, not 2p - 1."
            )
        fail(
            "`dualpipe_idle` is not right: DeepSeek's figure is (PP/2 - 1)(F&B + B - 3W), "
            "with PP = 2p stages, B = I + W and F&B = F + B (nothing computes faster)."
        )
    ratio = expect_number(times_zbv, want / zbv, "times_zbv")
    if not is_right(ratio, want / zbv):
        if is_right(ratio, zbv / want):
            fail("`times_zbv` is upside down: DualPipeV's idle time over ZB-V's.")
        if is_right(ratio, want - zbv):
            fail("`times_zbv` is the difference of the two idle times; give their ratio.")
        fail(
            f"`times_zbv` is not right: divide your DualPipeV figure by ZB-V's (p-1) I for "
            f"these costs (F = {F:g}, I = {I:g}, W = {W:g})."
        )
    peak = as_int(dualpipe_peak, "dualpipe_peak")
    if peak != vshape.dualpipe_v_peak(p):
        if peak == 2 * p:
            fail(
                "2p is ZB-V's peak. In an F&B slot the new forward starts before the old "
                "backward frees its chunk: one more."
            )
        fail(
            "`dualpipe_peak` is not right: count the chunks a device holds at the fullest "
            "moment of the steady state, an F&B slot included."
        )
    passed(
        f"Right: DualPipeV idles (p-1)(F+2I-W) = {want:g} per device, {want / zbv:.3g} "
        f"times ZB-V's (p-1) I = {zbv:g}, and holds 2p+1 = {2 * p + 1} chunks at its "
        "peak. Holding a "
        "slot's results until it ends costs (p-1) I here; DualPipeV's gain is on GPUs, "
        "where a slot's communication hides behind the other chunk's compute."
    )
