"""The verdict on ZB-V written as a per-rank program (Exercise 11.2).

ZB-V (Qi et al. 2024, arXiv 2401.10241) places 2p stages in a V (rank d holds stages d and
2p-1-d, as in Exercise 11.3's Build) and splits each backward in two: I, the gradient of the
stage's input, which the rank of the stage before waits for, and W, the gradients of the
stage's weights, which nobody waits for and which fill the gaps a rank would idle in.
Judged from the run's evidence (`programs.evidence`) and the notes of `VSplitCase` (for every
I and W, whether the parameters' gradients changed inside it), in the grader: messages to
the V's neighbours with the turn kept on its rank; no whole backward; every W after its own
I; I's that leave the weights alone; one device's gradients on every rank, each message
sent once; the order the ranks ran replayed by the simulator no slower than the course's
ZB-V (`make_schedule("zb-v", p, m)`) with the lesson's equal chunk costs (F = I = W, the
costs ZB-V's order is built for); and no rank holding more chunks
than ZB-V's. Never on time. Only `checks.l11` imports this module.
"""

from __future__ import annotations

from course_utils.checks import fail, pipeline_hints, v_pipeline_build, zero_bubble_build
from course_utils.checks.pipeline_cases import VSplitCase, zb_v_timeline
from course_utils.checks.programs import evidence, recorded

ADVICE = {
    "deadlock": "Run each rank's actions in ZB-V's order: receive what an action needs just "
    "before it, send what it made (an activation after F, an input gradient after I) just "
    "after it.",
    "tag": "A link delivers in the order sent, and in ZB-V a neighbour's activations and "
    "input gradients take turns on it, not in your order. Your neighbour's order is its row "
    "of zb_v(p, m): receive what it sent before the message you need and keep it until its "
    "action.",
}
SPLIT = (
    "Split each backward in two, each marked: `with ctx.backward_input(mb, chunk):` for I, "
    "the input's gradient the rank before waits for, and `with ctx.backward_weight(mb, "
    "chunk):` for W, the weights' gradients nobody waits for."
)


def _delays(actions: list) -> list[int]:
    """For each W of a rank, how many actions the rank ran between its own I and it."""
    at = {(a.stage, a.microbatch): k for k, a in enumerate(actions) if a.kind == "I"}
    return [
        k - at[a.stage, a.microbatch] - 1
        for k, a in enumerate(actions)
        if a.kind == "W" and (a.stage, a.microbatch) in at
    ]


def _slow_order(shown: str, run: dict, case: VSplitCase) -> None:
    """Fail, naming the pattern, unless the order replays no slower than the course's ZB-V."""
    want, step = zb_v_timeline(case).makespan, zb_v_timeline(case, recorded(run, case)).makespan
    if step <= want * (1 + 1e-9):
        return
    said = (
        f"{shown}: the order your ranks ran replays to a step of {step:.4g} units, ZB-V's to "
        f"{want:.4g}."
    )
    actions = run["actions"]
    if all(max(_delays(acts), default=0) == 0 for acts in actions):
        fail(
            f"{said} Every W ran straight after its I: the input gradients the ranks before "
            "wait for come a W later each time. Put W's off to where a rank would otherwise "
            "wait for a gradient (ZB-V's cool-down runs the I's first)."
        )
    for rank, acts in enumerate(actions):
        last_i = max((k for k, a in enumerate(acts) if a.kind == "I"), default=-1)
        if sum(a.kind == "W" for a in acts) > 1 and all(
            k > last_i for k, a in enumerate(acts) if a.kind == "W"
        ):
            fail(
                f"{said} Rank {rank} left all its W's to the end of the step, after its last "
                "I: they lengthen the step instead of filling the gaps where it waited for a "
                "gradient, and hold every micro-batch's activations until then."
            )
    fail(
        f"{said} A rank waits where its next action's input comes later: follow ZB-V's order "
        "(its warm-up fills the V with forwards, its steady state runs F, I and W of each "
        "chunk, its cool-down runs the I's first and fills the waits with W's)."
    )


def judge(got, shown: str, case: VSplitCase) -> None:
    """Fail with the hint for the program's mistake, unless its run on `case` is ZB-V on a V
    (or an order no slower) with one device's gradients."""
    run = evidence(got, shown, case, per_rank=("split",))
    hint = v_pipeline_build.wrong_neighbour(shown, run, case)
    if hint is None and run["failure"] is not None:
        hint = v_pipeline_build.stopped(shown, run, case)
    if hint:
        fail(hint)
    zero_bubble_build.split_mistakes(
        shown, run, f": its W ran together with its I, so the rank before waited for both. {SPLIT}"
    )
    zero_bubble_build.weights_left_alone(shown, run)
    judged = pipeline_hints.judged_run(got, shown, case, ADVICE)
    judged["split"] = run["split"]
    _slow_order(shown, judged, case)
    most = [int(h) for h in zb_v_timeline(case).peak_activations or ()]
    for rank, held in enumerate(judged["saved_microbatches"]):
        if held > most[rank]:
            fail(
                f"{shown}: rank {rank} held the activations of {held} micro-batch chunks at "
                f"once; under ZB-V it holds at most {most[rank]}. A chunk's activations stay "
                "until its W: a W put off longer than the gaps it fills only holds memory."
            )
