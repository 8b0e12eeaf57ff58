"""Checks for lesson 11's exercises (V-shaped pipeline schedules: ZB-V and DualPipeV).

Every expected answer is computed with `course_utils.pipeline.vshape` (the closed forms and
the builders) or the simulator. Conventions shared with the lesson: p devices hold 2p
stages; in a V device d holds stage d (its down chunk) and stage 2p-1-d (its up chunk); F, I
and W are the costs of one micro-batch through one chunk (one stage), B = I + W; stages,
devices and micro-batches are numbered from 0 and actions are written like PyTorch's: `3F0`
is stage 3's forward of micro-batch 0. ZB-V: Qi et al. 2024, arXiv 2401.10241; DualPipeV:
DualPipe (DeepSeek-AI 2024, arXiv 2412.19437) cut in half by Sea AI Lab (2025, "cut-in-half"
blog post), as DeepSeek's dualpipe/dualpipev.py runs it.
"""

from __future__ import annotations

from course_utils import checks
from course_utils.checks import DEFAULT, OTHERWISE, Variant, exercise, judge, numbers, pick
from course_utils.checks.pipeline_cases import VCase, VSplitCase, v_target, zb_v_timeline
from course_utils.checks.programs import as_program, drawn_case

for_student = checks.lesson_checks(__name__)
ACTIONS = checks.sequence(item=checks.as_action)


def _v(p: int) -> list[list[int]]:
    return [[d, 2 * p - 1 - d] for d in range(p)]


given_1 = numbers(p=pick("1p", 4, [3, 5, 6]))


@exercise(given_1, stages_of_device="list", loss_device="whole number", partial=True)
def exercise_1(g, stages_of_device, loss_device) -> str:
    """The V placement for p devices: each device's [down, up] stages, and the loss's device."""
    p, want = g.p, _v(g.p)
    got = checks.as_placement(stages_of_device, "stages_of_device", p, 2 * p)
    hints = {
        "`stages_of_device`: in a V every device holds exactly two stages: give each device a "
        "pair.": any(len(r) != 2 for r in got),
        f"{got} is looping placement (stage s on device s mod {p}), as in interleaved 1F1B. In "
        "a V the stages go down the devices and then back up.": [[d, d + p] for d in range(p)],
        f"{got} is not a V. Walk the stages 0, 1, 2, ... down the devices 0 .. p-1, then turn "
        "at the last device and walk back up.": OTHERWISE,
    }
    fields = checks.Fields()  # every wrong answer named at once
    fields.judge(got, want, "stages_of_device", hints)
    hints = {
        f"Device {p - 1} is the bottom of the V. The loss is computed after the last stage, "
        f"{2 * p - 1}: which device holds it?": p - 1,
        f"`loss_device` is not right: which device holds the last stage, {2 * p - 1}?": OTHERWISE,
    }
    fields.judge(loss_device, 0, "loss_device", hints)
    fields.verdict()
    return (
        f"Right: {want}. The stages meet at the bottom of the V (device {p - 1} holds {p - 1} "
        f"and {p}), and device 0 holds both the first and the last stage, so the input and the "
        "loss are on the same device."
    )


# --------------------------------------------------------------------------- 11.2: ZB-V


given_2 = numbers(pick("2", (3, 6), [(2, 4), (2, 5), (3, 5), (4, 7)], "p", "m"))


def _v_cases(variant: Variant, k: int, kind: type[VCase], seed: int, micro) -> list:
    """Exercise `k`'s trials: the learner's own V (`g.p` ranks of two stages, `g.m`
    micro-batches), then two more (2 and 3 ranks, `micro(p)` gives the fewest and most
    micro-batches; other sizes and seeds): drawn from the student's name in a notebook,
    secret in the grader."""
    g, rng = (given_2 if k == 2 else given_3)(variant), variant.cases(str(k))
    mine = dict(devices=g.p, microbatches=g.m, batch=g.m, hidden=16, depth=2 * g.p, seed=seed)
    cases = [kind(chunks=2, **mine)]
    for p in (2, 3):
        drawn = drawn_case(rng, p, rng.randint(*micro(p)), chunks=2)
        cases.append(kind(**{k: getattr(drawn, k) for k in drawn.__dataclass_fields__}))
    return [(case,) for case in cases]


def cases_2(variant: Variant = DEFAULT) -> dict[str, list[tuple]]:
    """The learner's own ZB-V, then two more, each with enough micro-batches (2p-1 or more)
    to fill its V."""
    return {"zb_v_program": _v_cases(variant, 2, VSplitCase, 12, lambda p: (2 * p - 1, 2 * p + 1))}


@exercise(given_2, zb_v_program=as_program, points=3, partial=True)
def exercise_2(zb_v_program, variant) -> str:
    """Build ZB-V (2p stages on p ranks in a V, each backward split into I and W) as a
    per-rank program; its replayed idle time answers the old question, ZB-V's bubble."""
    from course_utils.checks import zbv_build

    cases = cases_2(variant)["zb_v_program"]
    for (case,), shown, got in checks.each_call(zb_v_program, cases):
        zbv_build.judge(got, shown, case)
    g = given_2(variant)
    ours = zb_v_timeline(cases[0][0])
    idle = max(ours.idle(d) for d in range(g.p))
    return (
        f"Right: on your V of {g.p} ranks and two others the gradients equal one device's, "
        "every W came after its I and left the weights alone in I, and your order replays "
        f"(F = I = W = 1 unit) to a step no longer than ZB-V's, {ours.makespan:g} units. The "
        f"W's fill the gaps: a rank idles {idle:g} units, the lesson's (p-1) I, only the V's "
        "two slanted ends."
    )


# --------------------------------------------------------------------------- 11.3: the program


given_3 = numbers(pick("3", (3, 4), [(2, 4), (2, 5), (3, 3), (4, 3)], "p", "m"))


def cases_3(variant: Variant = DEFAULT) -> dict[str, list[tuple]]:
    """The learner's own V, then two more."""
    return {"v_gpipe_program": _v_cases(variant, 3, VCase, 11, lambda p: (2, 4))}


@exercise(given_3, v_gpipe_program=as_program, points=3, partial=True)
def exercise_3(v_gpipe_program, variant) -> str:
    """Build fill and drain on a V (2p stages on p ranks) as a per-rank program."""
    from course_utils.checks import v_pipeline_build

    cases = cases_3(variant)["v_gpipe_program"]
    for (case,), shown, got in checks.each_call(v_gpipe_program, cases):
        v_pipeline_build.judge(got, shown, case)
    g = given_3(variant)
    want = v_target(cases[0][0])
    return (
        f"Right: on your V of {g.p} ranks and two others the gradients equal one device's, "
        f"the turn stays on rank {g.p - 1}, the order replays to fill and drain's step "
        f"({want.step:.4g} units) and rank 0 held all {want.held[0]} micro-batch chunks at "
        "the turn: what 1F1B's and ZB-V's orders avoid."
    )


given_4 = numbers(p=pick("4p", 4, [3, 5, 6, 8]))


@exercise(
    given_4, plain_1f1b="whole number", looping="whole number", v_shape="whole number", partial=True
)
def exercise_4(g, plain_1f1b, looping, v_shape) -> str:
    """Transfers between devices of one micro-batch (forward and backward) for 3 placements."""
    from course_utils.pipeline.vshape import transfers_per_microbatch

    p = g.p
    want = {
        "plain_1f1b": 2 * (p - 1),
        "looping": transfers_per_microbatch(p, "looping"),
        "v_shape": transfers_per_microbatch(p, "v"),
    }
    got = {"plain_1f1b": plain_1f1b, "looping": looping, "v_shape": v_shape}
    boundaries = {"plain_1f1b": p - 1, "looping": 2 * p - 1, "v_shape": 2 * p - 2}
    fields = checks.Fields()  # every wrong answer named at once
    for name, right in want.items():
        too_many = checks.any_of(right + 2, right + 1)
        hints = {
            f"`{name}` counts the forward only. The backward sends a gradient back over every "
            "boundary the forward crossed.": boundaries[name],
            "`v_shape`: in a V one boundary between neighbouring stages stays inside a device. "
            "Which one?": want["looping"] if name == "v_shape" else None,
            "`looping`: with stage s on device s mod p, do two neighbouring stages ever sit on "
            "the same device?": 2 * (2 * p - 2) if name == "looping" else None,
            f"`{name}` counts one boundary too many: the input arrives and the loss is computed "
            "on a device; only the boundaries between stages cross devices.": too_many,
            f"`{name}` is not right. Count the boundaries between neighbouring stages that lie "
            "between two different devices, then remember the backward.": OTHERWISE,
        }
        fields.judge(got[name], right, name, hints)
    fields.verdict()
    return (
        f"Right: {want['plain_1f1b']}, {want['looping']} and {want['v_shape']}. Two chunks "
        "per device double plain 1F1B's traffic whichever way they are placed; the V saves the "
        "two transfers at its bottom."
    )


def given_5(variant: Variant = DEFAULT) -> dict:
    p = variant.pick("5p", 4, [3, 5])
    m = variant.pick("5m", 8, [2 * p, 2 * p + 2])
    F, I, W = variant.pick("5c", (1.0, 1.0, 1.0), [(1.0, 1.2, 0.8), (0.8, 1.0, 0.7)])  # noqa: N806, E741
    return {"p": p, "m": m, "F": F, "I": I, "W": W}


def _culprit(variant: Variant) -> int:
    p = given_5(variant)["p"]
    return variant.pick("5k", p - 2, range(1, p))


def their_schedule(variant: Variant = DEFAULT):
    """Exercise 11.5's schedule: ZB-V, except that one device runs each W right after its I."""
    from course_utils.actions import Action, Schedule
    from course_utils.pipeline.vshape import zb_v

    g = given_5(variant)
    good, k = zb_v(g["p"], g["m"]), _culprit(variant)
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


def their_timeline(variant: Variant = DEFAULT):
    """Exercise 11.5's schedule simulated with its chunk costs."""
    from course_utils.pipeline import simulate
    from course_utils.pipeline.vshape import chunk_costs

    g = given_5(variant)
    return simulate(their_schedule(variant), chunk_costs(g["F"], g["I"], g["W"]))


@exercise(
    given_5,
    culprit="whole number",
    extra="number",
    fix={
        "a": checks.RIGHT,
        "b": "The extra wait does not shrink with m: it is paid in the cool-down, once per "
        "step, however many micro-batches come before.",
        "c": "Looping placement changes where the stages live, not the order on the device; "
        "it also adds transfers.",
        "d": "A whole B is exactly I followed at once by W: that is what the slow device "
        "already does.",
    },
    partial=True,
)
def exercise_5(g, culprit, extra, fix, variant) -> str:
    """A ZB-V step gone slow: the device whose order is wrong, the time lost, the fix."""
    from course_utils.pipeline import simulate
    from course_utils.pipeline.vshape import chunk_costs, zb_v

    k = _culprit(variant)
    theirs = their_timeline(variant)
    right = simulate(zb_v(g.p, g.m), chunk_costs(g.F, g.I, g.W))
    lost = theirs.makespan - right.makespan
    hints = {
        f"`culprit` is a device number, 0 to {g.p - 1}.": culprit not in range(g.p),
        f"Device {culprit} runs ZB-V's own order. Compare each device's row with the same row "
        "of zb_v(p, m), action by action: one row differs. (A W right after its I proves "
        "nothing by itself: ZB-V's own device 0 runs every W that way.)": OTHERWISE,
    }
    fields = checks.Fields()  # every wrong answer named at once
    with fields.judging():
        judge(culprit, k, "culprit", hints)
    hints = {
        "`extra` is a device's whole idle time. The question asks how much LONGER the step is "
        "than ZB-V's: subtract ZB-V's makespan.": theirs.makespan - theirs.busy_per_device()[0],
        "`extra` is their makespan; subtract the makespan of ZB-V's own order.": theirs.makespan,
        "`extra` is not right: their makespan minus the makespan of zb_v(p, m) with the same "
        "chunk costs (simulate both).": OTHERWISE,
    }
    with fields.judging():
        judge(extra, lost, "extra", hints, unit="units")
    fields.verdict()
    return (
        f"Right: device {k} runs every W straight after its I, so in the cool-down the input "
        f"gradients the devices before it wait for come a W later each time: the step is "
        f"{lost:g} units longer. Postponed W's fill the gaps instead of making them."
    )


# (p, m, F, I, W) with F = I and I/2 <= W <= I: DeepSeek's DualPipeV figure and ZB-V's hold.
SETUPS_6 = [
    (3, 6, 1.0, 1.0, 0.5),
    (5, 10, 1.2, 1.2, 0.9),
    (3, 7, 0.9, 0.9, 0.6),
    (6, 12, 1.0, 1.0, 1.0),
]
given_6 = numbers(pick("6", (4, 8, 1.0, 1.0, 0.6), SETUPS_6, "p", "m", "F", "I", "W"))


@exercise(
    given_6, dualpipe_idle="number", times_zbv="number", dualpipe_peak="whole number", partial=True
)
def exercise_6(g, dualpipe_idle, times_zbv, dualpipe_peak) -> str:
    """DualPipeV against ZB-V: its idle time per device, how many times ZB-V's that is, and
    its peak chunks."""
    from course_utils.pipeline import vshape

    p, m, F, I, W = g.values()  # noqa: N806, E741
    assert vshape.zb_v_formula_holds(p, m, F, I, W)
    assert vshape.dualpipe_v_formula_holds(p, m, F, I, W)
    want, zbv = vshape.dualpipe_v_idle(p, F, I, W), vshape.zb_v_idle(p, F, I, W)
    hints = {
        "`dualpipe_idle` is ZB-V's idle time, (p-1) I. DualPipeV's figure differs.": zbv,
        "`dualpipe_idle` is the course's early-send variant, (p-1)(F+I-W), which sends a slot's "
        "forward output as soon as F ends. DualPipeV sends both results when the whole F&B "
        "slot ends, as DeepSeek's code does.": vshape.dualpipe_v_early_send_idle(p, F, I, W),
        "`dualpipe_idle` is twice DeepSeek's figure: with PP = 2p stages, PP/2 - 1 is p - 1, "
        "not 2p - 1.": 2 * want,
        "`dualpipe_idle` is not right: DeepSeek's figure is (PP/2 - 1)(F&B + B - 3W), with PP = "
        "2p stages, B = I + W and F&B = F + B (nothing computes faster).": OTHERWISE,
    }
    fields = checks.Fields()  # every wrong answer named at once
    fields.judge(dualpipe_idle, want, "dualpipe_idle", hints, unit="units")
    hints = {
        "`times_zbv` is the difference of the two idle times; give their ratio.": want - zbv,
        "`times_zbv` divides your `dualpipe_idle`, which is not right yet: it comes right with "
        "it.": dualpipe_idle / zbv if fields.failures else None,
        f"`times_zbv` is not right: divide DualPipeV's idle time by ZB-V's (p-1) I for these "
        f"costs (F = {F:g}, I = {I:g}, W = {W:g}).": OTHERWISE,
    }
    how = "DualPipeV's idle time over ZB-V's"
    fields.judge(times_zbv, want / zbv, "times_zbv", hints, upside_down=how)
    hints = {
        "2p is ZB-V's peak. In an F&B slot the new forward starts before the old backward frees "
        "its chunk: one more.": 2 * p,
        "`dualpipe_peak` is not right: count the chunks a device holds at the fullest moment of "
        "the steady state, an F&B slot included.": OTHERWISE,
    }
    fields.judge(dualpipe_peak, vshape.dualpipe_v_peak(p), "dualpipe_peak", hints)
    fields.verdict()
    return (
        f"Right: DualPipeV idles (p-1)(F+2I-W) = {want:g} per device, {want / zbv:.3g} times "
        f"ZB-V's (p-1) I = {zbv:g}, and holds 2p+1 = {2 * p + 1} chunks at its peak. Holding a "
        "slot's results until it ends costs (p-1) I here; DualPipeV's gain is on GPUs, where a "
        "slot's communication hides behind the other chunk's compute."
    )
